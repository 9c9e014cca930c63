"""Packaging: every third-party module imported in src/ is a declared dependency, and data files ship."""

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "blockdraft"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_top_level_modules() -> dict[str, str]:
    """module -> first file importing it, for absolute imports anywhere in src/ (lazy ones included)."""
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return found


def test_every_third_party_import_is_a_declared_dependency():
    declared = {_norm(re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0])
                for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    dists = packages_distributions()
    third_party = {m: f for m, f in imported_top_level_modules().items()
                   if m not in sys.stdlib_module_names and m not in ("blockdraft", "__future__")}
    assert {"torch", "transformers", "matplotlib"} <= set(third_party), "the scan found no imports: it is broken"
    missing = []
    for module, first_file in sorted(third_party.items()):
        providers = {_norm(d) for d in dists.get(module, [])}
        if not providers & declared:
            missing.append(f"{module} (imported in {first_file}; installed from {sorted(providers) or 'nowhere'})")
    assert not missing, "imported but not in pyproject's [project] dependencies: " + "; ".join(missing)


def test_spec_bench_questions_ship_as_package_data():
    from blockdraft.bench.questions import SPEC_BENCH

    assert SPEC_BENCH.is_relative_to(SRC) and SPEC_BENCH.is_file()
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["blockdraft"]
    assert any(SPEC_BENCH.relative_to(SRC).match(g) for g in globs), "question.jsonl is not in package-data"
    assert (SPEC_BENCH.parent / "NOTICE.md").is_file()


def test_shipped_checkpoints_fit_the_package_budget_and_name_their_target():
    """All shipped checkpoints together stay under 100 MB, at most 40 MB for a target other than the default, and each
    folder's config records the target it is under (CHECKPOINTS/<target>/<method>), so a drafter copied under the
    wrong target fails here, not at a user's load."""
    import json

    from blockdraft.methods import CHECKPOINTS
    from blockdraft.model.loading import DEFAULT_TARGET

    configs = sorted(CHECKPOINTS.glob("*/*/config.json"))
    assert len(configs) >= 6, "the scan found too few checkpoints: it is broken"
    total = sum(f.stat().st_size for f in CHECKPOINTS.rglob("*") if f.is_file())
    assert total < 100_000_000, f"shipped checkpoints take {total / 1e6:.1f} MB, over the 100 MB budget"
    for target in CHECKPOINTS.iterdir():
        size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
        if target.name != DEFAULT_TARGET:
            assert size <= 40_000_000, f"{target.name}'s checkpoints take {size / 1e6:.1f} MB, over its 40 MB"
    for config in configs:
        recorded = json.loads(config.read_text()).get("target", {})
        assert recorded.get("name") == config.parent.parent.name, f"{config}: trained for {recorded.get('name')}"
