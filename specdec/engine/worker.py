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
import contextlib
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Generic, TypeVar

from specdec.config import Limits
from specdec.errors import ResourceExhausted, SpecDecError

T = TypeVar("T")
I = TypeVar("I")
MS_PER_S = 1000.0
#: weight of the newest pass in WorkerState.recent_fill (~ the last 1 / FILL_WEIGHT passes count).
FILL_WEIGHT = 0.1
#: a call computing more tokens than the largest verify (k = Limits.max_k, plus the bonus row) is a prefill.
PREFILL_MIN_TOKENS = Limits.max_k + 2
#: a new prefill is refused (RESOURCE_EXHAUSTED) when the work queued ahead of it, and its own, would take more
#: than this share of the time its caller still waits (its gRPC deadline): shed at the door, not time out
#: inside. 1: only calls the estimate says cannot finish in time (0.5 refused a second stream at a time
#: on the loaded development machine).
ADMIT_DEADLINE_SHARE = 1.0
#: the fewest tokens a long prefill's turn computes while other sessions decode (BatchQueue.turn_tokens).
MIN_TURN_TOKENS = 32


@dataclass
class WorkerState:
    """What health reports from: in-flight calls and the last failure."""

    in_flight: int = 0
    calls: int = 0
    failures: int = 0
    last_error: str = ""
    last_ok: bool = True
    busy_since: float = 0.0          # time.monotonic() when the running call started (0 = idle)
    batches: int = 0                 # batched forward passes (BatchQueue)
    inline_calls: int = 0            # calls run on the event loop (small, model thread idle)
    batched_calls: int = 0           # calls those carried
    prefill_chunks: int = 0          # chunked-prefill passes (BatchQueue with chunk_tokens)
    max_batch: int = 0               # the BatchQueue's max_batch (0: no batch queue)
    batch_sizes: dict[int, int] = field(default_factory=dict)   # sessions per forward pass -> passes
    recent_fill: float = 0.0         # sessions per pass / max_batch, exponentially weighted over recent passes
    # Where the model thread's time goes (bench-concurrency's split): model work of every call, the part of
    # it in passes that prefilled (a prompt or a chunk of one), and the time a BatchQueue held calls back
    # waiting for the previous batch's sessions (max_wait_s) while the model had nothing else to run.
    busy_ms: float = 0.0
    prefill_ms: float = 0.0
    batch_wait_ms: float = 0.0
    shed_calls: int = 0              # prefills refused because the queued work would outlast their deadline

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

    def __init__(self, name: str, fault_file: str = "") -> None:
        self.fault_file = fault_file
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{name}-model")
        self._locks: dict[str, asyncio.Lock] = {}
        self._waiters: dict[str, int] = {}
        self._on_thread = 0  # calls submitted to the model thread and not yet back
        self.state = WorkerState()

    async def run(self, session_id: str, fn: Callable[[], T], small: Callable[[], bool] | None = None
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
        if inline and self._on_thread == 0:
            self.state.inline_calls += 1
            return self._call(fn)
        self._on_thread += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, self._call, fn)
        finally:
            self._on_thread -= 1

    def model_thread_idle(self) -> bool:
        """Whether no call is on the model thread (a small call would run inline now)."""
        return self._on_thread == 0

    async def setup(self, fn: Callable[[], T]) -> T:
        """Run fn (loading the model) on the model thread, not counted as a call. torch work must stay on
        ONE thread: every thread that runs a multi-threaded torch op gets its own OpenMP team, and with
        more OpenMP threads than cores libgomp stops spinning between parallel regions, which made a
        2-thread decode step 22.5 -> 40 ms here (loading on another thread was enough to cause it)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def _call(self, fn: Callable[[], T]) -> T:
        self.state.calls += 1
        self.state.busy_since = time.monotonic()
        started = time.perf_counter()
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
            self.state.busy_ms += (time.perf_counter() - started) * MS_PER_S
        self.state.last_ok = True
        return result

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


Entry = tuple  # (session_id, item, future, time queued): one queued call of a BatchQueue


class BatchQueue(Generic[I, T]):
    """Coalesces concurrent calls of distinct sessions into one `batch_fn` call on the model thread.

    Continuous batching at round granularity: while one batch runs, new calls
    queue; the next batch takes all of them (at most max_batch). Each session
    holds its lock while queued, so a batch never holds one session twice.

    Sessions come back one network round trip after their batch finished, not
    all at the same instant; a batch that started with the first of them would
    split the group into a batch of one and a batch of the rest, and stay split.
    So when the previous batch held several sessions, the next one waits (at
    most max_wait_s) until those sessions are back. A lone session never waits.

    Args:
        worker: the model thread and per-session locks.
        batch_fn: items -> one result per item (a SpecDecError in an item's place fails that item).
        max_batch: the most calls in one batch (1 = no batching).
        max_wait_s: how long a batch may wait for the previous batch's sessions to come back.
        work_tokens: item -> tokens its forward computes; a batch of at most inline_max_tokens runs
            inline (ModelWorker.run_on_thread).
        prefill: (item, budget) -> tokens it still computes, after computing `budget` of them in a pass
            of its own. With `chunk_tokens` > 0, an item whose work exceeds chunk_tokens (a long
            prompt's prefill) advances one chunk per turn, and the other calls' batches run in between:
            chunked prefill, so a long prompt does not stall every running session for its whole prefill.
    """

    def __init__(self, worker: ModelWorker, batch_fn: Callable[[list[I]], list[T | Exception]],
                 max_batch: int, max_wait_s: float = 0.0, work_tokens: Callable[[I], int] | None = None,
                 inline_max_tokens: int = 0, prefill: Callable[[I, int], int] | None = None,
                 chunk_tokens: int = 0, prefill_turn_ms: float = 0.0) -> None:
        self.worker, self.batch_fn, self.max_batch = worker, batch_fn, max(1, max_batch)
        worker.state.max_batch = self.max_batch
        self.max_wait_s = max_wait_s
        self.work_tokens, self.inline_max_tokens = work_tokens, inline_max_tokens
        chunking = prefill is not None and work_tokens is not None and chunk_tokens > 0
        self.prefill, self.chunk_tokens = (prefill, chunk_tokens) if chunking else (None, 0)
        self._pending: deque[Entry] = deque()
        self._drainer: asyncio.Task | None = None
        self._arrived = asyncio.Event()
        self._last: set[str] = set()            # sessions of the previous batch
        self.ms_per_token = 0.0                 # model ms per token of recent batches that prefilled (0: not measured)
        self.chunk_ms_per_token = 0.0           # the same, of chunked-prefill turns (long contexts, small passes)
        self.prefill_turn_ms = prefill_turn_ms
        self._batch_ended = 0.0                 # time.perf_counter() when the last batch ended
        self._solo = False                      # a call waits one loop turn to run alone (_ran_alone)

    async def submit(self, session_id: str, item: I, deadline_s: float | None = None) -> tuple[T, float]:
        """Queue one session's call; returns (its result, queue_ms until its batch started).

        deadline_s: how long the caller still waits (None: no deadline). A prefill that the work queued
        ahead of it would keep waiting past ADMIT_DEADLINE_SHARE of that is refused at once with
        ResourceExhausted (load shedding: the client sees 429 and retries later, instead of every call
        in an overloaded queue running into its deadline). Decode rounds of running generations are
        never refused."""
        if deadline_s is not None:
            self._admit(item, deadline_s)
        async with self.worker.session_slot(session_id):
            future = asyncio.get_running_loop().create_future()
            entry = (session_id, item, future, time.perf_counter())
            if not await self._ran_alone(entry):
                self._pending.append(entry)
                self._arrived.set()
                if self._drainer is None or self._drainer.done():
                    self._drainer = asyncio.create_task(self._drain())
            return await future

    async def _ran_alone(self, entry: Entry) -> bool:
        """Run a call at once as a batch of one, inline on the event loop, when nothing could join it: the
        queue idle (nothing queued or running, no batch group to wait for) and still idle after one turn
        of the event loop (calls that arrived with it queue behind it and batch together), and a small
        forward with the model thread idle (ModelWorker.run_on_thread). Saves the queue's task, hand-over
        and wake-up (~0.1 ms a round on CPU). Returns whether it ran (its future is then done)."""
        if self._solo or not self._idle() or not self.worker.model_thread_idle() or not self._small_items([entry[1]]):
            return False                   # checked first: a call that cannot run alone pays no loop turn
        self._solo = True                  # calls arriving meanwhile queue (and take this one along)
        try:
            await asyncio.sleep(0)
        finally:
            self._solo = False
        if not self._idle() or not self.worker.model_thread_idle():
            return False
        await self._run_batch([entry], inline=True)   # never suspends
        return True

    def _idle(self) -> bool:
        """Nothing queued, no batch running, no batch group to wait for."""
        if self._pending or (self._drainer is not None and not self._drainer.done()):
            return False
        return self.max_wait_s <= 0 or len(self._last) <= 1

    def _admit(self, item: I, deadline_s: float) -> None:
        if self.work_tokens is None or self.ms_per_token <= 0:
            return
        own = self.work_tokens(item)
        if own < PREFILL_MIN_TOKENS:
            return
        wait_s = self.wait_ms(own) / MS_PER_S
        if wait_s > ADMIT_DEADLINE_SHARE * deadline_s:
            self.worker.state.shed_calls += 1
            raise ResourceExhausted(f"target overloaded: about {wait_s:.1f} s of queued work for a {own}-token "
                                    f"prefill and the call waits at most {deadline_s:.1f} s; retry later")

    def wait_ms(self, own: int) -> float:
        """About how long a new call computing `own` tokens takes to be done (an upper estimate), at the
        measured speeds: batches at ms_per_token, long prefills' turns at chunk_ms_per_token (a turn at a
        long context costs several times a short prompt's token; one speed for both refused short prompts).
        Without chunked prefill the queue runs first come: all the work queued ahead, then its own. With
        it, a call that fits a batch runs in the next batch, behind at most one turn of the oldest long
        prefill (decode first, see prefill_turn_ms): not behind the whole of the long ones; a long prefill
        takes its turns after the long ones queued before it (first come, first served among them)."""
        ahead = [self.work_tokens(entry[1]) for entry in self._pending]
        batch_ms, chunk_ms = self.ms_per_token, self.chunk_ms_per_token or self.ms_per_token
        if not self.chunk_tokens:
            return (own + sum(ahead)) * batch_ms
        fits = sum(work for work in ahead if work <= self.chunk_tokens)
        longs = [work for work in ahead if work > self.chunk_tokens]
        if own > self.chunk_tokens:
            return fits * batch_ms + (own + sum(longs)) * chunk_ms
        turn = min(min(longs), self.turn_tokens(others_decoding=True)) if longs else 0
        return (own + fits) * batch_ms + turn * chunk_ms

    @staticmethod
    def _pass_ms_per_token(tokens: int, elapsed_s: float) -> float:
        """Model ms per token of a pass that prefilled `tokens` tokens in `elapsed_s` (0 when it prefilled
        too few to say); the callers fold it into the speed of their kind of pass."""
        if tokens < PREFILL_MIN_TOKENS or elapsed_s <= 0:
            return 0.0
        return elapsed_s * MS_PER_S / tokens

    def turn_tokens(self, others_decoding: bool) -> int:
        """Tokens a long prefill computes in its next turn (see prefill_turn_ms)."""
        if not others_decoding or self.prefill_turn_ms <= 0 or self.chunk_ms_per_token <= 0:
            return self.chunk_tokens
        fit = int(self.prefill_turn_ms / self.chunk_ms_per_token)
        return min(self.chunk_tokens, max(MIN_TURN_TOKENS, fit))

    async def _drain(self) -> None:
        while self._pending:
            await self._wait_for_group()
            batch, long = self._split(self._take())
            if batch:
                await self._run_batch(batch)
            if long:
                long.sort(key=lambda entry: entry[3])   # the oldest long prefill takes the turn
                since_batch_ms = (time.perf_counter() - self._batch_ended) * MS_PER_S
                others_decoding = bool(batch) or since_batch_ms < self.prefill_turn_ms
                await self._prefill_one(long[0], self.turn_tokens(others_decoding))
                self._pending.extend(long)  # behind the calls that came meanwhile (max_batch 1 interleaves too)

    def _split(self, batch: list[Entry]) -> tuple[list[Entry], list[Entry]]:
        """(calls to run as one batch now, calls whose prefill is longer than a chunk)."""
        if not self.chunk_tokens:
            return batch, []
        long = [entry for entry in batch if self.work_tokens(entry[1]) > self.chunk_tokens]
        held = {id(entry) for entry in long}
        return [entry for entry in batch if id(entry) not in held], long

    async def _prefill_one(self, entry: Entry, tokens: int) -> None:
        """One chunk (`tokens` tokens) of a long prefill on the model thread; a failure fails that call alone."""
        _, item, future, _ = entry
        self.worker.state.prefill_chunks += 1
        started = time.perf_counter()
        try:
            await self.worker.run_on_thread(lambda: self.prefill(item, tokens))
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            if not future.done():
                future.set_exception(exc)
        finally:
            self.worker.state.prefill_ms += (time.perf_counter() - started) * MS_PER_S
            now = self._pass_ms_per_token(tokens, time.perf_counter() - started)
            if now:
                self.chunk_ms_per_token = ewma(self.chunk_ms_per_token, now)
                self.ms_per_token = self.ms_per_token or now   # no batch has prefilled yet: a first figure

    async def _run_batch(self, batch: list[Entry], inline: bool | None = None) -> None:
        """One batch_fn call on the model thread (or inline: None = as `_small_items` says); each caller gets
        its result."""
        self._last = {sid for sid, _, _, _ in batch}
        self.worker.state.observe_batch(len(batch), FILL_WEIGHT)
        prefill_tokens = self._prefill_tokens(batch)
        started = time.perf_counter()
        try:
            results = await self.worker.run_on_thread(lambda: self.batch_fn([item for _, item, _, _ in batch]),
                                                      self._small_items([e[1] for e in batch]) if inline is None
                                                      else inline)
        except Exception as exc:  # noqa: BLE001 - the whole forward failed: every caller gets it
            results = [exc] * len(batch)
        if prefill_tokens:
            self.worker.state.prefill_ms += (time.perf_counter() - started) * MS_PER_S
            now = self._pass_ms_per_token(prefill_tokens, time.perf_counter() - started)
            if now:
                self.ms_per_token = ewma(self.ms_per_token, now)
        self._batch_ended = time.perf_counter()
        for (_, _, future, queued), result in zip(batch, results):
            if future.done():
                continue  # the caller went away (cancelled)
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result((result, (started - queued) * MS_PER_S))

    async def _wait_for_group(self) -> None:
        """Wait (at most max_wait_s) until the previous batch's sessions are queued again."""
        if self.max_wait_s <= 0 or len(self._last) <= 1:
            return
        started = time.perf_counter()
        try:
            await self._wait_until(started + self.max_wait_s)
        finally:
            self.worker.state.batch_wait_ms += (time.perf_counter() - started) * MS_PER_S

    async def _wait_until(self, deadline: float) -> None:
        while len(self._pending) < self.max_batch and not self._last <= {e[0] for e in self._pending}:
            left = deadline - time.perf_counter()
            if left <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), timeout=left)
            except asyncio.TimeoutError:
                return

    def _prefill_tokens(self, batch: list[Entry]) -> int:
        """The batch's tokens when a call of it prefills (computes more tokens than any verify does), else 0."""
        if self.work_tokens is None:
            return 0
        work = [self.work_tokens(item) for _, item, _, _ in batch]
        return sum(work) if max(work, default=0) >= PREFILL_MIN_TOKENS else 0

    def _small_items(self, items: list[I]) -> bool:
        if self.work_tokens is None or self.inline_max_tokens <= 0:  # skip sizing what cannot run inline
            return False
        return fits_inline(sum(self.work_tokens(item) for item in items), self.inline_max_tokens)

    def _take(self) -> list[Entry]:
        batch = []
        while self._pending and len(batch) < self.max_batch:
            entry = self._pending.popleft()
            if not entry[2].done():
                batch.append(entry)
        return batch
