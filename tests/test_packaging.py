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
