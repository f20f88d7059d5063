"""Per-session KV caches with an explicit `truncate(n)`, an LRU byte budget, and counters.

A session's cache is soft state: the tokens it covers are stored beside it, each
call reuses the longest common prefix with the request's tokens, rolls back the
rest (rejected draft tokens) and computes only what is new. After eviction or a
restart it is rebuilt from the tokens in the request, with the same output.

This module is the token bookkeeping every runner shares (LRU, prefix reuse, budget, eviction). The
cache itself is a per-runner handle made, truncated, copied and dropped through a `CacheOps`: the
torch runner's DynamicCache (specdec/engine/torch_cache.py), llama.cpp's sequence ids
(specdec/engine/llamacpp_cache.py).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from specdec.core.prefix_hash import PrefixHashes, shared_prefix
from specdec.errors import ResourceExhausted, UnsupportedCacheError

__all__ = ["CacheOps", "KVCachePool", "SessionKV", "UnsupportedCacheError", "common_prefix_len", "kv_bytes_per_token"]


class CacheOps(Protocol):
    """How a runner makes, truncates, copies and drops one session's cache handle.

    capacity: the most sessions it can hold at once (0: no limit but the token budget)."""

    capacity: int

    def new(self) -> Any: ...

    def truncate(self, cache: Any, n: int) -> None: ...

    def copy_prefix(self, cache: Any, donor: Any, n: int) -> None: ...

    def drop(self, cache: Any) -> None: ...


def torch_cache_ops(model_config: Any = None) -> CacheOps:
    """The torch runner's cache handles (imported here only when used: transformers is heavy to import)."""
    from specdec.engine.torch_cache import TorchCacheOps

    return TorchCacheOps(model_config)


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):  # the usual case (one extends the other), compared at C speed
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]: bisect with slice compares
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if list(a[lo:mid]) == list(b[lo:mid]):
            lo = mid
        else:
            hi = mid
    return lo


HIDDEN_MIN_ROWS = 64  # first allocation of a session's hidden-row buffer
EVICTED_IDS_KEPT = 4096  # evicted session ids remembered, to count those that come back (re-prefills)
SHARED_MEMO_MAX = 1024  # `uncached`'s sharer lookups remembered between changes of the pool's sessions


@dataclass
class SessionKV:
    """One session's KV cache and the tokens it covers (len(tokens) == cache length).

    hidden: the model's final (normed) hidden state at every cached position, [len, H], when the
        service keeps them (a target serving feature drafts); truncated with the cache.
    anchor: for caches whose position j is keyed by the token AFTER it (a feature draft's input
        at j pairs x_{j+1} with f_j, so `tokens` = x_1..x_n), the token x_0 they hang from.
    reserved: the positions its current call may grow to (set by `KVCachePool.acquire`); the pool
        counts max(len, reserved), so sessions acquired together for one batched pass cannot
        outgrow the budget once they have all been extended.
    """

    cache: Any  # the runner's handle (CacheOps.new)
    tokens: list[int] = field(default_factory=list)
    hidden: Any = None
    anchor: int = -1
    reserved: int = 0
    hashes: PrefixHashes | None = None  # prefix hashes of `tokens` when kept in step (see `common_prefix`)
    used_at: float = 0.0  # time.monotonic() of its last acquire (the pool's idle rule)
    _hidden_store: Any = field(default=None, repr=False)  # the buffer `hidden` is a prefix view of
    ops: CacheOps | None = field(default=None, repr=False)  # None: a torch DynamicCache

    def __post_init__(self) -> None:
        if self.ops is None:
            self.ops = torch_cache_ops()

    @property
    def _cache_ops(self) -> CacheOps:
        assert self.ops is not None, "__post_init__ sets it"
        return self.ops

    def held(self) -> int:
        """Positions this session counts against the budget: what it holds or its call may reach."""
        return max(len(self.tokens), self.reserved)

    def __len__(self) -> int:
        return len(self.tokens)

    def truncate(self, n: int) -> int:
        """Keep the first n cached positions; return how many were dropped."""
        dropped = len(self.tokens) - n
        if dropped <= 0:
            return 0
        self._cache_ops.truncate(self.cache, n)
        del self.tokens[n:]
        if self.hashes is not None:
            self.hashes.truncate(min(n, len(self.hashes)))
        if self.hidden is not None:
            self.hidden = self.hidden[:n]
        return dropped

    def common_prefix(self, ids: Sequence[int], hashes: PrefixHashes | None = None) -> int:
        """Length of the longest common prefix of the cached tokens and `ids`.

        With `hashes` (prefix hashes covering at least `ids`) and this cache's own hashes in step with
        its tokens, O(log n) hash comparisons instead of comparing the whole context."""
        limit = min(len(self.tokens), len(ids))
        if hashes is None or self.hashes is None or len(self.hashes) != len(self.tokens) or len(hashes) < limit:
            return common_prefix_len(self.tokens, ids)
        return shared_prefix(self.hashes, hashes, limit)

    def adopt_prefix(self, donor: SessionKV, n: int, hidden: bool) -> None:
        """Start this (empty) cache as a copy of `donor`'s first n positions: its K/V, tokens, prefix hashes and
        (with `hidden`) hidden rows. A copy, not shared storage: each session truncates and grows its own."""
        if len(self.tokens):
            raise ValueError("only an empty cache adopts another session's prefix")
        self._cache_ops.copy_prefix(self.cache, donor.cache, n)
        self.tokens = list(donor.tokens[:n])
        self.anchor = donor.anchor
        if donor.hashes is not None and len(donor.hashes) == len(donor.tokens):
            self.hashes = donor.hashes.copy()
            self.hashes.truncate(n)
        if hidden and donor.hidden is not None:
            self.append_hidden(donor.hidden[:n])

    def extend_tokens(self, ids: Sequence[int], hashes: PrefixHashes | None) -> None:
        """After a forward over ids[len(tokens):]: cover `ids` (hashes kept in step when given)."""
        kept = len(self.tokens)
        self.tokens.extend(ids[kept:])
        if hashes is None or len(hashes) < len(ids):
            self.hashes = None
        elif self.hashes is None or len(self.hashes) != kept:
            self.hashes = hashes.copy()
            self.hashes.truncate(len(ids))
        else:
            self.hashes.extend_from(hashes, len(ids))

    def append_hidden(self, rows: torch.Tensor) -> None:  # rows: [n, H]
        """Append hidden rows after those kept (in the kept rows' dtype; a fresh session: the rows').

        `hidden` is a prefix view of a buffer that doubles when full, so a session that grows
        by a few rows per round costs O(new rows), not a copy of its whole history every round.
        Views handed out earlier may see later rows overwritten after a truncate: copy what
        must outlive the next call.
        """
        held = 0 if self.hidden is None else self.hidden.shape[0]
        need = held + rows.shape[0]
        store = self._hidden_store
        aliased = store is not None and self.hidden is not None and self.hidden.data_ptr() == store.data_ptr()
        if not aliased or store.shape[0] < need or (held and store.dtype != self.hidden.dtype):
            like = rows if self.hidden is None else self.hidden
            store = torch.empty(
                (max(need, 2 * held, HIDDEN_MIN_ROWS), rows.shape[1]), dtype=like.dtype, device=like.device
            )
            if held:
                store[:held] = self.hidden
        store[held:need] = rows
        self._hidden_store, self.hidden = store, store[:need]


@dataclass
class CacheCounters:
    """What the pool did; exported as metrics and in responses."""

    hits: int = 0  # calls that reused >= 1 cached token
    misses: int = 0  # calls that found nothing to reuse
    rollbacks: int = 0  # calls that dropped cached tokens
    rolled_back_tokens: int = 0
    evictions: int = 0
    evicted_tokens: int = 0  # positions those evictions dropped
    # Evictions that cost work: a call of a session evicted earlier, which prefills it again (vLLM counts
    # the like as preemptions); an evicted session that never comes back (a finished one) costs nothing.
    reprefills: int = 0
    reprefill_tokens: int = 0  # positions those sessions held when they were evicted
    computed_tokens: int = 0
    reused_tokens: int = 0  # tokens served from the cache (including those copied from another session)
    # Prefix sharing: a session's first call starts from another session's cached prefix (the same system
    # prompt, the conversation an OpenAI client resends) instead of computing it (vLLM's prefix caching).
    prefix_hits: int = 0
    prefix_shared_tokens: int = 0


@dataclass(frozen=True)
class IdleRule:
    """Sessions unused for `seconds` hold at most `tokens` positions in all (KVCachePool's `idle`)."""

    tokens: int
    seconds: float


class KVCachePool:
    """Session id -> SessionKV, least recently used evicted first to stay within a byte budget.

    Args:
        budget_bytes: the most KV bytes held over all sessions.
        bytes_per_token: KV bytes of one cached position (2 * layers * kv_heads * head_dim * dtype size).
        model_config: passed to DynamicCache so it builds the right layer types (torch caches).
        ops: the runner's cache handles (default: torch DynamicCaches for `model_config`).
        idle: the idle rule (None: none), for runners where held sessions slow every pass (llama.cpp's unified
            cache, whose attention spans every used cell): sessions unused for idle.seconds are evicted, least
            recently used first, while they hold more than idle.tokens positions.
    """

    def __init__(
        self,
        budget_bytes: int,
        bytes_per_token: int,
        model_config: Any = None,
        share_min_tokens: int = 0,
        ops: CacheOps | None = None,
        idle: IdleRule | None = None,
    ) -> None:
        self.ops: CacheOps = ops if ops is not None else torch_cache_ops(model_config)
        self.idle = idle
        self.budget_bytes = budget_bytes
        self.bytes_per_token = max(1, bytes_per_token)
        self.share_min_tokens = share_min_tokens  # prefix sharing (`share_prefix`): the shortest worth a copy; 0 = off
        self._sessions: OrderedDict[str, SessionKV] = OrderedDict()
        self._evicted: OrderedDict[str, int] = OrderedDict()  # evicted session -> positions it held
        self._epoch = 0  # bumped whenever a session enters or leaves the pool
        self._shared_memo: dict[tuple[str, int, int], int] = {}  # `uncached`'s sharer lookups, this epoch
        self._lock = threading.Lock()
        self.counters = CacheCounters()

    @property
    def max_tokens(self) -> int:
        """The most positions the budget can hold."""
        return self.budget_bytes // self.bytes_per_token

    def used_bytes(self) -> int:
        """Bytes currently held (logical: cached positions x bytes per position)."""
        with self._lock:
            return sum(len(s) for s in self._sessions.values()) * self.bytes_per_token

    def session_count(self) -> int:
        with self._lock:
            return len(self._sessions)

    def uncached(
        self, session_id: str, ids: Sequence[int], hashes: PrefixHashes | None = None, lent: bool = True
    ) -> int:
        """How many of `ids` lie past the longest common prefix with the session's cached tokens (`hashes`: see
        SessionKV.common_prefix), for a session without a cache past what another would lend it (share_prefix);
        `lent=False`: all of them, as its forward writes them all (what decides running a call inline: such a copy
        takes 0.1 s at 6,700 tokens on a 2-core CPU, as long as a forward). Read-only: the session keeps its place."""
        with self._lock:
            kv = self._sessions.get(session_id)
            if kv is not None and len(kv):
                return len(ids) - kv.common_prefix(ids, hashes)
            if self.share_min_tokens <= 0 or not lent:
                return len(ids)
            # A queued prompt's work is asked several times a pass: its sharer is looked up once while the
            # pool holds the same sessions (an estimate: the sharers' own rounds may move it a little).
            key = (session_id, len(ids), self._epoch)
            if key not in self._shared_memo:
                if len(self._shared_memo) >= SHARED_MEMO_MAX:
                    self._shared_memo.clear()
                self._shared_memo[key] = self._donor(session_id, ids, len(ids) - 1, False, hashes)[1]
            return len(ids) - self._shared_memo[key]

    def share_prefix(
        self,
        session_id: str,
        kv: SessionKV,
        ids: Sequence[int],
        limit: int,
        hidden: bool,
        hashes: PrefixHashes | None = None,
    ) -> int:
        """Prefix sharing: start the session's empty cache `kv` from the longest prefix of `ids` (at most `limit`
        positions) that another session holds, copied; returns the positions it now holds (0: none, or fewer
        than share_min_tokens shared). `hidden`: the copy must carry hidden rows too (donors without skip).
        Call it inside a forward (CausalLMRunner._plan): forwards never run two at once (ModelWorker)."""
        with self._lock:
            donor, shared = self._donor(session_id, ids, limit, hidden, hashes)
        if donor is None:
            return 0
        # Copied outside the lock (a long prefix takes milliseconds; `uncached` on the event loop must not wait):
        # caches change only inside the runner's forwards, which never run two at once, and this is one of them,
        # so the donor stays as found (an eviction meanwhile only drops it from the pool).
        kv.adopt_prefix(donor, shared, hidden)
        self.counters.prefix_hits += 1
        self.counters.prefix_shared_tokens += shared
        return shared

    def _donor(
        self, session_id: str, ids: Sequence[int], limit: int, hidden: bool, hashes: PrefixHashes | None = None
    ) -> tuple[SessionKV | None, int]:
        """(the session sharing the longest prefix of ids[:limit], that length), most recently used first among
        equals; (None, 0) below share_min_tokens. With `hashes` (prefix hashes of ids) O(log n) hash compares
        per session that keeps its own in step, else token lists compared at C speed; a session that shares not
        even the first token costs one compare."""
        best, best_len = None, 0
        if self.share_min_tokens <= 0 or limit < self.share_min_tokens or not ids:
            return best, best_len
        head = ids[:limit]
        for other_id in reversed(self._sessions):
            other = self._sessions[other_id]
            if other_id == session_id or other.anchor >= 0 or not other.tokens or other.tokens[0] != ids[0]:
                continue
            if hidden and (other.hidden is None or other.hidden.shape[0] < len(other.tokens)):
                continue
            shared = other.common_prefix(head, hashes)
            if shared > best_len:
                best, best_len = other, shared
                if shared == limit:
                    break
        return (best, best_len) if best_len >= self.share_min_tokens else (None, 0)

    def acquire(self, session_id: str, total_tokens: int) -> SessionKV:
        """The session's cache (new if absent), after making room for total_tokens positions."""
        if total_tokens > self.max_tokens:
            raise ResourceExhausted(
                f"session {session_id!r} needs {total_tokens} cached tokens "
                f"({total_tokens * self.bytes_per_token} bytes), over the cache budget of "
                f"{self.budget_bytes} bytes ({self.max_tokens} tokens)"
            )
        with self._lock:
            now = time.monotonic()
            kv = self._sessions.pop(session_id, None)
            self._evict_idle(now)
            if kv is None:
                self._count_return(session_id)
                self._make_room(total_tokens, new_session=True)
                kv = SessionKV(cache=self.ops.new(), ops=self.ops)
                self._new_epoch()
            else:
                self._make_room(total_tokens)
            kv.reserved, kv.used_at = total_tokens, now
            self._sessions[session_id] = kv
            return kv

    def _evict_idle(self, now: float) -> None:
        """The idle rule: evict sessions unused for idle.seconds, least recently used first, while those hold more
        than idle.tokens positions."""
        if self.idle is None:
            return
        idle = []  # sessions are kept in the order of their last acquire, so the idle ones lead
        for sid, kv in self._sessions.items():
            if now - kv.used_at < self.idle.seconds:
                break
            idle.append(sid)
        held = sum(self._sessions[sid].held() for sid in idle)
        for sid in idle:
            if held <= self.idle.tokens:
                break
            held -= self._evict(sid)

    def _make_room(self, needed_tokens: int, new_session: bool = False) -> None:
        """Evict least recently used sessions until the others plus `needed_tokens` fit the budget (and, for a
        `new_session`, until a handle is free where the runner holds at most `ops.capacity` sessions)."""
        held = sum(s.held() for s in self._sessions.values())  # the acquiring session is not among them
        capacity = self.ops.capacity
        while self._sessions and (
            (held + needed_tokens) > self.max_tokens or (new_session and capacity and len(self._sessions) >= capacity)
        ):
            held -= self._evict(next(iter(self._sessions)))

    def _evict(self, session_id: str) -> int:
        """Drop a session's cache, remembered as evicted (a return counts as a re-prefill); the positions it held."""
        victim = self._sessions.pop(session_id)
        self.ops.drop(victim.cache)
        self._new_epoch()
        self.counters.evictions += 1
        self.counters.evicted_tokens += len(victim)
        self._evicted[session_id] = len(victim)
        if len(self._evicted) > EVICTED_IDS_KEPT:
            self._evicted.popitem(last=False)
        return victim.held()

    def _count_return(self, session_id: str) -> None:
        """A session comes back after its eviction: it prefills again (counted as a re-prefill)."""
        held = self._evicted.pop(session_id, None)
        if held is not None:
            self.counters.reprefills += 1
            self.counters.reprefill_tokens += held

    def release(self, session_id: str) -> bool:
        """Drop a session's cache; True when there was one."""
        with self._lock:
            self._evicted.pop(session_id, None)
            self._new_epoch()
            kv = self._sessions.pop(session_id, None)
            if kv is not None:
                self.ops.drop(kv.cache)
            return kv is not None

    def holds(self, session_id: str, kv: SessionKV) -> bool:
        """Whether `kv` is still the session's cache in the pool (not evicted or released since acquired)."""
        with self._lock:
            return self._sessions.get(session_id) is kv

    def clear(self) -> None:
        with self._lock:
            for kv in self._sessions.values():
                self.ops.drop(kv.cache)
            self._sessions.clear()
            self._evicted.clear()
            self._new_epoch()

    def _new_epoch(self) -> None:
        """The pool's sessions changed: `uncached`'s sharer lookups are stale."""
        self._epoch += 1
        self._shared_memo.clear()


def kv_bytes_per_token(model_config: Any, dtype_bytes: int) -> int:
    """KV bytes of one cached position for a decoder-only transformer config."""
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return 2 * text.num_hidden_layers * kv_heads * head_dim * dtype_bytes
