"""Overlapped rounds: the draft drafts round r+1's block while the target verifies round r.

The rounds stay the sequential ones (each: k draft tokens from the accepted context, one verify);
what changes is WHEN the draft works. While round r's Verify of d1..dk (context C) is in flight, the
orchestrator asks the draft (a second Propose to the session's draft replica, which reuses its KV
cache for C + d1..dk) for k_ahead + 1 tokens from C + d1..dk: e1 is the draft's guess of the target's
bonus, e2..e(k_ahead+1) the block round r+1 would draft if the verify accepted all of d1..dk and its
bonus were e1 (PEARL's post-verify, docs/overlap.md). When the verify returns:

  * the accepted context is C + d1..dk + e1 -> round r+1 uses e2.. as its block and goes straight
    to its Verify (the draft's time and hop were hidden behind round r's verify);
  * anything else -> the pre-draft is discarded and round r+1 drafts as usual.

Branches (docs/overlap.md, "Branches"): at low acceptance the likeliest outcome of a round is a rejection
at position 1, where the target recovers with a token the post-verify block cannot guess. A round that
knows the draft's runner-up per position (ProposeResponse.runner_up_ids) may also draft ahead behind it:
the block from C + d1..d(i-1) + r_i, used when the target rejects d_i and recovers with r_i. One
pre-draft runs its branches one after another on the session's draft replica, likeliest first
(`plan_ahead` chooses them), and a round takes the one whose context is the accepted one.

Why the output cannot change: every random draw is keyed by (seed, absolute position, purpose)
(specdec/core/sampling.py), so a block drafted from context X is the block a sequential round drafts
from X, and the verify of the same block at the same position decides the same tokens. A pre-draft is
used only when its context IS the accepted one (`usable_block`), and a lost or failed pre-draft
costs time, never a token. The orchestrator stays the only owner of accepted tokens.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.adaptive import DECAY, NO_DRAFT, CostModel, k_for_free_block
from specdec.config import OverlapConfig
from specdec.errors import SpecDecError
from specdec.params import MODEL
from specdec.v1 import draft_pb2

log = logging.getLogger("specdec.orchestrator")
MS_PER_S = 1000.0
PREFIX_CHECK_TOKENS = 8  # round r's last context tokens a BlockBase re-checks (a guard, not the proof)
# RunnerUpTracker's prior: the shipped draft's runner-up is the target's token about one time in five when
# its top token is not (held-out, teacher-forced; docs/overlap.md, "Branches"), worth this many rounds.
RUNNER_UP_PRIOR = 0.2
RUNNER_UP_PRIOR_TRIES = 4.0


def usable_block(
    base: BlockBase, drafted: Sequence[int], context: Sequence[int], k: int, guess: int | None = None
) -> int:
    """How many tokens of a pre-drafted block a round from `context` asking for k draft tokens can use.

    Post-verify (`guess` None): the pre-draft continued `base` (round r's context + its draft block) with
    `drafted` = e1..en: e1 is the draft's guess of the target's bonus, e2..en the next block. It is usable
    only when the accepted context is exactly base + [e1]; then the round takes e2..e(1 + min(k, n - 1))
    (draws are keyed by position, so the first j tokens of a longer block are the block a j-token round
    drafts). A branch (`guess` = the runner-up it was drafted behind): `drafted` is the block from
    base + [guess], usable when the accepted context is exactly that; the round takes its first min(k, n).
    0 = none.
    """
    skip = 1 if guess is None else 0
    if k <= 0 or len(drafted) <= skip or not base.continued_by_one(context):
        return 0
    if context[-1] != (drafted[0] if guess is None else guess):
        return 0
    return min(k, len(drafted) - skip)


def hit_probability(rates: Sequence[float], k: int) -> float:
    """Chance that a pre-draft behind a k-token round is used: all k drafts accepted (rates[j] is the
    acceptance at position j+1 given the positions before it were accepted) and the draft's guess of
    the bonus right (taken as the acceptance at position k+1, the deepest known rate past the end)."""
    if not rates:
        return 0.0
    chance = 1.0
    for j in range(k + 1):
        chance *= rates[min(j, len(rates) - 1)]
    return chance


@dataclass(frozen=True)
class AheadCosts:
    """What adaptive k weighs before overlapping a round (milliseconds; see OverlapConfig)."""

    draft_step_ms: float  # one draft token
    draft_hop_ms: float  # the draft call's overhead (hop, serialisation)
    verify_ms: float  # the round's own verify, which the pre-draft hides behind
    miss_cost_ms: float  # what a pre-draft costs the verify beside it (used or not): shared cores


def worth_overlapping(hit: float, k_ahead: int, costs: AheadCosts) -> bool:
    """The per-round decision: expected saving P(hit) x (draft time + hop of the next block) against
    what the pre-draft costs the verify beside it plus the wait when it outlasts the verify."""
    if k_ahead <= 0:
        return False
    ahead_ms = (k_ahead + 1) * costs.draft_step_ms + costs.draft_hop_ms
    wait_ms = max(0.0, ahead_ms - costs.verify_ms)
    saved_ms = k_ahead * costs.draft_step_ms + costs.draft_hop_ms
    return hit * saved_ms > costs.miss_cost_ms + wait_ms


def branch_chances(rates: Sequence[float], k: int, runner_up_rate: float) -> list[tuple[int, float]]:
    """(i, the chance that a block drafted ahead behind position i of a k-token round is used), likeliest
    first. i <= k: the drafts before i accepted, d_i rejected, and the target recovered with the draft's
    runner-up there (`runner_up_rate`: how often it does, RunnerUpTracker); i = k + 1: all k accepted and the
    draft's guess of the bonus right (hit_probability: PEARL's post-verify)."""
    if not rates:
        return []
    chances, survive = [], 1.0
    for i in range(1, k + 1):
        rate = rates[min(i - 1, len(rates) - 1)]
        chances.append((i, survive * (1.0 - rate) * runner_up_rate))
        survive *= rate
    chances.append((k + 1, hit_probability(rates, k)))
    return sorted(chances, key=lambda chance: -chance[1])


@dataclass(frozen=True)
class AheadPlan:
    """What a round drafts ahead while it verifies: blocks of `k` tokens behind the positions `at`, in that
    order (i <= the round's k: behind the runner-up at position i; the round's k + 1: behind all its drafts)."""

    k: int = 0
    at: tuple[int, ...] = ()

    def wants_runner_up(self, round_k: int) -> bool:
        """Whether a branch needs the round's runner-up tokens (ProposeRequest.runner_up)."""
        return self.k > 0 and any(i <= round_k for i in self.at)


NO_AHEAD = AheadPlan()


def plan_ahead(
    cap: int,
    k: int,
    costs: CostModel,
    cfg: OverlapConfig,
    rates: Sequence[float],
    adaptive: bool = False,
    running: float = 1.0,
    runner_up_rate: float = 0.0,
    branches: int | None = None,
) -> AheadPlan:
    """What to draft ahead behind a k-token round. Blocks of `cap` tokens (the next round's k cap; with
    adaptive k, only as many as a round would verify from a free block, adaptive.k_for_free_block: the rest
    would never be used); branches likeliest first (branch_chances), at most `branches` (None:
    OverlapConfig.branches) behind a runner-up, each only while worth it with the branches before it ahead in
    the queue (worth_overlapping against the verify time they leave). Nothing under load (the target's passes
    carry other sessions on average, or more than OverlapConfig.max_running generations per target replica run
    in this orchestrator now: `running`). A pre-draft's cost to the verify beside it is measured (CostModel.overlap_extra_ms) with
    OverlapConfig.miss_cost_ms as its floor."""
    if running > cfg.max_running or costs.batch > cfg.max_target_batch:
        return NO_AHEAD
    if adaptive:
        cap = k_for_free_block(costs, list(rates), cap, MODEL)
    if cap <= 0:
        return NO_AHEAD
    hop = max(0.0, costs.overhead_ms.get(MODEL, 0.0) - costs.overhead_ms.get(NO_DRAFT, 0.0))
    contention = max(cfg.miss_cost_ms, costs.overlap_extra_ms or 0.0)
    step, verify = costs.draft_step_ms.get(MODEL, 0.0), costs.pass_ms(k + 1)
    at, queued, runner_ups = [], 0.0, 0
    most = cfg.branches if branches is None else branches
    for i, hit in branch_chances(rates, k, runner_up_rate):
        if i <= k and runner_ups >= most:
            continue
        if not worth_overlapping(hit, cap, AheadCosts(step, hop, verify - queued, contention)):
            continue
        at.append(i)
        runner_ups += i <= k
        queued += (cap + 1) * step + hop
    return AheadPlan(cap, tuple(at)) if at else NO_AHEAD


@dataclass
class RunnerUpTracker:
    """How often the target, rejecting a draft token, recovers with the draft's runner-up there (decayed
    like AcceptanceTracker; from a prior until measured): the chance behind branch_chances."""

    hits: float = RUNNER_UP_PRIOR * RUNNER_UP_PRIOR_TRIES
    tries: float = RUNNER_UP_PRIOR_TRIES

    def observe(self, draft_ids: Sequence[int], runner_up_ids: Sequence[int], accepted: int, next_token: int) -> None:
        """A round that proposed `draft_ids` (runner-ups `runner_up_ids`) and accepted `accepted` of them."""
        if accepted >= min(len(draft_ids), len(runner_up_ids)):
            return  # all accepted (the bonus is no recovery), or no runner-up known there
        self.hits = self.hits * DECAY + (runner_up_ids[accepted] == next_token)
        self.tries = self.tries * DECAY + 1.0

    def rate(self) -> float:
        return self.hits / self.tries


@dataclass(frozen=True)
class BlockBase:
    """What a pre-draft continued: round r's context + its draft block, kept so that comparing a later
    context costs O(block), never O(context). Round r's context is the first `prefix_len` tokens of every
    later context of the generation (the orchestrator only appends accepted tokens), so a context equals
    base + [one token] iff it has that length and the block at the block's positions; the last few
    prefix tokens are checked too, as a cheap guard."""

    prefix_len: int
    prefix_tail: tuple[int, ...]  # the last PREFIX_CHECK_TOKENS tokens of round r's context
    block: tuple[int, ...]  # round r's draft block d1..dk (empty in a k = 0 round)

    @classmethod
    def of(cls, context: Sequence[int], block: Sequence[int]) -> BlockBase:
        return cls(len(context), tuple(context[max(0, len(context) - PREFIX_CHECK_TOKENS) :]), tuple(block))

    def __len__(self) -> int:
        return self.prefix_len + len(self.block)

    def continued_by_one(self, context: Sequence[int]) -> bool:
        """Whether `context` is this base + exactly one more token."""
        end = self.prefix_len
        return (
            len(context) == end + len(self.block) + 1
            and tuple(context[end : end + len(self.block)]) == self.block
            and tuple(context[end - len(self.prefix_tail) : end]) == self.prefix_tail
        )


Call = Callable[[], Awaitable[tuple[draft_pb2.ProposeResponse, str, int]]]  # -> (response, replica, retries)


@dataclass
class Branch:
    """One block drafted ahead: from base + [guess] (a branch: `guess` is the runner-up at a position of round
    r's block), or, `guess` None, from base with the draft's own guess of the next token as its first token
    (post-verify). Its call's answer lands in `response` (or `error`); `done` is set either way, also when the
    pre-draft stopped before this branch ran."""

    base: BlockBase
    guess: int | None
    call: Call
    response: draft_pb2.ProposeResponse | None = None
    replica: str = ""
    error: Exception | None = None
    started: float | None = None  # perf_counter when its call was sent
    finished: float | None = None  # ... and when its answer came
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def matches(self, context: Sequence[int]) -> bool:
        """Whether a round from `context` could use this block (the post-verify guess is known only from the answer)."""
        return self.base.continued_by_one(context) and (self.guess is None or context[-1] == self.guess)

    def hidden_ms(self, verified: float | None) -> float:
        """Wall time of this branch's call (hop + draft forward) that ran while round r's verify was in flight."""
        if self.started is None or self.finished is None or verified is None:
            return 0.0
        return max(0.0, min(self.finished, verified) - self.started) * MS_PER_S


@dataclass
class PreDraft:
    """Round r + 1's candidate blocks being drafted ahead, one branch after another on one task."""

    branches: list[Branch]
    kind: str  # the remote draft kind asked ("model")
    task: asyncio.Task  # runs the branches' calls in order
    verified: float | None = None  # perf_counter when round r's verify returned

    def branch_for(self, context: Sequence[int]) -> Branch | None:
        """The branch a round from `context` could use (at most one: their contexts differ), or None."""
        return next((branch for branch in self.branches if branch.matches(context)), None)


async def _run_branches(branches: Sequence[Branch]) -> None:
    """The branches' calls one after another (the draft replica serialises a session's calls anyway); a failed
    call ends the pre-draft (the replica is likely gone). Every branch's `done` is set when this returns. Between two
    calls it yields once, so that a round which was waiting for the branch before stops it before the next call."""
    try:
        for branch in branches:
            await asyncio.sleep(0)  # a round already waiting for the branch before stops the rest here
            branch.started = time.perf_counter()
            try:
                branch.response, branch.replica, _ = await branch.call()
            except Exception as exc:  # noqa: BLE001 - kept for take(): a lost pre-draft costs time, never a token
                branch.error = exc
                return
            finally:
                branch.finished = time.perf_counter()
                branch.done.set()
    finally:
        for branch in branches:
            branch.done.set()


def start_predraft(branches: list[Branch], kind: str) -> PreDraft:
    """Start drafting `branches` ahead (in this order) as one task."""
    return PreDraft(branches, kind, asyncio.create_task(_run_branches(branches)))


def ready_block(ahead: PreDraft | None, context: Sequence[int], k: int) -> int:
    """Tokens of a pre-draft that has already answered which a round from `context` could use (0: none,
    or not answered yet). Lets adaptive k choose knowing the block is free (adaptive.choose_k_drafted)."""
    branch = ahead.branch_for(context) if ahead is not None else None
    if branch is None or branch.response is None:
        return 0
    return usable_block(branch.base, branch.response.draft_ids, context, k, branch.guess)


@dataclass
class Taken:
    """A pre-drafted block a round uses (ProposeResponse sliced to the round's k)."""

    response: draft_pb2.ProposeResponse
    replica: str
    forward_ms: float  # the pre-draft's draft forward time
    hidden_ms: float  # its wall time behind the previous round's verify
    runner_up_at: int = 0  # behind the runner-up at this position of round r's block (0: post-verify)


async def take(ahead: PreDraft | None, context: Sequence[int], k: int, kind: str) -> Taken | None:
    """The pre-drafted block for a round from `context` with k draft tokens of `kind`, or None (the
    pre-draft is discarded: another context, another kind, or it failed). Waits for the matching branch's
    answer, then stops the pre-draft (its later branches are of no use now), so it never holds the draft
    replica past this point."""
    branch = ahead.branch_for(context) if ahead is not None and k > 0 and kind == ahead.kind else None
    if branch is not None:
        await branch.done.wait()
    await discard(ahead)
    if branch is None:
        return None
    assert ahead is not None, "a branch is a pre-draft's"
    if branch.response is None:
        if branch.error is not None and not isinstance(branch.error, SpecDecError):
            raise branch.error
        log.info("a pre-draft was lost (%s): the round drafts as usual", branch.error or "cancelled")
        return None
    response, skip = branch.response, 1 if branch.guess is None else 0
    n = usable_block(branch.base, response.draft_ids, context, k, branch.guess)
    if n == 0:
        return None
    sliced = draft_pb2.ProposeResponse(
        draft_ids=response.draft_ids[skip : skip + n],
        draft_kind=response.draft_kind,
        runner_up_ids=response.runner_up_ids[skip : skip + n],
    )
    if response.draft_probs:
        sliced.draft_probs.extend(response.draft_probs[skip : skip + n])
    sliced.stats.CopyFrom(response.stats)
    at = len(branch.base.block) + 1 if branch.guess is not None else 0
    return Taken(sliced, branch.replica, response.stats.forward_ms, branch.hidden_ms(ahead.verified), at)


async def discard(ahead: PreDraft | None) -> None:
    """Drop a pre-draft: cancel it if still running and wait until it stopped (errors are kept in its branches)."""
    if ahead is None:
        return
    if not ahead.task.done():
        ahead.task.cancel()
    await asyncio.wait({ahead.task})
    if not ahead.task.cancelled():
        ahead.task.exception()


async def with_hop_delay(delay_ms: float, call: Callable[[], Awaitable[Any]]) -> Any:
    """TEST AND BENCH ONLY (OverlapConfig.hop_delay_ms): one call with a fixed delay on each of its two
    hops (request, response), to measure a distant draft or target."""
    if delay_ms <= 0:
        return await call()
    await asyncio.sleep(delay_ms / MS_PER_S)
    result = await call()
    await asyncio.sleep(delay_ms / MS_PER_S)
    return result
