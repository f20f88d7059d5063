"""Per-generation statistics: collected per round, exported as the Stats proto.

Only what a round emitted counts (:func:`count_emitted`): when EOS, max_new_tokens, the context end or a
stop string cuts a round, the draft tokens the target accepted after the cut are not counted as
accepted (nor drafted), and the recovered/bonus token counts only if it was emitted. So the
rounds' tokens sum to the completion's, and the acceptance rate is over the emitted part.
Mean accepted length counts the recovered/bonus token: a round that accepts m draft tokens
yields m + 1 tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from orchestrator.rounds import RoundOutcome
from specdec.v1 import orchestrator_pb2 as pb
from specdec.v1 import target_pb2

MS_PER_S = 1000.0


@dataclass(frozen=True)
class Emitted:
    """What one round contributed to the completion (after EOS / length / context / stop cuts)."""

    tokens: int  # tokens the round appended to the completion
    drafted: int  # draft positions counted: all of them, or only those before the cut
    accepted: int  # accepted draft tokens that were emitted
    next_kind: target_pb2.NextKind  # of the target's token; UNSPECIFIED when it was cut


def next_kind(o: RoundOutcome) -> target_pb2.NextKind:
    """What the round's own target token is: recovered, bonus, or, where nothing was drafted (k = 0, or a draft
    that proposed nothing; the target answers `bonus` as all of no drafts passed), a plain target token."""
    return o.next_kind if o.draft_ids else target_pb2.NEXT_KIND_TARGET


def count_emitted(o: RoundOutcome, kept: int) -> Emitted:
    """Count a round by the `kept` tokens it emitted (a prefix of o.emitted: accepted drafts, then the
    target's token). A cut inside the accepted run drops the later positions, accepted or not."""
    if kept > o.num_accepted:  # the whole accepted run and the target's token
        return Emitted(kept, len(o.draft_ids), o.num_accepted, next_kind(o))
    return Emitted(kept, min(kept, len(o.draft_ids)), kept, target_pb2.NEXT_KIND_UNSPECIFIED)


@dataclass
class StatsCollector:
    """Sums over the rounds of one generation."""

    started: float = field(default_factory=time.perf_counter)
    first_token_ms: float = 0.0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    recovered: int = 0
    bonus: int = 0
    round_tokens: int = 0  # tokens the rounds emitted (m + 1 per uncut round)
    draft_ms: float = 0.0
    target_ms: float = 0.0
    overhead_ms: float = 0.0
    wire_bytes: int = 0
    degraded: int = 0
    retries: int = 0
    context_resends: int = 0
    target_computed: int = 0
    draft_computed: int = 0
    last_target_batch: int = 0  # sessions of the pass the latest round rode in (0: not reported)
    first_target_cached: int = 0  # context tokens the target held at the first round (its own or shared)
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)

    def add_round(self, o: RoundOutcome, kept_tokens: int) -> Emitted:
        """Account for one round that emitted `kept_tokens` tokens; returns what was counted."""
        if self.rounds == 0:
            self.first_target_cached = o.cost.target_cached
            if kept_tokens:
                self.first_token_ms = (time.perf_counter() - self.started) * MS_PER_S
        e = count_emitted(o, kept_tokens)
        self.rounds += 1
        self.drafted += e.drafted
        self.accepted += e.accepted
        self.recovered += e.next_kind == target_pb2.NEXT_KIND_RECOVERED
        self.bonus += e.next_kind == target_pb2.NEXT_KIND_BONUS
        self.round_tokens += e.tokens
        self.draft_ms += o.cost.draft_ms
        self.target_ms += o.cost.target_ms
        self.overhead_ms += o.cost.overhead_ms
        self.wire_bytes += o.cost.wire_bytes
        self.degraded += o.degraded
        self.retries += o.cost.retries
        self.context_resends += o.cost.context_resends
        self.target_computed += o.cost.target_computed
        self.draft_computed += o.cost.draft_computed
        self.last_target_batch = o.cost.target_batch
        for i in range(e.drafted):
            if i >= len(self.drafted_per_position):
                self.drafted_per_position.append(0)
                self.accepted_per_position.append(0)
            self.drafted_per_position[i] += 1
            self.accepted_per_position[i] += i < e.accepted
        return e

    def proto(self) -> pb.Stats:
        """Export as the wire Stats message."""
        rounds = max(self.rounds, 1)
        return pb.Stats(
            rounds=self.rounds,
            draft_tokens=self.drafted,
            accepted_tokens=self.accepted,
            recovered_tokens=self.recovered,
            bonus_tokens=self.bonus,
            acceptance_rate=self.accepted / self.drafted if self.drafted else 0.0,
            mean_accepted_length=self.round_tokens / rounds if self.rounds else 0.0,
            draft_ms=self.draft_ms,
            target_ms=self.target_ms,
            overhead_ms=self.overhead_ms,
            total_ms=(time.perf_counter() - self.started) * MS_PER_S,
            wire_bytes=self.wire_bytes,
            wire_bytes_per_round=self.wire_bytes / rounds,
            target_passes=self.rounds,
            degraded_rounds=self.degraded,
            accepted_per_position=self.accepted_per_position,
            drafted_per_position=self.drafted_per_position,
            time_to_first_token_ms=self.first_token_ms,
            retries=self.retries,
            target_computed_tokens=self.target_computed,
            draft_computed_tokens=self.draft_computed,
            context_resends=self.context_resends,
        )

    def round_proto(self, o: RoundOutcome, e: Emitted, text: str, index: int | None = None) -> pb.Round:
        """One row of the per-round trace, cut as the stats count it (`e`): draft ids, matches and target ids
        of the counted positions only, so the rows sum to the stats (drafted, accepted, completion tokens).
        `index`: the row's round (default: the latest counted)."""
        emitted_next = e.next_kind != target_pb2.NEXT_KIND_UNSPECIFIED
        return pb.Round(
            index=self.rounds - 1 if index is None else index,
            k=o.k,
            draft_ids=o.draft_ids[: e.drafted],
            matches=o.matches[: e.drafted],
            target_ids=o.target_ids[: e.drafted + emitted_next],
            num_accepted=e.accepted,
            next_token=o.next_token if emitted_next else -1,
            next_kind=e.next_kind,
            text=text,
            draft_ms=o.cost.draft_ms,
            target_ms=o.cost.target_ms,
            overhead_ms=o.cost.overhead_ms,
            draft_kind=o.draft_kind,
            draft_replica=o.cost.draft_replica,
            target_replica=o.cost.target_replica,
            target_cached_tokens=o.cost.target_cached,
            target_computed_tokens=o.cost.target_computed,
            draft_computed_tokens=o.cost.draft_computed,
            target_batch_size=o.cost.target_batch,
            wire_bytes=o.cost.wire_bytes,
            context_tokens=o.context_tokens,
            context_resends=o.cost.context_resends,
            target_service_ms=o.cost.target_service_ms,
            draft_service_ms=o.cost.draft_service_ms,
        )
