"""Chunked prefill in the model draft: a long new context is prefilled `budget` tokens a call (each its own model
call in the draft service, other sessions' proposals in between), and the proposal after the chunks equals one
over the whole context; the combined draft prefills only for a round its model will draft."""

from __future__ import annotations

import random

import pytest

from specdec.core.sampling import SamplingConfig
from specdec.engine.draft import CombinedDraft, ModelDraft, NgramDraft
from specdec.engine.types import ProposeInput
from tests.support import tiny_llama
from tests.unit.test_prefix_sharing import runner_for

K = 3
BUDGET = 16
GREEDY = SamplingConfig(temperature=0.0)


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


def context(n: int, seed: int = 1) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(4, 64) for _ in range(n)]


def prefill_in_chunks(draft, inp: ProposeInput) -> list[int]:
    """What the draft service does before proposing: chunks while more than BUDGET tokens are left."""
    left = [draft.work_tokens(inp)]
    while left[-1] - inp.k > BUDGET:
        left.append(draft.prefill_chunk(inp, BUDGET))
    return left[1:]


def test_a_proposal_after_chunks_equals_one_over_the_whole_context_and_counts_all_the_work(model):
    ids = context(60)
    whole = ModelDraft(runner_for(model, share_min_tokens=0), max_context=512, eos_ids=[])
    chunked = ModelDraft(runner_for(model, share_min_tokens=0), max_context=512, eos_ids=[])
    want = whole.propose(ProposeInput("s", ids, K, GREEDY))
    inp = ProposeInput("s", ids, K, GREEDY)
    left = prefill_in_chunks(chunked, inp)
    got = chunked.propose(inp)
    assert left == [44 + K, 28 + K, 12 + K]  # 60 -> 44 -> 28 -> 12 context tokens uncached
    assert got.draft_ids == want.draft_ids
    assert got.stats.computed_tokens == want.stats.computed_tokens == 60 + K - 1
    assert got.stats.cached_tokens == 0  # what the session held before the call, not the chunks
    assert chunked.runner.pool.counters.computed_tokens == 60 + K - 1


def test_a_short_context_is_never_chunked(model):
    draft = ModelDraft(runner_for(model, share_min_tokens=0), max_context=512, eos_ids=[])
    inp = ProposeInput("s", context(BUDGET), K, GREEDY)
    assert prefill_in_chunks(draft, inp) == [] and inp.prefilled is None
    assert draft.prefill_chunk(inp, BUDGET) == BUDGET + K and draft.runner.pool.counters.computed_tokens == 0


def test_the_combined_draft_prefills_only_for_a_round_its_model_drafts(model):
    runner = runner_for(model, share_min_tokens=0)
    combined = CombinedDraft(NgramDraft(2, 3), ModelDraft(runner, max_context=512, eos_ids=[]))
    looked_up = context(40) + [5, 6, 7, 8] + context(20, seed=2) + [5, 6, 7]  # "5 6 7" recurs: a lookup match
    assert combined.prefill_chunk(ProposeInput("a", looked_up, K, GREEDY), BUDGET) == 0
    assert runner.pool.counters.computed_tokens == 0  # the model's cache lags, as in a lookup round
    fresh = context(40, seed=3)
    assert combined.prefill_chunk(ProposeInput("b", fresh, K, GREEDY), BUDGET) == 24 + K
    assert runner.pool.counters.computed_tokens == BUDGET
