"""Prompt lookup drafter: finds the most recent earlier n-gram, never matches itself, builds tries."""

from blockdraft import DraftContext, DraftTree, PromptLookupDrafter


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


def test_min_gain_stops_drafting_matches_that_keep_failing_and_retries_later():
    drafter = PromptLookupDrafter(max_ngram=2, min_ngram=2, num_tokens=3, min_gain=0.4)
    drafter.reset([])
    tokens = [1, 2, 3, 4, 1, 2]
    drafted = 0
    for step in range(12):
        tree = drafter.propose(ctx(tokens))
        drafted += len(tree) > 1
        tokens = tokens + [9 + step, 1, 2]  # the target never takes the draft (3 ...), then "1 2" recurs
    assert drafter.gain[2] < 0.4
    assert 3 <= drafted < 12  # drafts until its estimate falls, then only occasional retries
    # an accepted draft raises the estimate again
    before = drafter.gain[2]
    drafter._last = (DraftTree.chain(2, [3, 4, 1]), 3, 2)
    drafter._learn([1, 2, 2, 3, 4, 1, 7])
    assert drafter.gain[2] > before + 0.5

