"""Runs engine calls off the event loop: one model thread, one lock per session.

Model forwards run on a single worker thread (torch uses its own intra-op
threads; two forwards at once on the same cores only thrash). A per-session
asyncio lock guarantees two callers never interleave on one session's cache.
The worker remembers whether its last forward failed, so health can say so.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, TypeVar

from specdec.errors import SpecDecError

T = TypeVar("T")
MS_PER_S = 1000.0


@dataclass
class WorkerState:
    """What health reports from: in-flight calls and the last failure."""

    in_flight: int = 0
    calls: int = 0
    failures: int = 0
    last_error: str = ""
    last_ok: bool = True


class ModelWorker:
    """Serialises model work and per-session access."""

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{name}-model")
        self._locks: dict[str, asyncio.Lock] = {}
        self._waiters: dict[str, int] = {}
        self.state = WorkerState()

    async def run(self, session_id: str, fn: Callable[[], T]) -> tuple[T, float]:
        """Run fn on the model thread holding the session's lock; returns (result, queue_ms)."""
        queued = time.perf_counter()
        lock = self._locks.setdefault(session_id, asyncio.Lock())
        self._waiters[session_id] = self._waiters.get(session_id, 0) + 1
        self.state.in_flight += 1
        try:
            async with lock:
                loop = asyncio.get_running_loop()
                queue_ms = (time.perf_counter() - queued) * MS_PER_S
                result = await loop.run_in_executor(self._executor, self._call, fn)
                return result, queue_ms
        finally:
            self.state.in_flight -= 1
            self._waiters[session_id] -= 1
            if self._waiters[session_id] == 0:
                del self._waiters[session_id]
                self._locks.pop(session_id, None)

    def _call(self, fn: Callable[[], T]) -> T:
        self.state.calls += 1
        try:
            result = fn()
        except SpecDecError:
            raise  # the request was wrong, not the worker
        except Exception as exc:
            self.state.failures += 1
            self.state.last_ok = False
            self.state.last_error = f"{type(exc).__name__}: {exc}"
            raise
        self.state.last_ok = True
        return result

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
