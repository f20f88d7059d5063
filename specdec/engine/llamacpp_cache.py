"""The llama.cpp runner's per-session cache handle: a sequence id of one llama.cpp context.

All sessions share the context's unified KV cache (as llama.cpp's `parallel` example and its server with
--kv-unified do): a session is a sequence id, a rollback removes the sequence's positions from n on, and
prefix sharing copies the donor's cell membership (no K/V data moves). llama.cpp's memory must not change
while a `llama_decode` runs, and the shared bookkeeping (specdec/engine/kvcache.py) drops caches from the
event loop too (a Release), so every edit is queued here and
applied, in order, by the runner right before its next decode, on the thread that decodes.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ALL = -1  # llama.cpp's "to the end" position


@dataclass(eq=False)
class SeqCache:
    """One session's sequence id; `alive` until dropped (its id may then serve another session)."""

    seq_id: int
    alive: bool = True


class LlamaCacheOps:
    """Sequence ids of one llama.cpp context as the sessions' cache handles (kvcache.CacheOps).

    Args:
        capacity: the context's n_seq_max: the most sessions held at once (the pool evicts beyond it).
        seq_rm: llama_memory_seq_rm(seq, p0, p1) of the context's memory.
        seq_cp: llama_memory_seq_cp(src, dst, p0, p1) of the context's memory.
    """

    def __init__(
        self, capacity: int, seq_rm: Callable[[int, int, int], Any], seq_cp: Callable[[int, int, int, int], Any]
    ) -> None:
        self.capacity = capacity
        self._seq_rm, self._seq_cp = seq_rm, seq_cp
        self._free: deque[int] = deque(range(capacity))
        self._edits: list[tuple[str, tuple[int, ...]]] = []
        self._lock = threading.Lock()

    def new(self) -> SeqCache:
        with self._lock:
            if not self._free:  # the pool evicts before it asks beyond capacity
                raise RuntimeError(f"all {self.capacity} llama.cpp sequences are in use")
            return SeqCache(self._free.popleft())

    def truncate(self, cache: SeqCache, n: int) -> None:
        self._queue(cache, "rm", (cache.seq_id, n, ALL))

    def copy_prefix(self, cache: SeqCache, donor: SeqCache, n: int) -> None:
        self._queue(cache, "cp", (donor.seq_id, cache.seq_id, 0, n))

    def drop(self, cache: SeqCache) -> None:
        """Forget the session: its positions are removed (at the next flush) and its id freed after them."""
        with self._lock:
            if not cache.alive:
                return
            cache.alive = False
            self._edits.append(("rm", (cache.seq_id, 0, ALL)))
            self._free.append(cache.seq_id)  # handed out again only behind this removal in the queue

    def _queue(self, cache: SeqCache, kind: str, args: tuple[int, ...]) -> None:
        with self._lock:
            if cache.alive:
                self._edits.append((kind, args))

    def flush(self) -> None:
        """Apply the queued edits in order (the runner's thread, between decodes)."""
        with self._lock:
            edits, self._edits = self._edits, []
        for kind, args in edits:
            if kind == "rm":
                self._seq_rm(*args)
            else:
                self._seq_cp(*args)

    def pending(self) -> int:
        with self._lock:
            return len(self._edits)
