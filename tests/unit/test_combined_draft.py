"""CombinedDraft (specdec/engine/draft.py): prompt lookup on a hit, the model draft otherwise."""

from __future__ import annotations

from specdec.core.ngram import NgramProposer
from specdec.core.sampling import SamplingConfig
from specdec.engine.draft import MODEL, NGRAM, CombinedDraft, NgramDraft
from specdec.engine.types import ProposeInput, ProposeOutput


class CountingModel:
    """Stands in for ModelDraft: proposes 7s and counts its calls."""

    kind = MODEL

    def __init__(self) -> None:
        self.calls = 0

    def propose(self, inp: ProposeInput) -> ProposeOutput:
        self.calls += 1
        return ProposeOutput([7] * inp.k, [], MODEL)


def _inp(context: list[int], k: int = 3) -> ProposeInput:
    return ProposeInput("s", context, k, SamplingConfig())


def test_lookup_hit_proposes_without_the_model():
    model = CountingModel()
    combined = CombinedDraft(NgramDraft(2, 4), model)
    out = combined.propose(_inp([1, 2, 3, 4, 5, 1, 2]))  # the tail "1 2" occurred before, followed by 3 4 5
    assert out.draft_ids == [3, 4, 5] and out.draft_kind == NGRAM and model.calls == 0


def test_no_match_falls_back_to_the_model():
    model = CountingModel()
    combined = CombinedDraft(NgramDraft(2, 4), model)
    out = combined.propose(_inp([1, 2, 3, 4, 5, 6]))
    assert out.draft_ids == [7, 7, 7] and out.draft_kind == MODEL and model.calls == 1


def test_request_ngram_sizes_apply_to_the_lookup_part():
    model = CountingModel()
    combined = CombinedDraft(NgramDraft(2, 4), model)
    inp = _inp([1, 2, 3, 4, 5, 1, 2])
    inp.ngram_min_n = inp.ngram_max_n = 3  # "5 1 2" never occurred before: no hit
    assert combined.propose(inp).draft_kind == MODEL


def test_the_orchestrator_knows_before_a_round_which_draft_will_propose():
    """RoundRunner.proposer: adaptive k keeps acceptance and costs per proposer, so it must know it up front."""
    from orchestrator.rounds import RoundRunner
    from specdec.config import RetryConfig

    hit, miss = [1, 2, 3, 4, 5, 1, 2], [1, 2, 3, 4, 5, 6]
    local = RoundRunner(None, None, RetryConfig(), local_ngram=NgramProposer(2, 4))
    assert local.proposer("combined", hit) == NGRAM and local.proposer("combined", miss) == MODEL
    assert local.proposer("ngram", miss) == NGRAM and local.proposer("model", hit) == MODEL
    assert NgramProposer(2, 4).has_match(hit) and not NgramProposer(2, 4).has_match(miss)
    remote = RoundRunner(None, None, RetryConfig())  # the draft service does the lookup: cannot tell
    assert remote.proposer("combined", hit) == "combined"


def test_the_proposer_through_the_generations_index_agrees_with_the_full_lookup():
    """With the generation's ContextWire, RoundRunner.proposer looks up through its incremental index (O(new
    tokens) a round, not O(context)); over a growing context, and one rewritten, it must answer as has_match."""
    import random

    from orchestrator.delta import ContextWire
    from orchestrator.rounds import RoundRunner
    from specdec.config import RetryConfig

    lookup = NgramProposer(2, 4)
    runner = RoundRunner(None, None, RetryConfig(), local_ngram=lookup)
    rng = random.Random(7)
    wire, context = ContextWire(), [rng.randrange(6) for _ in range(5)]
    answers = set()
    for step in range(300):
        if step == 150:
            context = context[:40]  # a rewritten context (shorter): indexed afresh
        context.append(rng.randrange(6))
        expected = NGRAM if lookup.has_match(context) else MODEL
        assert runner.proposer("combined", context, wire) == expected, step
        answers.add(expected)
    assert answers == {NGRAM, MODEL}


def test_a_combined_round_resolved_to_the_model_is_not_looked_up_twice():
    """RoundRunner.proposer looked the tail up before the round; _propose does not repeat a lookup that missed."""
    import asyncio

    from orchestrator.rounds import RoundRequest, RoundRunner
    from specdec.config import RetryConfig

    class CountingLookup(NgramProposer):
        calls = 0

        def propose(
            self, context_ids: list[int], k: int, min_n: int | None = None, max_n: int | None = None
        ) -> list[int]:
            CountingLookup.calls += 1
            return super().propose(context_ids, k, min_n, max_n)

    runner = RoundRunner(None, None, RetryConfig(), local_ngram=CountingLookup(2, 4))  # no draft pool
    hit, miss = [1, 2, 3, 4, 5, 1, 2], [1, 2, 3, 4, 5, 6]

    def propose(context: list[int], proposer: str):
        req = RoundRequest("s", "r", context, 3, SamplingConfig(), "combined", proposer=proposer)
        return asyncio.run(runner._propose(req, None))

    response, out = propose(miss, runner.proposer("combined", miss))
    assert CountingLookup.calls == 0 and out.degraded and not response.draft_ids  # straight to the (absent) pool
    response, out = propose(hit, runner.proposer("combined", hit))
    assert CountingLookup.calls == 1 and list(response.draft_ids) == [3, 4, 5] and out.draft_kind == NGRAM
    propose(miss, "")  # unresolved (no proposer given): looks up itself
    assert CountingLookup.calls == 2
