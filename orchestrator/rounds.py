"""One speculative round between the draft and target pools.

  1. the draft proposes up to k tokens d1..dk from the accepted context;
  2. the target scores context + d1..dk in ONE forward pass;
  3. the longest agreeing prefix (m tokens) is accepted, then the target's
     token t(m+1) is appended: RECOVERED when m < k, BONUS when m == k.
So every round yields m + 1 >= 1 tokens. With k = 0 a round is one plain
target step. When no draft replica answers, the round degrades to k = 0
(RoundOutcome.degraded, counted in Stats.degraded_rounds).

Decode steps: a round without a draft may ask the target for up to RoundRequest.steps tokens in one call
(VerifyRequest.steps, vLLM's multi-step decoding): the target runs that many k = 0 rounds back to back and
the call's per-round cost (the hops, the orchestrator's and Redis's work) is paid once for all of them. Each
step comes back as a round of its own (RoundRunner.run returns them in order), so the trace, the stats and
adaptive k see one row per target pass, as without steps.

Context on the wire: a call carries only the tokens its replica does not hold yet plus the hash of
the prefix it does (the delta form, orchestrator/delta.py); a replica that lost the session's
context gets the whole context again in the same round (RoundCost.context_resends).

Deadlines: each call gets base + per_token x (tokens it must compute: the whole
context, since a replica without the session's cache re-runs the prefill),
capped by what is left of the client's deadline (RoundRequest.deadline).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrator.delta import ContextSend, ContextWire
from orchestrator.features import HiddenRelay
from orchestrator.replicas import ReplicaPool
from specdec.config import RetryConfig
from specdec.core.ngram import NgramProposer
from specdec.core.sampling import SamplingConfig
from specdec.errors import DeadlineExceeded, ResourceExhausted, Unavailable
from specdec.params import COMBINED, MODEL, NGRAM
from specdec.protocol import sampling_bytes
from specdec.v1 import common_pb2, draft_pb2, target_pb2

log = logging.getLogger("specdec.orchestrator")
MS_PER_S = 1000.0
# Draft failures that degrade the round to k = 0 instead of failing the generation (the draft is
# an accelerator, never needed for correctness); a bad request (INVALID_ARGUMENT, unknown draft
# kind) still fails.
DEGRADING_DRAFT_ERRORS = (Unavailable, DeadlineExceeded, ResourceExhausted)


@dataclass
class RoundCost:
    """What a round cost and where it ran: the trace's timing and placement columns, the stats' sums and adaptive
    k's cost model read it; the round's tokens do not depend on it."""

    draft_ms: float = 0.0  # draft forward time
    target_ms: float = 0.0  # target forward time
    target_cached: int = 0  # context tokens the target reused from its KV cache
    target_computed: int = 0  # tokens the target ran through its model
    target_batch: int = 0  # sessions the target verified in the same forward pass
    target_batch_tokens: int = 0  # tokens that pass computed over all its sessions (0 = not reported)
    target_queue_ms: float = 0.0  # time the verify waited at the target (session lock, the pass before)
    target_service_ms: float = 0.0  # time the target held the verify (ComputeStats.service_ms; 0 = not reported)
    draft_service_ms: float = 0.0  # time the draft service held this round's Propose (0 = none or not reported)
    draft_computed: int = 0
    wall_ms: float = 0.0
    wire_bytes: int = 0
    draft_replica: str = ""
    target_replica: str = ""
    retries: int = 0
    context_resends: int = 0  # calls resent with the whole context after a replica's context miss

    @property
    def overhead_ms(self) -> float:
        """Everything that is not a model forward (hops, serialisation, queueing) on the round's path."""
        return max(0.0, self.wall_ms - self.draft_ms - self.target_ms)

    @property
    def fixed_overhead_ms(self) -> float:
        """overhead_ms less the time queued at the target: what the round costs outside the forwards at any load."""
        return max(0.0, self.overhead_ms - self.target_queue_ms)

    @property
    def pass_tokens(self) -> int:
        """Tokens the target pass of this round computed over all its sessions (estimated as every session
        of the pass computing as many as this one where the target does not report it)."""
        return self.target_batch_tokens or self.target_computed * max(1, self.target_batch)


@dataclass
class RoundOutcome:
    """What one round produced (the article's per-round table row), and what it cost (`cost`)."""

    k: int
    draft_ids: list[int]
    matches: list[bool]
    target_ids: list[int]
    num_accepted: int
    next_token: int
    next_kind: target_pb2.NextKind
    emitted: list[int]  # accepted draft tokens + the recovered/bonus token
    logprobs: list = field(default_factory=list)
    draft_kind: str = ""  # which draft proposed ("model" | "ngram"; "" = none)
    proposer: str = ""  # which draft was expected to propose (RoundRequest.proposer)
    degraded: bool = False
    context_tokens: int = 0  # the context the round started from
    cost: RoundCost = field(default_factory=RoundCost)


@dataclass
class RoundRequest:
    session_id: str
    request_id: str
    context_ids: list[int]
    k: int
    sampling: SamplingConfig
    draft_kind: str = ""
    logprobs: int = -1
    deadline: float | None = None  # time.monotonic() by which the client wants its answer
    relay: HiddenRelay | None = None  # the generation's hidden-state relay (used with feature drafts)
    proposer: str = ""  # RoundRunner.proposer(): adaptive k's estimates are kept per proposer
    wire: ContextWire | None = None  # the generation's delta-round state (None: every call sends the whole context)
    route: str = ""  # replicas' routing key ("" = the session id; orchestrator/affinity.py)
    verdict_only: bool = False  # the target returns only the accept rule's reads (VerifyRequest.verdict_only)
    steps: int = 1  # a round without a draft: the most tokens the target may decode in its call (RoundRunner._steps)
    stop_ids: Sequence[int] = ()  # decode steps end after one of these (EOS; empty when ignored)

    @property
    def replica_key(self) -> str:
        """What picks this round's replicas: its route, else its session id."""
        return self.route or self.session_id


def context_send(req: RoundRequest, role: str) -> ContextSend:
    """The round's context for one pool's call (the delta form when the generation tracks one)."""
    if req.wire is None:
        return ContextSend(None, role, req.context_ids)
    return req.wire.send(role, req.context_ids)


class RoundRunner:
    """Drives single rounds against the two pools, with deadlines scaled to the work."""

    def __init__(
        self,
        draft: ReplicaPool | None,
        target: ReplicaPool,
        retry: RetryConfig,
        local_ngram: NgramProposer | None = None,
    ) -> None:
        self.draft = draft
        self.target = target
        self.retry = retry
        self.local_ngram = local_ngram

    async def _call(
        self, pool: ReplicaPool, req: RoundRequest, method: str, request, timeout: float, send: ContextSend
    ) -> tuple:
        return await pool.call(req.replica_key, method, request, timeout, send)

    def target_replicas(self) -> int:
        """Healthy target replicas (at least 1): the generations of this orchestrator spread over them."""
        return max(1, len(self.target.set.healthy))

    def draft_kind(self, requested: str) -> str:
        """The kind a round uses: the request's, else the draft pool's, else n-gram (no pool)."""
        if requested:
            return requested
        usable = self.draft.usable() if self.draft is not None else []
        info = usable[0].info if usable else None
        return info.draft_kind if info is not None and info.draft_kind else NGRAM

    def proposer(self, requested: str, context_ids: Sequence[int], wire: ContextWire | None = None) -> str:
        """Which draft will propose a round for this context: the kind itself, except that a combined
        draft whose lookup runs here is resolved now (`ngram` when the context's tail occurred before,
        `model` otherwise; the same lookup `_propose` makes, through the generation's incremental index
        when its `wire` is given). Adaptive k keeps acceptance and costs per proposer."""
        kind = self.draft_kind(requested)
        if kind == COMBINED and self.local_ngram is not None:
            if wire is not None:
                return NGRAM if wire.lookup(self.local_ngram).propose(context_ids, 1) else MODEL
            return NGRAM if self.local_ngram.has_match(context_ids) else MODEL
        return kind

    def feature_draft(self, requested: str) -> bool:
        """Whether this round's draft is a feature draft (fed the target's hidden states)."""
        if self.draft_kind(requested) != MODEL:
            return False
        usable = self.draft.usable() if self.draft is not None else []
        info = usable[0].info if usable else None
        return info is not None and info.needs_target_hidden

    def _propose_locally(self, req: RoundRequest) -> draft_pb2.ProposeResponse:
        """The model-free n-gram draft, in this process: no network hop. Its lookup time is the draft's
        step (draft_ms), like a model draft's forward, not overhead."""
        ngram = self.local_ngram
        assert ngram is not None, "rounds propose locally only with a local n-gram draft"
        start = time.perf_counter()
        if req.wire is not None:  # the generation's index: O(new tokens), not O(context), per round
            draft_ids = req.wire.lookup(ngram).propose(req.context_ids, req.k)
        else:
            draft_ids = ngram.propose(req.context_ids, req.k)
        response = draft_pb2.ProposeResponse(draft_ids=draft_ids, draft_kind=NGRAM)
        response.stats.forward_ms = (time.perf_counter() - start) * MS_PER_S
        return response

    def _deadline(self, tokens: int, deadline: float | None = None) -> float:
        """Seconds for a call computing `tokens` tokens, within the client's deadline."""
        scaled = self.retry.base_deadline_s + self.retry.per_token_deadline_s * tokens
        if deadline is None:
            return scaled
        left = deadline - time.monotonic()
        if left < self.retry.min_deadline_s:
            raise DeadlineExceeded("the client's deadline passed before the round could run")
        return min(scaled, left)

    async def run(self, req: RoundRequest) -> list[RoundOutcome]:
        """Steps 1-3 of the round (see module docstring): the round, then one per decode step the target ran."""
        start = time.perf_counter()
        relay = req.relay if req.relay is not None and self.feature_draft(req.draft_kind) else None
        proposal, out = await self._propose(req, relay)
        verify = target_pb2.VerifyRequest(
            session_id=req.session_id,
            request_id=req.request_id,
            draft_ids=proposal.draft_ids,
            draft_probs=proposal.draft_probs,
            verdict_only=req.verdict_only and bool(proposal.draft_ids),
        )
        verify.sampling.MergeFromString(sampling_bytes(req.sampling))
        if req.logprobs >= 0:
            verify.logprobs = req.logprobs
        steps, repeat = self._steps(req, proposal, relay)
        if steps > 1:
            verify.steps, verify.stop_on_repeat = steps, repeat
            verify.stop_ids.extend(req.stop_ids)
        hidden_from = relay.verify_from() if relay is not None else None
        if hidden_from is not None:
            verify.return_hidden_states, verify.hidden_from = True, hidden_from
        timeout = self._deadline(len(req.context_ids) + len(proposal.draft_ids) + steps - 1, req.deadline)
        send = context_send(req, "target")
        verdict, out.cost.target_replica, retries = await self._call(self.target, req, "Verify", verify, timeout, send)
        out.cost.context_resends += send.resends
        if relay is not None and hidden_from is not None:
            relay.after_verify(verdict.hidden)
        m, drafted = verdict.num_accepted, list(proposal.draft_ids)
        out.draft_ids, out.target_ids, out.matches = drafted, list(verdict.target_ids), list(verdict.matches)
        out.num_accepted, out.next_token, out.next_kind = m, verdict.next_token, verdict.next_kind
        out.emitted = drafted[:m] + [verdict.next_token]
        out.logprobs = list(verdict.logprobs)
        target_cost(out.cost, verdict.stats)
        out.cost.wire_bytes += verify.ByteSize() + verdict.ByteSize()
        out.cost.retries += retries
        out.cost.wall_ms = (time.perf_counter() - start) * MS_PER_S
        return [out, *step_rounds(out, verdict)]

    def _steps(
        self, req: RoundRequest, proposal: draft_pb2.ProposeResponse, relay: HiddenRelay | None
    ) -> tuple[int, int]:
        """(decode steps, stop_on_repeat) of the round's Verify: up to req.steps without a draft; where the local
        n-gram draft was asked and found nothing, until the context's tail repeats (then it can propose again)."""
        if proposal.draft_ids or relay is not None or req.steps <= 1:
            return 1, 0
        if req.k == 0:
            return req.steps, 0
        if self.local_ngram is not None and self.draft_kind(req.draft_kind) == NGRAM:
            return req.steps, self.local_ngram.min_n
        return 1, 0

    async def _propose(
        self, req: RoundRequest, relay: HiddenRelay | None
    ) -> tuple[draft_pb2.ProposeResponse, RoundOutcome]:
        out = RoundOutcome(
            k=req.k,
            draft_ids=[],
            matches=[],
            target_ids=[],
            num_accepted=0,
            next_token=-1,
            next_kind=target_pb2.NEXT_KIND_UNSPECIFIED,
            emitted=[],
            proposer=req.proposer,
            context_tokens=len(req.context_ids),
        )
        empty = draft_pb2.ProposeResponse()
        if req.k == 0:
            return empty, out
        kind = self.draft_kind(req.draft_kind)
        remote_kind = req.draft_kind
        if kind == COMBINED and self.local_ngram is not None and req.proposer == MODEL:
            remote_kind = MODEL  # `proposer` already looked the tail up here and found nothing
        elif self.local_ngram is not None and kind in (NGRAM, COMBINED):
            response = self._propose_locally(req)
            out.cost.draft_ms = response.stats.forward_ms
            if kind == NGRAM or response.draft_ids:
                out.cost.draft_replica, out.draft_kind = "local", NGRAM if response.draft_ids else ""
                return response, out
            remote_kind = MODEL  # combined and the lookup found nothing here: the pool's model proposes
        if self.draft is None:
            out.degraded = True
            return empty, out
        propose = draft_pb2.ProposeRequest(session_id=req.session_id, request_id=req.request_id, k=req.k)
        propose.sampling.MergeFromString(sampling_bytes(req.sampling))
        send = context_send(req, "draft")
        if remote_kind:
            propose.draft_kind = remote_kind
        rows = relay.take() if relay is not None else None
        if rows is not None:
            propose.target_hidden.CopyFrom(rows)
        try:
            timeout = self._deadline(len(req.context_ids) + req.k, req.deadline)
            response, out.cost.draft_replica, out.cost.retries = await self._call(
                self.draft, req, "Propose", propose, timeout, send
            )
        except DEGRADING_DRAFT_ERRORS as exc:
            log.warning("draft unavailable, degrading session %s to target-only this round: %s", req.session_id, exc)
            out.degraded = True
            return empty, out
        if relay is not None and response.HasField("target_hidden_from"):
            relay.after_propose(response.target_hidden_from)
        out.cost.draft_ms += response.stats.forward_ms
        out.cost.draft_service_ms = response.stats.service_ms
        out.draft_kind = response.draft_kind if response.draft_ids else ""
        out.cost.draft_computed = response.stats.computed_tokens
        out.cost.context_resends = send.resends
        out.cost.wire_bytes = propose.ByteSize() + response.ByteSize()
        return response, out


def target_cost(cost: RoundCost, stats: common_pb2.ComputeStats) -> RoundCost:
    """Fill the target's side of a round's cost from the ComputeStats of its pass; returns `cost`."""
    cost.target_ms, cost.target_cached = stats.forward_ms, stats.cached_tokens
    cost.target_computed, cost.target_batch = stats.computed_tokens, stats.batch_size
    cost.target_batch_tokens, cost.target_queue_ms = stats.batch_tokens, stats.queue_ms
    cost.target_service_ms = stats.service_ms
    return cost


def step_rounds(first: RoundOutcome, verdict: target_pb2.VerifyResponse) -> list[RoundOutcome]:
    """The decode steps of a verdict (VerifyResponse.steps) as k = 0 rounds after `first`. The call's time outside
    the passes is shared equally among its rounds, at the orchestrator (wall_ms) and at the target (target_service_ms),
    so each round's own part of the call stays within its overhead (first's figures are the call's: it keeps its
    share)."""
    if not verdict.steps:
        return []
    n, steps_ms = 1 + len(verdict.steps), sum(step.stats.forward_ms for step in verdict.steps)
    share = max(0.0, first.cost.overhead_ms - steps_ms) / n
    service_share = max(0.0, first.cost.target_service_ms - first.cost.target_ms - steps_ms) / n
    first.cost.wall_ms = first.cost.draft_ms + first.cost.target_ms + share
    if first.cost.target_service_ms:
        first.cost.target_service_ms = first.cost.target_ms + service_share
    rounds, context = [], first.context_tokens + len(first.emitted)
    for step in verdict.steps:
        cost = target_cost(RoundCost(target_replica=first.cost.target_replica), step.stats)
        cost.wall_ms = cost.target_ms + share
        cost.target_service_ms = cost.target_ms + service_share if first.cost.target_service_ms else 0.0
        rounds.append(
            RoundOutcome(
                k=0,
                draft_ids=[],
                matches=[],
                target_ids=[step.token],
                num_accepted=0,
                next_token=step.token,
                next_kind=target_pb2.NEXT_KIND_TARGET,
                emitted=[step.token],
                logprobs=[step.logprob] if step.HasField("logprob") else [],
                proposer=first.proposer,
                context_tokens=context,
                cost=cost,
            )
        )
        context += 1
    return rounds


async def cancel_round(task: asyncio.Task | None) -> None:
    """Cancel a round still in flight and wait until it has stopped (its outcome is not needed)."""
    if task is None:
        return
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # retrieved: a failure of an abandoned round is not worth a warning
