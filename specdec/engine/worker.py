"""Runs engine calls off the event loop: one model thread, one lock per session.

Model forwards run on a single worker thread (torch uses its own intra-op
threads; two forwards at once on the same cores only thrash), small ones on the
event loop itself, or every one there once `use_the_loop` was called (a CPU model
with more than one torch thread: one OpenMP team, no hand-offs). A per-session
asyncio lock guarantees two callers never interleave on one session's cache.
The worker remembers whether its last forward failed and since when the
current one runs, so health can say so (specdec/server/model_service.py).

The reliability tests' fault injection wraps `call` (specdec/engine/faults.py), installed only where configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from specdec.errors import SpecDecError

T = TypeVar("T")
MS_PER_S = 1000.0
#: weight of the newest pass in WorkerState.recent_fill (~ the last 1 / FILL_WEIGHT passes count).
FILL_WEIGHT = 0.1


@dataclass
class WorkerState:
    """What health reports from: in-flight calls and the last failure."""

    in_flight: int = 0
    calls: int = 0
    failures: int = 0
    last_error: str = ""
    last_ok: bool = True
    busy_since: float = 0.0  # time.monotonic() when the running call started (0 = idle)
    batches: int = 0  # batched forward passes (BatchQueue)
    inline_calls: int = 0  # calls run on the event loop (small with the model thread idle, or all)
    forwards_on_loop: bool = False  # every call runs on the event loop, no model thread (ModelWorker.use_the_loop)
    batched_calls: int = 0  # calls those carried
    prefill_chunks: int = 0  # chunked-prefill passes (BatchQueue with chunk_tokens)
    max_batch: int = 0  # the BatchQueue's max_batch (0: no batch queue)
    batch_sizes: dict[int, int] = field(default_factory=dict)  # sessions per forward pass -> passes
    recent_fill: float = 0.0  # sessions per pass / max_batch, exponentially weighted over recent passes
    # Where the model thread's time goes (bench-concurrency's split): model work of every call, the part of
    # it in passes that prefilled (a prompt or a chunk of one), and the time a BatchQueue held calls back
    # waiting for the previous batch's sessions (max_wait_s) while the model had nothing else to run.
    busy_ms: float = 0.0
    prefill_ms: float = 0.0
    batch_wait_ms: float = 0.0
    shed_calls: int = 0  # prefills refused because the queued work would outlast their deadline

    def observe_batch(self, size: int, weight: float) -> None:
        """Count one batched pass of `size` sessions; `weight` of it goes into recent_fill (0 < weight <= 1)."""
        self.batches += 1
        self.batched_calls += size
        self.batch_sizes[size] = self.batch_sizes.get(size, 0) + 1
        if self.max_batch:
            self.recent_fill += weight * (size / self.max_batch - self.recent_fill)

    def busy_for(self) -> float:
        """Seconds the current call has been running (0 when idle)."""
        return time.monotonic() - self.busy_since if self.busy_since else 0.0


def ewma(mean: float, now: float) -> float:
    """`now` folded into an exponentially weighted `mean` (FILL_WEIGHT; a mean of 0 is unset: `now`)."""
    return now if mean <= 0 else mean + FILL_WEIGHT * (now - mean)


def fits_inline(work_tokens: int | None, limit: int) -> bool:
    """The one rule for running a call on the event loop: its forward's tokens are known and at most
    `limit` (0 = never inline). See ModelWorker.run_on_thread."""
    return limit > 0 and work_tokens is not None and work_tokens <= limit


class ModelWorker:
    """Serialises model work and per-session access."""

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{name}-model")
        self._locks: dict[str, asyncio.Lock] = {}
        self._waiters: dict[str, int] = {}
        self._on_thread = 0  # calls submitted to the model thread and not yet back
        self.state = WorkerState()

    async def run(
        self, session_id: str, fn: Callable[[], T], small: Callable[[], bool] | None = None
    ) -> tuple[T, float]:
        """Run fn on the model thread holding the session's lock (inline when `small()` says so, see
        run_on_thread; asked once the lock is held); returns (result, queue_ms)."""
        queued = time.perf_counter()
        async with self.session_slot(session_id):
            queue_ms = (time.perf_counter() - queued) * MS_PER_S
            return await self.run_on_thread(fn, small is not None and small()), queue_ms

    @contextlib.asynccontextmanager
    async def session_slot(self, session_id: str) -> AsyncIterator[None]:
        """Hold the session's lock (one call per session at a time) and count the call in flight."""
        lock = self._locks.setdefault(session_id, asyncio.Lock())
        self._waiters[session_id] = self._waiters.get(session_id, 0) + 1
        self.state.in_flight += 1
        try:
            async with lock:
                yield
        finally:
            self.state.in_flight -= 1
            self._waiters[session_id] -= 1
            if self._waiters[session_id] == 0:
                del self._waiters[session_id]
                self._locks.pop(session_id, None)

    async def run_on_thread(self, fn: Callable[[], T], inline: bool = False) -> T:
        """Run fn on the model thread (no session lock: the caller holds what it needs).

        With `inline` (a small forward: a decode round) and nothing on the model thread, fn runs right
        here on the event loop instead: it saves handing the call to the model thread and the result
        back (two thread wake-ups, ~0.35 ms a round on the 2-core VM) and blocks the loop no longer than
        the forward would have made the caller wait. Never while a call is on the model thread: two
        forwards never run at once."""
        if self.loop_forwards or (inline and self._on_thread == 0):
            self.state.inline_calls += 1
            return self.call(fn)
        self._on_thread += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, self.call, fn)
        finally:
            self._on_thread -= 1

    def idle_now(self) -> bool:
        """No call in flight (none holds or waits for a session slot) and nothing on the model thread: a call run
        right now (call_now) can meet no other."""
        return self.state.in_flight == 0 and self._on_thread == 0

    def call_now(self, fn: Callable[[], T]) -> T:
        """Run fn right here on the event loop (a small call with the worker idle_now: BatchQueue.run_now,
        DraftServicer.propose_now), as run_on_thread runs an inline call."""
        self.state.inline_calls += 1
        return self.call(fn)

    def model_thread_idle(self) -> bool:
        """Whether no call is on the model thread (a small call would run inline now)."""
        return self._on_thread == 0

    async def setup(self, fn: Callable[[], T]) -> T:
        """Run fn (loading the model) on the model thread, not counted as a call. torch work must stay on
        ONE thread: every thread that runs a multi-threaded torch op gets its own OpenMP team, and with
        more OpenMP threads than cores libgomp stops spinning between parallel regions, which made a
        2-thread decode step 22.5 -> 40 ms here (loading on another thread was enough to cause it)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def use_the_loop(self) -> None:
        """From now on every call runs on the event loop's thread, none on the model thread (loaded there by
        `setup`), which exits here: with it goes its OpenMP team, so the loop's forwards are the only team
        (a second one, even idle, stops libgomp spinning: measured 26.1 ms a 2-thread decode step with the
        loading thread gone against 41.9 ms with it alive; specdec.engine.loading.forwards_on_loop)."""
        self.state.forwards_on_loop = True
        self._executor.shutdown(wait=True)

    @property
    def loop_forwards(self) -> bool:
        """Whether every call runs on the event loop's thread (use_the_loop)."""
        return self.state.forwards_on_loop

    def call(self, fn: Callable[[], T]) -> T:
        """Every piece of model work passes here: counted, timed, and a failure remembered for health."""
        self.state.calls += 1
        self.state.busy_since = time.monotonic()
        started = time.perf_counter()
        try:
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
            self.state.busy_ms += (time.perf_counter() - started) * MS_PER_S
        self.state.last_ok = True
        return result

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
