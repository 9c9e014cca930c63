"""The method registry: adding a drafter is one class plus one registry entry; everything reads the registry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from blockdraft import METHODS, SpeculativeDecoder, make_drafter
from blockdraft.bench.runners import check_methods
from blockdraft.cli import main
from blockdraft.drafters import Drafter
from blockdraft.errors import BlockdraftError
from blockdraft.methods import Method, check_method, register, unregister, with_budget
from blockdraft.trees import DraftTree


class EchoDrafter(Drafter):
    """A toy drafter: proposes what followed the last token where it last occurred (prompt lookup with 1-grams)."""

    name = "echo"

    def __init__(self, depth: int = 4):
        self.depth = depth

    def propose(self, ctx):
        tokens, root = ctx.tokens, ctx.tokens[-1]
        for i in range(len(tokens) - 2, -1, -1):
            if tokens[i] == root:
                return DraftTree.chain(root, tokens[i + 1 : i + 1 + min(self.depth, ctx.max_depth)])
        return DraftTree.root_only(root)


def test_a_drafter_is_one_class_plus_one_registry_entry(tiny_target, capsys):
    register(Method("echo", "toy: what followed the last token where it last occurred",
                    lambda target, depth=4: EchoDrafter(depth), options="depth="))  # the one entry
    try:
        drafter = make_drafter("echo:depth=3", tiny_target)
        assert isinstance(drafter, EchoDrafter) and drafter.depth == 3 and drafter.name == "echo:depth=3"
        prompt = tiny_target.encode("abc abc abc", chat_template=False)  # float32: greedy output is exact
        ar = SpeculativeDecoder(tiny_target, make_drafter("ar", tiny_target)).generate(prompt, 48)
        echo = SpeculativeDecoder(tiny_target, make_drafter("echo", tiny_target)).generate(prompt, 48)
        assert echo.tokens == ar.tokens
        assert echo.stats.tau > 1 and echo.stats.target_calls < ar.stats.target_calls  # drafts were accepted
        for command in ("generate", "bench"):
            assert main([command, "--help"]) == 0
            assert re.search(r"^  echo +toy: what followed the last token", capsys.readouterr().out, re.M)
        check_methods(["ar", "echo", "echo:depth=2"])  # bench's validation, before it loads anything
        assert with_budget("echo", 8) == "echo"  # not a tree method: the run-wide --budget leaves it alone
        with pytest.raises(BlockdraftError, match="already registered"):
            register(Method("echo", "again", EchoDrafter))
    finally:
        unregister("echo")
    assert "echo" not in METHODS
    with pytest.raises(BlockdraftError, match="unknown method 'echo'"):
        check_methods(["ar", "echo"])
    with pytest.raises(BlockdraftError, match="unknown method 'echo'"):
        make_drafter("echo", tiny_target)


def test_what_reads_the_registry():
    from blockdraft.export import FORMATS
    from blockdraft.train.run import train_kinds, trainer_of

    assert with_budget("treeflash", 8) == "treeflash:budget=8"
    assert with_budget("treeflash:budget=4", 8) == "treeflash:budget=4"  # the spec's own budget wins
    assert {m.name for m in METHODS.values() if m.tree} == {"medusa", "bpd-tree", "ddtree", "treeflash", "hydra"}
    assert sorted(train_kinds()) == ["bpd", "datastore", "dflash", "neural", "ngram", "treeflash"]
    for kind in train_kinds():  # each trainer lives in train/KIND.py
        config, train = trainer_of(kind)
        assert callable(train) and "__dataclass_fields__" in vars(config)
    assert {m.name: m.exporter for m in METHODS.values() if m.exporter} == {"bpd": "medusa", "dflash": "dflash"}
    assert all(m.exporter in FORMATS for m in METHODS.values() if m.exporter)
    assert check_method("lookup:num_tokens=4") == "lookup"
    with pytest.raises(BlockdraftError, match="unknown method 'nope'"):
        check_method("nope")


def test_the_readme_methods_table_lists_exactly_the_registered_methods():
    """The README's table of methods (rows `| \\`name\\` | summary |`) is the registry, neither more nor less."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    tables, rows = [], []
    for line in [*readme.splitlines(), ""]:
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            tables.append(rows)
            rows = []

    def names(table):
        return [m.group(1) for row in table if (m := re.match(r"\| `([^`]+)` \|", row))]

    with_methods = [t for t in tables if set(names(t)) & set(METHODS)]
    assert len(with_methods) == 1, "the README should have one methods table, rows `| `name` | summary |`"
    assert sorted(names(with_methods[0])) == sorted(METHODS)
