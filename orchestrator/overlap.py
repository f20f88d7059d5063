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
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

from specdec.config import OverlapConfig
from specdec.errors import SpecDecError
from specdec.params import MODEL
from specdec.v1 import draft_pb2

from orchestrator.adaptive import NO_DRAFT, CostModel, k_for_free_block

log = logging.getLogger("specdec.orchestrator")
MS_PER_S = 1000.0
PREFIX_CHECK_TOKENS = 8     # round r's last context tokens a BlockBase re-checks (a guard, not the proof)


def usable_block(base: BlockBase, drafted: Sequence[int], context: Sequence[int], k: int) -> int:
    """How many tokens of a pre-drafted block a round from `context` asking for k draft tokens can use.

    The pre-draft continued `base` (round r's context + its draft block) with `drafted` = e1..en: e1 is
    the draft's guess of the target's bonus, e2..en the next block. It is usable only when the accepted
    context is exactly base + [e1]; then the round takes e2..e(1 + min(k, n - 1)) (draws are keyed by
    position, so the first j tokens of a longer block are the block a j-token round drafts). 0 = none.
    """
    if k <= 0 or len(drafted) < 2 or not base.continued_by_one(context) or context[-1] != drafted[0]:
        return 0
    return min(k, len(drafted) - 1)


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

    draft_step_ms: float       # one draft token
    draft_hop_ms: float        # the draft call's overhead (hop, serialisation)
    verify_ms: float           # the round's own verify, which the pre-draft hides behind
    miss_cost_ms: float        # what a pre-draft costs the verify beside it (used or not): shared cores


def worth_overlapping(hit: float, k_ahead: int, costs: AheadCosts) -> bool:
    """The per-round decision: expected saving P(hit) x (draft time + hop of the next block) against
    what the pre-draft costs the verify beside it plus the wait when it outlasts the verify."""
    if k_ahead <= 0:
        return False
    ahead_ms = (k_ahead + 1) * costs.draft_step_ms + costs.draft_hop_ms
    wait_ms = max(0.0, ahead_ms - costs.verify_ms)
    saved_ms = k_ahead * costs.draft_step_ms + costs.draft_hop_ms
    return hit * saved_ms > costs.miss_cost_ms + wait_ms


def plan_ahead(cap: int, k: int, costs: CostModel, cfg: OverlapConfig, rates: Sequence[float],
               adaptive: bool = False, running: float = 1.0) -> int:
    """Tokens to draft ahead behind a k-token round: `cap` (the next round's k cap; with adaptive k, only as
    many as a round would verify from a free block, adaptive.k_for_free_block: the rest would never be
    used), or 0 under load (the target's passes carry other sessions on average, or more than
    OverlapConfig.max_running generations per target replica run in this orchestrator now: `running`) or
    when not worth it,
    the pre-draft's cost to the verify beside it being measured (CostModel.overlap_extra_ms) with
    OverlapConfig.miss_cost_ms as its floor."""
    if running > cfg.max_running or costs.batch > cfg.max_target_batch:
        return 0
    if adaptive:
        cap = k_for_free_block(costs, list(rates), cap, MODEL)
    if cap <= 0:
        return 0
    hop = max(0.0, costs.overhead_ms.get(MODEL, 0.0) - costs.overhead_ms.get(NO_DRAFT, 0.0))
    contention = max(cfg.miss_cost_ms, costs.overlap_extra_ms or 0.0)
    weights = AheadCosts(costs.draft_step_ms.get(MODEL, 0.0), hop, costs.pass_ms(k + 1), contention)
    return cap if worth_overlapping(hit_probability(rates, k), cap, weights) else 0


@dataclass(frozen=True)
class BlockBase:
    """What a pre-draft continued: round r's context + its draft block, kept so that comparing a later
    context costs O(block), never O(context). Round r's context is the first `prefix_len` tokens of every
    later context of the generation (the orchestrator only appends accepted tokens), so a context equals
    base + [one token] iff it has that length and the block at the block's positions; the last few
    prefix tokens are checked too, as a cheap guard."""

    prefix_len: int
    prefix_tail: tuple[int, ...]            # the last PREFIX_CHECK_TOKENS tokens of round r's context
    block: tuple[int, ...]                  # round r's draft block d1..dk (empty in a k = 0 round)

    @classmethod
    def of(cls, context: Sequence[int], block: Sequence[int]) -> "BlockBase":
        return cls(len(context), tuple(context[max(0, len(context) - PREFIX_CHECK_TOKENS):]), tuple(block))

    def __len__(self) -> int:
        return self.prefix_len + len(self.block)

    def continued_by_one(self, context: Sequence[int]) -> bool:
        """Whether `context` is this base + exactly one more token."""
        end = self.prefix_len
        return (len(context) == end + len(self.block) + 1
                and tuple(context[end:end + len(self.block)]) == self.block
                and tuple(context[end - len(self.prefix_tail):end]) == self.prefix_tail)


@dataclass
class PreDraft:
    """A block being drafted ahead from `base` (round r's context + its draft block)."""

    base: BlockBase
    kind: str                               # the remote draft kind asked ("model")
    task: asyncio.Task                      # -> (ProposeResponse, replica address)
    started: float = field(default_factory=time.perf_counter)
    finished: float | None = None           # perf_counter when its answer came
    verified: float | None = None           # perf_counter when round r's verify returned

    def hidden_ms(self) -> float:
        """Wall time of the pre-draft (hop + draft forward) that ran while round r's verify was in flight."""
        if self.finished is None or self.verified is None:
            return 0.0
        return max(0.0, min(self.finished, self.verified) - self.started) * MS_PER_S


def start_predraft(base: BlockBase, kind: str,
                   call: Callable[[], Awaitable[tuple[draft_pb2.ProposeResponse, str, int]]]) -> PreDraft:
    """Start the pre-draft's Propose (`call`) as a task; it records when its answer came."""
    holder: list[PreDraft] = []

    async def run() -> tuple[draft_pb2.ProposeResponse, str]:
        try:
            response, address, _ = await call()
            return response, address
        finally:
            holder[0].finished = time.perf_counter()

    ahead = PreDraft(base, kind, asyncio.create_task(run()))
    holder.append(ahead)
    return ahead


def ready_block(ahead: PreDraft | None, context: Sequence[int], k: int) -> int:
    """Tokens of a pre-draft that has already answered which a round from `context` could use (0: none,
    or not answered yet). Lets adaptive k choose knowing the block is free (adaptive.choose_k_drafted)."""
    if ahead is None or not ahead.task.done() or ahead.task.cancelled() or ahead.task.exception() is not None:
        return 0
    response, _ = ahead.task.result()
    return usable_block(ahead.base, response.draft_ids, context, k)


@dataclass
class Taken:
    """A pre-drafted block a round uses (ProposeResponse sliced to the round's k)."""

    response: draft_pb2.ProposeResponse
    replica: str
    forward_ms: float                   # the pre-draft's draft forward time
    hidden_ms: float                    # its wall time behind the previous round's verify


async def take(ahead: PreDraft | None, context: Sequence[int], k: int, kind: str) -> Taken | None:
    """The pre-drafted block for a round from `context` with k draft tokens of `kind`, or None (the
    pre-draft is discarded: another context, another kind, or it failed). A pre-draft that cannot be
    used is cancelled if still running, so it never holds the draft replica past this point."""
    if ahead is None:
        return None
    if k <= 0 or kind != ahead.kind or not ahead.base.continued_by_one(context):
        await discard(ahead)
        return None
    await asyncio.wait({ahead.task})
    failure = None if ahead.task.cancelled() else ahead.task.exception()
    if ahead.task.cancelled() or isinstance(failure, SpecDecError):
        log.info("a pre-draft was lost (%s): the round drafts as usual", failure or "cancelled")
        return None
    if failure is not None:
        raise failure
    response, replica = ahead.task.result()
    n = usable_block(ahead.base, response.draft_ids, context, k)
    if n == 0:
        return None
    sliced = draft_pb2.ProposeResponse(draft_ids=response.draft_ids[1:n + 1], draft_kind=response.draft_kind)
    if response.draft_probs:
        sliced.draft_probs.extend(response.draft_probs[1:n + 1])
    sliced.stats.CopyFrom(response.stats)
    return Taken(sliced, replica, response.stats.forward_ms, ahead.hidden_ms())


async def discard(ahead: PreDraft | None) -> None:
    """Drop a pre-draft: cancel it if still running and wait until it stopped (errors are not needed)."""
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
