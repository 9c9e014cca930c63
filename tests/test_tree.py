"""DraftTree invariants: prefix-closed tries, depths, ancestor masks, truncation."""

import pytest
import torch

from blockdraft import DraftTree


def test_from_paths_merges_shared_prefixes():
    tree = DraftTree.from_paths(9, [[1, 2, 3], [1, 2, 4], [5]])
    assert tree.tokens.tolist() == [9, 1, 2, 3, 4, 5]
    assert tree.parents.tolist() == [-1, 0, 1, 2, 2, 0]
    assert tree.depth.tolist() == [0, 1, 2, 3, 3, 1]
    assert tree.children[2] == [3, 4]
    assert not tree.is_chain()


def test_from_paths_respects_node_budget():
    tree = DraftTree.from_paths(0, [[1, 2, 3], [4, 5, 6]], max_nodes=5)
    assert len(tree) == 5
    assert tree.tokens.tolist() == [0, 1, 2, 3, 4]


def test_ancestor_mask_is_ancestors_and_self():
    tree = DraftTree.from_paths(9, [[1, 2, 3], [1, 4], [5]])
    anc = tree.ancestor_mask()
    for i in range(len(tree)):
        expected = set(tree.path_to(i))
        assert {j for j in range(len(tree)) if anc[i, j]} == expected


def test_chain_is_chain_and_carries_q():
    q = torch.softmax(torch.randn(3, 7), -1)
    tree = DraftTree.chain(4, [1, 2, 3], q)
    assert tree.is_chain()
    assert torch.isnan(tree.q[0]).all() and torch.equal(tree.q[1:], q)


def test_truncate_keeps_prefix_closed_subtree():
    tree = DraftTree.from_paths(9, [[1, 2, 3], [5, 6], [1, 7]])
    cut = tree.truncate(max_nodes=10, max_depth=1)
    assert cut.tokens.tolist() == [9, 1, 5]
    assert all(cut.parents[i] < i for i in range(1, len(cut)))
    small = tree.truncate(max_nodes=3)
    assert small.tokens.tolist() == [9, 1, 2]


def test_invalid_trees_are_refused():
    with pytest.raises(ValueError):
        DraftTree(torch.tensor([1, 2]), torch.tensor([0, -1]))
    with pytest.raises(ValueError):
        DraftTree(torch.tensor([1, 2, 3]), torch.tensor([-1, 2, 0]))
