"""Runs engine calls off the event loop: one model thread, one lock per session.

Model forwards run on a single worker thread (torch uses its own intra-op
threads; two forwards at once on the same cores only thrash). A per-session
asyncio lock guarantees two callers never interleave on one session's cache.
The worker remembers whether its last forward failed and since when the
current one runs, so health can say so (specdec/server/model_service.py).

Chaos hook (off unless configured): while `fault_file` exists, every call
fails with RuntimeError before touching the model -- a real worker failure,
used by the reliability tests to drive health to NOT_SERVING and back.
"""

from __future__ import annotations

import asyncio
import os
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
    busy_since: float = 0.0          # time.monotonic() when the running call started (0 = idle)

    def busy_for(self) -> float:
        """Seconds the current call has been running (0 when idle)."""
        return time.monotonic() - self.busy_since if self.busy_since else 0.0


class ModelWorker:
    """Serialises model work and per-session access."""

    def __init__(self, name: str, fault_file: str = "") -> None:
        self.fault_file = fault_file
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
        self.state.busy_since = time.monotonic()
        try:
            if self.fault_file and os.path.exists(self.fault_file):
                raise RuntimeError(f"injected fault ({self.fault_file} exists)")
            result = fn()
        except SpecDecError:
            raise  # the request was wrong, not the worker
        except Exception as exc:
            self.state.failures += 1
            self.state.last_ok = False
            self.state.last_error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self.state.busy_since = 0.0
        self.state.last_ok = True
        return result

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
