"""Prompt lookup drafter: finds the most recent earlier n-gram, never matches itself, builds tries."""

from blockdraft import DraftContext, PromptLookupDrafter


def ctx(tokens, max_depth=20):
    return DraftContext(list(tokens), None, max_depth)


def test_drafts_continuation_of_most_recent_match():
    tokens = [1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 9, 1, 2]
    tree = PromptLookupDrafter(max_ngram=2, min_ngram=2, num_tokens=3).propose(ctx(tokens))
    # "1 2" occurs at 0, 6 and at the end; the most recent earlier one (6) continues 3 7 8
    assert tree.tokens.tolist() == [2, 3, 7, 8] and tree.is_chain()


def test_longest_ngram_wins_and_no_self_match():
    tokens = [5, 6, 7, 1, 2, 6, 7, 3, 4, 5, 6, 7]
    tree = PromptLookupDrafter(max_ngram=3, min_ngram=1, num_tokens=2).propose(ctx(tokens))
    assert tree.tokens.tolist() == [7, 1, 2]  # the 3-gram 5 6 7 matched at 0, not the 2-gram 6 7 at 5
    assert len(PromptLookupDrafter(min_ngram=2).propose(ctx([1, 2, 3, 4]))) == 1  # nothing to copy


def test_branches_merge_into_a_trie_and_respect_depth():
    tokens = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2]
    tree = PromptLookupDrafter(max_ngram=2, min_ngram=2, num_tokens=3, max_branches=2).propose(ctx(tokens))
    assert tree.tokens.tolist() == [2, 3, 5, 1, 4, 1]  # shared "3", then branches 5 1 and 4 1
    assert tree.parents.tolist() == [-1, 0, 1, 2, 1, 4]
    short = PromptLookupDrafter(max_ngram=2, min_ngram=2, num_tokens=3).propose(ctx(tokens, max_depth=1))
    assert short.tokens.tolist() == [2, 3]
