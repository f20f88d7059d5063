"""What a model service holds of each session's context, so Propose/Verify can send only new tokens.

The delta form (docs/protocol.md, "Delta rounds"): a request carries the tokens after
`position_base` and the hash of the first `position_base` tokens (specdec.core.prefix_hash).
`ContextStore.resolve` turns either form into the whole context:
  * full form (no prefix hash): the request's tokens are the context; remembered for the session;
  * delta form: the held prefix (checked against the hash in O(1)) + the request's tokens;
    a prefix the store does not hold is a ContextMiss (the caller resends the whole context).

Per round this costs the new tokens' hash steps and id checks plus two copies (the context handed to
the engine is a fresh list the store never mutates, its prefix hashes a copy of the store's array):
nothing hashes or compares the whole context. A request whose tokens the store already holds (the target
held them ahead with `hold_next` after answering the round before, or the call is sent again) costs
neither: it gets the held list as it is and a copy of the hashes made ahead. The engines use those hashes to find what their KV
cache shares with the context (SessionKV.common_prefix) in O(log n). A full-form call (an older
orchestrator) is compared once with the held context and hashes only what differs.

Soft state, like the KV caches: bounded by `max_tokens` over all sessions (least recently used
evicted first), lost on restart, and never needed for correctness (a miss costs one resend).
Used from the event loop only (resolve, release, counters).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from specdec.core.prefix_hash import PrefixHashes
from specdec.engine.kvcache import common_prefix_len
from specdec.errors import ContextMiss, InvalidArgument


@dataclass
class HeldContext:
    """One session's context as last sent, and the hashes of all its prefixes."""

    tokens: list[int]
    hashes: PrefixHashes = field(default_factory=PrefixHashes)  # len(hashes) == len(tokens)
    ready: PrefixHashes | None = None  # a copy of `hashes` made ahead (hold_next), for the call that continues them


@dataclass
class ContextCounters:
    hits: int = 0  # delta-form calls whose prefix was held
    misses: int = 0  # delta-form calls answered with a ContextMiss
    evictions: int = 0  # sessions dropped to stay within max_tokens


class ContextStore:
    """Session id -> HeldContext, at most `max_tokens` tokens over all sessions.

    Args:
        max_tokens: the most context tokens held (about 50 bytes each with their hashes); 0 = hold
            nothing (every delta request misses: the delta form is then refused by Info).
        width: token ids must lie in [0, width); 0 = any non-negative id (an n-gram-only draft).
    """

    def __init__(self, max_tokens: int, width: int = 0) -> None:
        self.max_tokens = max_tokens
        self.width = width
        self._held: OrderedDict[str, HeldContext] = OrderedDict()
        self._total = 0
        self.counters = ContextCounters()

    def session_count(self) -> int:
        return len(self._held)

    def held_tokens(self) -> int:
        return self._total

    def resolve(
        self, session_id: str, ids: Sequence[int], position_base: int, prefix_hash: int | None
    ) -> tuple[list[int], PrefixHashes]:
        """The whole context of a call (see the module docstring), with every new id checked, and the
        hashes of its prefixes (a copy the caller may extend).

        ids: the request's context_ids. prefix_hash None = the full form. Raises ContextMiss
        (delta form, prefix not held) or InvalidArgument (an id outside the vocabulary).
        """
        if prefix_hash is None:
            return self._full(session_id, ids, position_base)
        held = self._held.get(session_id)
        if held is None:
            return self._miss("unknown-session", f"no context held for session {session_id!r}")
        if position_base < 0 or len(held.tokens) < position_base:
            return self._miss(
                "shorter",
                f"session {session_id!r}: {len(held.tokens)} context tokens held, "
                f"the request continues position {position_base}",
            )
        if held.hashes.at(position_base) != prefix_hash:
            return self._miss(
                "hash-mismatch",
                f"session {session_id!r}: the {position_base} context tokens held differ from the request's prefix",
            )
        if len(held.tokens) == position_base + len(ids) and held.tokens[position_base:] == list(ids):
            self.counters.hits += 1  # held already (hold_next, or a call sent again): no copy
            self._held.move_to_end(session_id)
            hashes, held.ready = held.ready or held.hashes.copy(), None
            return held.tokens, hashes
        self.check_ids(ids, position_base)
        self.counters.hits += 1
        context = held.tokens[:position_base]
        context.extend(ids)
        held.hashes.truncate(position_base)
        held.hashes.extend(ids)
        self._store(session_id, HeldContext(context, held.hashes))
        return context, held.hashes.copy()

    def _full(self, session_id: str, ids: Sequence[int], position_base: int) -> tuple[list[int], PrefixHashes]:
        """A full-form context: checked past what the held context already shares with it, remembered."""
        context = list(ids)
        held = self._held.get(session_id)
        same = common_prefix_len(held.tokens, context) if held is not None and position_base == 0 else 0
        self.check_ids(context[same:], same)
        if position_base != 0:  # a window, not the whole context: nothing a delta can continue
            self.release(session_id)
            return context, PrefixHashes(context)
        hashes = held.hashes if held is not None else PrefixHashes()
        hashes.truncate(same)
        hashes.extend(context[same:])
        self._store(session_id, HeldContext(context, hashes))
        return context, hashes.copy()

    def hold_next(self, session_id: str, n: int, ids: Sequence[int]) -> bool:
        """Extend the session's held context of exactly `n` tokens by `ids` (checked: tokens a verify emitted)
        before a request asks for it: the request that continues position n with these ids then finds them held.
        False (nothing changed) when the store does not hold exactly n tokens for the session."""
        held = self._held.get(session_id)
        if held is None or len(held.tokens) != n:
            return False
        held.hashes.extend(ids)
        self._store(session_id, HeldContext(held.tokens + list(ids), held.hashes, held.hashes.copy()))
        return True

    def check_ids(self, ids: Sequence[int], first_position: int) -> None:
        """INVALID_ARGUMENT for an id outside [0, width) (first_position: the position of ids[0])."""
        for i, t in enumerate(ids):
            if t < 0 or (self.width and t >= self.width):
                raise InvalidArgument(
                    f"context_ids: the token at position {first_position + i} = {t} is outside "
                    f"the vocabulary [0, {self.width or 'any'})"
                )

    def _miss(self, reason: str, message: str) -> tuple[list[int], PrefixHashes]:
        self.counters.misses += 1
        raise ContextMiss(reason, message + ": resend the whole context (prefix_hash unset)")

    def _store(self, session_id: str, held: HeldContext) -> None:
        """Hold `held` as the session's context (most recently used), evicting others to fit."""
        self.release(session_id)
        if len(held.tokens) > self.max_tokens:
            return  # larger than the whole store: its next delta misses
        while self._held and self._total + len(held.tokens) > self.max_tokens:
            _, victim = self._held.popitem(last=False)
            self._total -= len(victim.tokens)
            self.counters.evictions += 1
        self._held[session_id] = held
        self._total += len(held.tokens)

    def release(self, session_id: str) -> bool:
        """Forget a session's context; True when one was held."""
        held = self._held.pop(session_id, None)
        if held is not None:
            self._total -= len(held.tokens)
        return held is not None
