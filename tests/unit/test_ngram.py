"""Unit tests of the model-free n-gram (prompt-lookup) draft proposer."""

from __future__ import annotations

import pytest
import torch

from specdec.core.ngram import propose_ngram

K = 3
LONG_CONTEXT = 8192
LONG_VOCAB = 50


def test_no_match_returns_empty():
    assert propose_ngram([1, 2, 3, 4], K) == []
    assert propose_ngram([], K) == []
    assert propose_ngram([7], K) == []


def test_single_match_proposes_continuation():
    assert propose_ngram([5, 6, 7, 8, 9, 5], K) == [6, 7, 8]


def test_longest_ngram_wins_over_shorter_one():
    # suffix [1, 2]: the bigram occurs at 0 (-> 10, 11); the unigram 2 occurs later too (-> 20)
    context = [1, 2, 10, 11, 2, 20, 1, 2]
    assert propose_ngram(context, K) == [10, 11, 2]
    assert propose_ngram(context, K, prefer="recent") == [10, 11, 2]
    assert propose_ngram(context, K, max_n=1, prefer="recent") == [20, 1, 2]


def test_earliest_occurrence_wins_by_default_most_recent_on_request():
    context = [4, 1, 4, 2, 4, 3, 9, 4]
    assert propose_ngram(context, K, max_n=1) == [1, 4, 2]
    assert propose_ngram(context, K, max_n=1, prefer="recent") == [3, 9, 4]
    with pytest.raises(ValueError, match="prefer"):
        propose_ngram(context, K, prefer="random")


def test_k_truncates_the_proposal():
    assert propose_ngram([5, 6, 7, 8, 9, 5], 2) == [6, 7]
    assert propose_ngram([5, 6, 7, 8, 9, 5], 0) == []


def test_match_running_into_end_of_context_is_shorter():
    assert propose_ngram([3, 4, 3], K) == [4, 3]
    assert propose_ngram([5, 5, 5, 5], K, prefer="recent") == [5]  # overlapping, most recent earlier match
    assert propose_ngram([5, 5, 5, 5], K) == [5]  # the earliest one: as far as the context goes


def test_min_n_excludes_short_matches():
    assert propose_ngram([2, 9, 1, 2], K, min_n=2) == []
    assert propose_ngram([2, 9, 1, 2], K, min_n=1) == [9, 1, 2]


def test_argument_validation():
    with pytest.raises(ValueError, match="k must be"):
        propose_ngram([1, 1], -1)
    with pytest.raises(ValueError, match="min_n"):
        propose_ngram([1, 1], K, min_n=3, max_n=2)


def test_accepts_tensors_and_long_contexts():
    context = torch.randint(LONG_VOCAB, (LONG_CONTEXT,), generator=torch.Generator().manual_seed(0))
    proposal = propose_ngram(context, K)
    assert len(proposal) <= K and all(isinstance(t, int) for t in proposal)


def test_the_draft_refuses_an_unknown_preference_when_it_is_built():
    from specdec.engine.draft import NgramDraft

    with pytest.raises(ValueError, match="SPECDEC_NGRAM_PREFER"):
        NgramDraft(1, 4, prefer="newest")
    assert NgramDraft(1, 4, prefer="recent").lookup.prefer == "recent"


def test_the_core_proposer_applies_its_settings_and_per_call_sizes():
    """NgramProposer (what the orchestrator runs in-process): configured sizes, a per-call override."""
    from specdec.core.ngram import NgramProposer

    context = [1, 2, 3, 9, 1, 2, 3, 7, 5, 3]  # tail "3" occurred at 2 (then 9) and at 6 (then 7)
    assert NgramProposer(1, 4).propose(context, 2) == [9, 1]
    assert NgramProposer(1, 4, prefer="recent").propose(context, 2) == [7, 5]
    assert NgramProposer(2, 4).propose(context, 2) == [] and not NgramProposer(2, 4).has_match(context)
    assert NgramProposer(2, 4).propose(context, 2, min_n=1) == [9, 1] and NgramProposer(1, 4).has_match(context)
    with pytest.raises(ValueError, match="SPECDEC_NGRAM_PREFER"):
        NgramProposer(1, 4, prefer="newest")
    with pytest.raises(ValueError, match="min_n"):
        NgramProposer(3, 2)


@pytest.mark.parametrize("prefer", ["earliest", "recent"])
@pytest.mark.parametrize("sizes", [(1, 4), (2, 3), (3, 3)])
def test_the_incremental_index_answers_as_the_whole_context_lookup(prefer, sizes):
    """NgramIndex grows with the context a few tokens a call and always proposes what propose_ngram
    proposes from the whole context; a rewritten context is indexed afresh."""
    import random

    from specdec.core.ngram import NgramIndex

    rng = random.Random(7)
    min_n, max_n = sizes
    for vocab in (3, 8, 50):
        index, context = NgramIndex(min_n, max_n, prefer), []
        for step in range(120):
            context += [rng.randrange(vocab) for _ in range(rng.randrange(1, 5))]
            if step == 60:  # rewritten: a shorter context, other tokens
                context = context[:20] + [vocab + 1]
            k = rng.randrange(0, 6)
            assert index.propose(context, k) == propose_ngram(context, k, min_n, max_n, prefer), (vocab, step)


def test_the_incremental_index_does_not_pass_over_the_context_again():
    """A call indexes only the windows the context gained (counted: dict entries grow by the new tokens)."""
    from specdec.core.ngram import NgramIndex

    index = NgramIndex(2, 4)
    context = list(range(5000))
    index.propose(context, 4)
    seen = sum(len(starts) for starts in index._starts.values())
    context += [1, 2, 3]
    assert index.propose(context, 4) == [4, 5, 6, 7]
    assert sum(len(starts) for starts in index._starts.values()) - seen <= 3 * 3
