"""Relaying the target's hidden states to a feature (EAGLE-style) draft, one generation at a time.

A feature draft proposes from the target's final hidden states f_j (specdec/engine/feature.py).
Each Verify may return the rows of the positions the round accepted; the next Propose carries
them to the draft. The orchestrator holds them only between those two calls (in memory, never in
Redis: they are derived state, and a draft that lacks rows says from which position it needs them,
so the next Verify returns those; a lost relay costs one round without a draft, never a token).

    verify_from()   -> the position to ask the target for rows from (None: enough is pending)
    after_verify(h) -> keep the rows the target returned
    take()          -> the rows for the next Propose (contiguous, merged)
    after_propose(n)-> the draft now holds rows up to n (its `target_hidden_from`)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.v1 import common_pb2

# Pending rows stop growing past this; with one Verify's rows on top (the target's max_hidden_bytes,
# 2 MiB by default) a Propose stays under gRPC's 4 MiB message limit (SPECDEC_MAX_MESSAGE_BYTES).
DEFAULT_MAX_PENDING_BYTES = 1024 * 1024


@dataclass
class HiddenRelay:
    """Rows the draft has not received yet, and from where to ask for more.

    Args:
        max_pending_bytes: stop asking for rows while this much is pending (the draft catches
            up from the target later, in chunks).
    """

    max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES
    next_position: int = 0
    pending: list[common_pb2.HiddenStates] = field(default_factory=list)

    def verify_from(self) -> int | None:
        """Where the next Verify should return hidden states from; None = ask for none this round."""
        if sum(len(h.data) for h in self.pending) >= self.max_pending_bytes:
            return None
        return self.next_position

    def after_verify(self, hidden: common_pb2.HiddenStates) -> None:
        """Keep the returned rows when they continue what is pending (a gap drops the older rows)."""
        if hidden.rows <= 0:
            return
        if self.pending and _end(self.pending[-1]) != hidden.first_position:
            self.pending.clear()
        self.pending.append(hidden)
        self.next_position = _end(hidden)

    def take(self) -> common_pb2.HiddenStates | None:
        """All pending rows as one message (None when nothing is pending); they stay pending until
        `after_propose` confirms the draft took them."""
        if not self.pending:
            return None
        first = self.pending[0]
        return common_pb2.HiddenStates(
            data=b"".join(h.data for h in self.pending),
            rows=sum(h.rows for h in self.pending),
            hidden_size=first.hidden_size,
            dtype=first.dtype,
            first_position=first.first_position,
        )

    def after_propose(self, needed_from: int) -> None:
        """The draft holds rows up to `needed_from` (exclusive): drop what it has, ask from there next."""
        self.pending = [h for h in self.pending if _end(h) > needed_from]
        if not self.pending or self.pending[0].first_position > needed_from:
            self.pending.clear()
            self.next_position = needed_from


def _end(h: common_pb2.HiddenStates) -> int:
    return h.first_position + h.rows
