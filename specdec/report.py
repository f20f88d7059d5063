"""Human-readable output of a generation: stats and the per-round table (the source article's trace)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from specdec.v1 import orchestrator_pb2 as pb
from specdec.v1 import target_pb2

KIND = {
    target_pb2.NEXT_KIND_RECOVERED: "recovered",
    target_pb2.NEXT_KIND_BONUS: "bonus",
    target_pb2.NEXT_KIND_TARGET: "target",
}  # target: a round with nothing drafted
MAX_IDS_SHOWN = 8


def _ids(ids: Iterable[int]) -> str:
    ids = list(ids)
    shown = ", ".join(str(i) for i in ids[:MAX_IDS_SHOWN])
    return f"[{shown}{', …' if len(ids) > MAX_IDS_SHOWN else ''}]"


def _flags(flags: Iterable[bool]) -> str:
    return "[" + ",".join("T" if f else "F" for f in flags) + "]"


def round_table(rounds: Iterable[pb.Round]) -> str:
    """One line per round: draft kind and ids, match flags, target ids, accepted, next token, where the round's
    time went and appended text.

    Rows show what the round emitted: after an EOS, length or stop cut inside the round, the positions beyond
    it (draft tokens the target accepted too) are neither shown nor counted, and `next` shows as cut. Times,
    ms: the draft's and the target's forwards, and the rest of the round (`other`: hops, serialisation, the
    services' own work), of which the target's around its forward in brackets (when the target reports it)."""
    header = (
        f"{'round':>5} {'k':>2} {'draft':<5}  {'draft tokens':<34} {'match':<12} {'target tokens':<34} {'acc':>3}  "
        f"{'next':<16} {'draft':>6} {'target':>7} {'other (target)':<15} text"
    )
    lines = [header, "-" * len(header)]
    for r in rounds:
        nxt = f"{r.next_token} ({KIND[r.next_kind]})" if r.next_kind in KIND else "- (cut)"  # cut: EOS/length/stop
        lines.append(
            f"{r.index + 1:>5} {r.k:>2} {r.draft_kind or '-':<5}  {_ids(r.draft_ids):<34} {_flags(r.matches):<12} "
            f"{_ids(r.target_ids):<34} {r.num_accepted:>3}  {nxt:<16} {_times(r)} {r.text!r}"
        )
    return "\n".join(lines)


def in_target_ms(r: pb.Round) -> float | None:
    """The part of a round's overhead spent inside the target around its forward (None: not reported)."""
    return max(0.0, r.target_service_ms - r.target_ms) if r.target_service_ms else None


def _times(r: pb.Round) -> str:
    """The round's draft / target / other ms (see round_table)."""
    own = in_target_ms(r)
    in_target = "" if own is None else f"({own:.2f})"
    return f"{r.draft_ms:>6.1f} {r.target_ms:>7.1f} {f'{r.overhead_ms:.2f} {in_target}':<15}"


def stats_lines(stats: pb.Stats, usage: pb.Usage, finish: Any) -> str:
    """A short block of the numbers users ask about first."""
    finish_name = pb.FinishReason.Name(finish).replace("FINISH_REASON_", "").lower()
    return "\n".join(
        [
            f"finish: {finish_name}   prompt tokens: {usage.prompt_tokens}   "
            f"completion tokens: {usage.completion_tokens}",
            f"rounds: {stats.rounds}   drafted: {stats.draft_tokens}   accepted: {stats.accepted_tokens}   "
            f"acceptance rate: {stats.acceptance_rate:.1%}   "
            f"mean accepted length: {stats.mean_accepted_length:.2f} tokens/round",
            f"time: total {stats.total_ms:.0f} ms = draft {stats.draft_ms:.0f} ms + target {stats.target_ms:.0f} ms "
            f"+ overhead {stats.overhead_ms:.0f} ms ({stats.overhead_ms / max(stats.rounds, 1):.2f} ms/round)   "
            f"wire: {stats.wire_bytes_per_round:.0f} B/round   degraded rounds: {stats.degraded_rounds}",
        ]
    )
