"""Delta rounds, the orchestrator's side: send each replica only the context tokens it does not hold.

Per generation a ContextWire keeps the hash of every prefix of the generation's context
(specdec.core.prefix_hash.PrefixHashes, extended by the few tokens each round adds) and, per
(role, replica address), how many context tokens that replica confirmed holding: the length of the
context of the last call it answered. A call to a replica that holds n tokens carries
context[n:], position_base = n and prefix_hash = hash(context[:n]); to any other replica (first
round, failover, a replica without the delta form, a call that failed) the whole context.

A replica that does not hold the prefix after all (evicted, restarted, another context) answers
FAILED_PRECONDITION with trailing metadata `specdec-context-miss`; ReplicaPool.call then resends
the whole context to it in the same round (ContextSend.resends -> Stats.context_resends).
Within a generation the context only grows, and its rounds' calls to one pool do not overlap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from specdec.core.ngram import NgramIndex, NgramProposer
from specdec.core.prefix_hash import PrefixHashes
from specdec.errors import CONTEXT_MISS_METADATA


def is_context_miss(exc: grpc.aio.AioRpcError) -> bool:
    """Whether a replica's error says it does not hold the request's context prefix."""
    if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
        return False
    return any(key == CONTEXT_MISS_METADATA for key, _ in (exc.trailing_metadata() or ()))


@dataclass
class ContextWire:
    """One generation's context hashes and what each replica holds of its context."""

    hashes: PrefixHashes = field(default_factory=PrefixHashes)
    held: dict[tuple[str, str], int] = field(default_factory=dict)  # (role, address) -> tokens held
    _last: int = -1  # the last token hashed (detects a context that was rewritten)
    ngram: NgramIndex | None = None  # the generation's prompt-lookup index (the orchestrator's n-gram draft)

    def lookup(self, proposer: NgramProposer) -> NgramIndex:
        """The generation's incremental prompt-lookup index (made on first use with `proposer`'s settings):
        a round's lookup indexes only the tokens the context gained, not the whole context."""
        if self.ngram is None:
            self.ngram = proposer.index()
        return self.ngram

    def sync(self, context: Sequence[int]) -> None:
        """Hash the tokens the context gained since the last round (all of it when it was rewritten)."""
        n = len(self.hashes)
        if len(context) < n or (n and context[n - 1] != self._last):
            self.hashes, self.held, n = PrefixHashes(), {}, 0
        self.hashes.extend(context[n:])
        if context:
            self._last = context[-1]

    def send(self, role: str, context: Sequence[int]) -> ContextSend:
        """This round's context for the `role` pool's call."""
        self.sync(context)
        return ContextSend(self, role, context)


@dataclass
class ContextSend:
    """One call's context: fills a request for the replica it goes to and records the outcome."""

    wire: ContextWire | None
    role: str
    context: Sequence[int]
    resends: int = 0  # whole contexts resent after a replica's context miss

    def fill(self, request: Any, address: str, info: Any) -> None:
        """Set the request's context fields for the replica at `address` (its ModelInfo: `info`)."""
        held = self._held(address) if info is not None and info.context_delta else 0
        del request.context_ids[:]
        if held <= 0 or held > len(self.context):
            request.position_base = 0
            request.ClearField("prefix_hash")
            request.context_ids.extend(self.context)
            return
        assert self.wire is not None, "a replica holds a prefix only through the wire"
        request.position_base = held
        request.prefix_hash = self.wire.hashes.at(held)
        request.context_ids.extend(self.context[held:])

    def _held(self, address: str) -> int:
        return self.wire.held.get((self.role, address), 0) if self.wire is not None else 0

    def confirm(self, address: str) -> None:
        """The replica answered: it holds the whole context now."""
        if self.wire is not None:
            self.wire.held[(self.role, address)] = len(self.context)

    def forget(self, address: str) -> None:
        """The call failed: what the replica holds is unknown (the next call sends the whole context)."""
        if self.wire is not None:
            self.wire.held.pop((self.role, address), None)

    def missed(self, address: str) -> None:
        """The replica did not hold the prefix: forget it and count the resend that follows."""
        self.forget(address)
        self.resends += 1
