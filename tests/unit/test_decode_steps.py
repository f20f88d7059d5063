"""Decode steps: a round without a draft asks the target for several tokens in one call (VerifyRequest.steps).

Pure pieces first (how a verdict's steps become rounds), then the whole Generation against an in-memory
session store and a scripted target that answers each call with as many rounds as it was asked for: the
steps asked per call, the cuts at EOS, max_new_tokens, max_rounds and a stop string inside a call, and the
trace, stats and Redis counters, which count one round per target pass as without steps.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from orchestrator.deps import Deps
from orchestrator.generation import Generation
from orchestrator.prompting import Prompter
from orchestrator.rounds import RoundCost, RoundOutcome, RoundRequest, RoundRunner, step_rounds
from specdec.config import OrchestratorConfig, RetryConfig
from specdec.core.ngram import NgramProposer
from specdec.core.sampling import SamplingConfig
from specdec.params import MODEL, NGRAM
from specdec.v1 import draft_pb2, target_pb2
from specdec.v1 import orchestrator_pb2 as pb
from target_service.servicer import StepStop
from tests.support import smollm2_tokenizer
from tests.unit.test_completion_text import MemoryStore

PROMPT = "Count with me."
COMPLETION = " one two three four five six seven eight nine ten eleven twelve"


def first_round(token: int, target_ms: float, wall_ms: float, context: int) -> RoundOutcome:
    return RoundOutcome(
        k=0,
        draft_ids=[],
        matches=[],
        target_ids=[token],
        num_accepted=0,
        next_token=token,
        next_kind=target_pb2.NEXT_KIND_BONUS,
        emitted=[token],
        context_tokens=context,
        proposer="ngram",
        cost=RoundCost(target_ms=target_ms, wall_ms=wall_ms, target_replica="t0"),
    )


def test_a_verdicts_steps_become_rounds_that_share_the_calls_overhead():
    verdict = target_pb2.VerifyResponse(next_token=5)
    for token, ms in ((6, 9.0), (7, 11.0)):
        step = verdict.steps.add(token=token)
        step.stats.forward_ms, step.stats.computed_tokens, step.stats.batch_size = ms, 1, 1
        step.logprob.token_id, step.logprob.logprob = token, -0.5
    first = first_round(5, target_ms=10.0, wall_ms=36.0, context=40)  # the call: 30 ms of passes, 6 ms beside
    first.cost.target_service_ms = 33.0  # of which 3 ms at the target around its passes
    rounds = [first, *step_rounds(first, verdict)]
    assert [r.cost.target_service_ms - r.cost.target_ms for r in rounds] == pytest.approx([1.0, 1.0, 1.0])
    assert [r.emitted for r in rounds] == [[5], [6], [7]]
    assert [r.context_tokens for r in rounds] == [40, 41, 42]
    assert [r.cost.target_ms for r in rounds] == [10.0, 9.0, 11.0]
    assert [r.cost.overhead_ms for r in rounds] == pytest.approx([2.0, 2.0, 2.0])
    assert sum(r.cost.wall_ms for r in rounds) == pytest.approx(36.0)
    assert all(r.next_kind == target_pb2.NEXT_KIND_TARGET and r.k == 0 for r in rounds[1:])
    assert [r.logprobs[0].token_id for r in rounds[1:]] == [6, 7]
    assert {r.cost.target_replica for r in rounds} == {"t0"} and {r.proposer for r in rounds} == {"ngram"}
    assert step_rounds(first, target_pb2.VerifyResponse(next_token=5)) == []


class SteppingTarget:
    """Each call emits the completion's next token, then up to req.steps - 1 more: as many rounds, as the target's
    decode steps come back. `emit_past_stop`: keep stepping past a stop id (the orchestrator must still cut)."""

    def __init__(
        self, prompt_len: int, completion: list[int], emit_past_stop: bool = False, pass_ms: float = 10.0
    ) -> None:
        self.prompt_len, self.completion, self.emit_past_stop = prompt_len, completion, emit_past_stop
        self.pass_ms = pass_ms  # what each one-token pass reports (ComputeStats.forward_ms)
        self.calls: list[tuple[int, int, tuple[int, ...]]] = []  # (k, steps, stop_ids) per call

    def target_replicas(self) -> int:
        return 1

    def proposer(self, requested: str, context_ids: Any, wire: Any = None) -> str:
        return "ngram"

    async def run(self, req: Any) -> list[RoundOutcome]:
        self.calls.append((req.k, req.steps, tuple(req.stop_ids)))
        done = len(req.context_ids) - self.prompt_len
        tokens = []
        for token in self.completion[done : done + max(1, req.steps)]:
            tokens.append(token)
            if token in req.stop_ids and not self.emit_past_stop:
                break
        first = first_round(tokens[0], self.pass_ms, (self.pass_ms + 2.0) * len(tokens), len(req.context_ids))
        verdict = target_pb2.VerifyResponse(next_token=tokens[0])
        for token in tokens[1:]:
            verdict.steps.add(token=token).stats.forward_ms = self.pass_ms
        return [first, *step_rounds(first, verdict)]


@pytest.fixture(scope="module")
def tok() -> Any:
    return smollm2_tokenizer()


def generate(
    tok: Any, target: SteppingTarget, steps: int, steps_ms: float = 200.0, **fields: Any
) -> tuple[list, Generation, MemoryStore]:
    store = MemoryStore()
    cfg = OrchestratorConfig(decode_steps=steps, decode_steps_ms=steps_ms)
    deps = Deps(cfg, store, target, Prompter(tok), frozenset({tok.eos_token_id}), 8192, "me", "m")
    request = pb.GenerateRequest(prompt=PROMPT, session_id="s", request_id="r", create_session=True, k=0, **fields)
    generation = Generation(deps, request)

    async def run() -> list:
        return [c async for c in generation.chunks()]

    return asyncio.run(run()), generation, store


def prompt_len(tok: Any) -> int:
    return len(Prompter(tok).tokenizer.encode(PROMPT, add_special_tokens=False))


def test_steps_are_asked_after_the_first_token_up_to_the_setting_and_the_tokens_left(tok):
    completion = tok.encode(COMPLETION, add_special_tokens=False)[:10]
    target = SteppingTarget(prompt_len(tok), completion)
    chunks, generation, store = generate(tok, target, steps=4, max_new_tokens=10, trace=True)
    assert [k for k, _, _ in target.calls] == [0, 0, 0, 0]
    assert [s for _, s, _ in target.calls] == [1, 4, 4, 1]  # the first token alone, then 4 + 4 + the last one
    reply = generation.response()
    assert list(reply.token_ids) == completion and reply.finish_reason == pb.FINISH_REASON_LENGTH
    assert store.session.ids[-len(completion) :] == completion
    # one trace row per target pass, numbered in order, each with its own token's text
    assert [r.index for r in reply.trace] == list(range(10))
    assert [r.text for r in reply.trace] == [tok.decode([t]) for t in completion]
    assert all(r.next_kind == target_pb2.NEXT_KIND_TARGET for r in reply.trace)
    assert (reply.stats.rounds, reply.stats.target_passes) == (10, 10)
    assert [len(c.rounds) for c in chunks if c.rounds] == [1, 4, 4, 1]


@pytest.mark.parametrize(
    "pass_ms, steps_ms, calls",
    [
        (10.0, 200.0, [1, 8, 3]),  # 20 passes fit in 200 ms: the setting (8) decides
        (60.0, 200.0, [1, 3, 3, 3, 2]),  # 3 passes fit
        (300.0, 200.0, [1] * 12),  # not even one: a call per token
        (300.0, 0.0, [1, 8, 3]),  # no time cap: the setting alone
    ],
)
def test_a_slow_target_gets_the_steps_that_fit_in_the_time_cap(tok, pass_ms, steps_ms, calls):
    completion = tok.encode(COMPLETION, add_special_tokens=False)[:12]
    target = SteppingTarget(prompt_len(tok), completion, pass_ms=pass_ms)
    _, generation, _ = generate(tok, target, steps=8, steps_ms=steps_ms, max_new_tokens=12)
    assert [s for _, s, _ in target.calls] == calls
    assert list(generation.response().token_ids) == completion


def test_one_step_per_call_when_the_setting_is_one(tok):
    completion = tok.encode(COMPLETION, add_special_tokens=False)[:6]
    target = SteppingTarget(prompt_len(tok), completion)
    _, generation, _ = generate(tok, target, steps=1, max_new_tokens=6)
    assert [s for _, s, _ in target.calls] == [1] * 6 and list(generation.response().token_ids) == completion


def test_eos_inside_a_call_ends_the_generation_there(tok):
    completion = tok.encode(COMPLETION, add_special_tokens=False)[:3] + [tok.eos_token_id]
    completion += tok.encode(" after the end", add_special_tokens=False)
    target = SteppingTarget(prompt_len(tok), completion, emit_past_stop=True)  # a target that ignores stop_ids
    _, generation, store = generate(tok, target, steps=8, max_new_tokens=20, trace=True)
    reply = generation.response()
    assert target.calls[1][2] == (tok.eos_token_id,)  # the call carried the stop id
    assert list(reply.token_ids) == completion[:4] and reply.finish_reason == pb.FINISH_REASON_EOS
    assert len(reply.trace) == reply.stats.rounds == 4  # the passes after EOS are not counted
    assert store.session.ids[-4:] == completion[:4]
    _, ignoring, _ = generate(tok, SteppingTarget(prompt_len(tok), completion), 8, max_new_tokens=5, ignore_eos=True)
    assert list(ignoring.response().token_ids) == completion[:5]  # ignore_eos: no stop ids, the call runs on


def test_max_rounds_caps_the_steps_a_call_asks_for(tok):
    completion = tok.encode(COMPLETION, add_special_tokens=False)
    target = SteppingTarget(prompt_len(tok), completion)
    _, generation, _ = generate(tok, target, steps=4, max_new_tokens=20, max_rounds=3)
    assert [s for _, s, _ in target.calls] == [1, 2]
    assert list(generation.response().token_ids) == completion[:3]
    assert generation.response().finish_reason == pb.FINISH_REASON_LENGTH


def test_a_stop_string_inside_a_call_cuts_its_tokens_and_rounds(tok):
    completion = tok.encode(COMPLETION, add_special_tokens=False)
    target = SteppingTarget(prompt_len(tok), completion)
    _, generation, store = generate(tok, target, steps=8, max_new_tokens=20, stop=["four"], trace=True)
    reply = generation.response()
    assert reply.finish_reason == pb.FINISH_REASON_STOP and reply.text == " one two three "
    kept = list(reply.token_ids)
    assert kept == completion[: len(kept)] and len(kept) < 9  # cut inside the second call (tokens 2..9)
    assert len(reply.trace) == reply.stats.rounds == len(kept)
    assert "".join(r.text for r in reply.trace) == tok.decode(kept)
    assert store.session.ids[-len(kept) :] == kept


def test_stepping_ends_after_a_stop_id_or_where_the_tail_repeats():
    stop = StepStop([2], repeat=0)
    assert not stop.after([5, 6, 7]) and stop.after([5, 6, 2])
    repeat = StepStop([], repeat=2)
    context = [10, 11, 12, 13]
    assert not repeat.after(context)
    context += [10]
    assert not repeat.after(context)  # the tail [13, 10] never occurred before
    context += [11]
    assert repeat.after(context)  # [10, 11] did: a 2-gram lookup proposes 12 here
    assert not StepStop([], repeat=0).after([1, 2, 1, 2])


def test_a_round_asks_for_steps_without_a_draft_and_until_a_lookup_can_propose():
    runner = RoundRunner(None, None, RetryConfig(), local_ngram=NgramProposer(2, 4))
    empty, drafted = draft_pb2.ProposeResponse(), draft_pb2.ProposeResponse(draft_ids=[4, 5])

    def request(k: int, kind: str = NGRAM, steps: int = 4) -> RoundRequest:
        return RoundRequest("s", "r", [1, 2, 3], k, SamplingConfig(), draft_kind=kind, steps=steps)

    assert runner._steps(request(0), empty, None) == (4, 0)  # k = 0: steps, no repeat stop
    assert runner._steps(request(4), empty, None) == (4, 2)  # the lookup found nothing: until it can
    assert runner._steps(request(4), drafted, None) == (1, 0)  # a draft: one verdict
    assert runner._steps(request(4, MODEL), empty, None) == (1, 0)  # a model draft proposed nothing: no steps
    assert runner._steps(request(0, steps=1), empty, None) == (1, 0)  # the first token, or the setting at 1
    remote = RoundRunner(None, None, RetryConfig())  # the draft service does the lookup: it cannot tell
    assert remote._steps(request(4), empty, None) == (1, 0)
