"""Target: tree verification matches sequential decoding; commit keeps exactly the accepted path."""

import torch

from blockdraft import DraftTree, Target

from conftest import tiny_llama


def _sequential_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1].float()


def test_tree_logits_match_sequential(tiny_target):
    prompt = [5, 7, 9, 11, 13]
    tree = DraftTree.from_paths(prompt[-1], [[3, 4, 6], [3, 8], [10, 12, 14, 16]])
    tiny_target.prefill(prompt[:-1])
    out = tiny_target.verify(tree)
    for node in range(len(tree)):
        path_tokens = tree.tokens[tree.path_to(node)].tolist()
        ref = _sequential_logits(tiny_target.model, prompt[:-1] + path_tokens)
        torch.testing.assert_close(out.logits[node], ref, atol=1e-4, rtol=1e-4)


def test_commit_non_contiguous_path_then_continue(tiny_target):
    prompt = [5, 7, 9, 11]
    tree = DraftTree.from_paths(prompt[-1], [[3, 4], [10, 12, 14]])  # nodes: 0 root, 1:3, 2:4, 3:10, 4:12, 5:14
    tiny_target.prefill(prompt[:-1])
    tiny_target.verify(tree)
    tiny_target.commit([0, 3, 4])  # accept 10, 12 from the second branch
    assert tiny_target.length == len(prompt) - 1 + 3
    nxt = DraftTree.chain(20, [21, 22])
    out = tiny_target.verify(nxt)
    ref_ids = prompt + [10, 12, 20]
    torch.testing.assert_close(out.logits[0], _sequential_logits(tiny_target.model, ref_ids), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(
        out.logits[2], _sequential_logits(tiny_target.model, ref_ids + [21, 22]), atol=1e-4, rtol=1e-4
    )


def test_features_are_the_chosen_layers_hidden_states():
    model = tiny_llama()
    target = Target(model, feature_layers=(1, 2))
    prompt = [4, 5, 6]
    target.prefill(prompt[:-1])
    out = target.verify(DraftTree.chain(prompt[-1], [7]))
    assert out.features.shape == (2, 2 * model.config.hidden_size)
    with torch.no_grad():
        hs = model(torch.tensor([prompt + [7]]), output_hidden_states=True).hidden_states
    ref = torch.cat([hs[1][0, -2:], hs[2][0, -2:]], -1)
    torch.testing.assert_close(out.features, ref, atol=1e-4, rtol=1e-4)
