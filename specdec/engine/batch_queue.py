"""BatchQueue: continuous batching of Verify calls at round granularity, with chunked prefill, decode-first
turns and load shedding at the door. Runs its passes through a ModelWorker (specdec/engine/worker.py).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from specdec.engine.prefill_speed import PREFILL_MIN_TOKENS, PrefillSpeed
from specdec.engine.worker import FILL_WEIGHT, MS_PER_S, ModelWorker, fits_inline
from specdec.errors import ResourceExhausted

T = TypeVar("T")
ItemT = TypeVar("ItemT")
#: while shorter prompts and long ones (over a chunk) both wait for turns, a long one gets every this-many-th
#: turn (BatchQueue._next_turn).
LONG_TURN_EVERY = 3
#: when every forward runs on the event loop (ModelWorker.loop_forwards), the loop turns the queue yields
#: between passes so that calls that arrived during one reach the queue: a socket read, the handler's
#: first step up to `submit`, then the queue again.
IO_TURNS_BETWEEN_PASSES = 3


Entry = tuple  # (session_id, item, future, time queued): one queued call of a BatchQueue


class BatchQueue(Generic[ItemT, T]):
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
        work_tokens: item -> tokens its forward computes.
        inline_tokens: item -> positions its forward writes into its cache, computed or copied from another
            session's prefix (default: work_tokens); a batch of at most inline_max_tokens of them runs inline
            (ModelWorker.run_on_thread).
        prefill: (item, budget) -> tokens it still computes, after computing `budget` of them in a pass
            of its own. With `chunk_tokens` > 0, an item whose work exceeds chunk_tokens (a long
            prompt's prefill) advances one chunk per turn, and the other calls' batches run in between (or
            carry the turn, batch_turn):
            chunked prefill, so a long prompt does not stall every running session for its whole prefill.
            While other sessions decode, a prompt longer than the pass's prefill budget (pass_prefill_tokens)
            takes turns too, and the other prompts of a batch fill that budget (decode first).
        batch_turn: (items, a prefill's item, budget) -> (batch_fn(items), prefill(item, budget)) in ONE pass;
            when given (and batching), a turn rides in the decode rounds' batch instead of a pass of its own.
    """

    def __init__(
        self,
        worker: ModelWorker,
        batch_fn: Callable[[list[ItemT]], list[T | Exception]],
        max_batch: int,
        max_wait_s: float = 0.0,
        work_tokens: Callable[[ItemT], int] | None = None,
        inline_max_tokens: int = 0,
        prefill: Callable[[ItemT, int], int] | None = None,
        chunk_tokens: int = 0,
        prefill_turn_ms: float = 0.0,
        batch_turn: Callable[[list[ItemT], ItemT, int], tuple[list[T | Exception], int | Exception]] | None = None,
        inline_tokens: Callable[[ItemT], int] | None = None,
    ) -> None:
        self.worker, self.batch_fn, self.max_batch = worker, batch_fn, max(1, max_batch)
        worker.state.max_batch = self.max_batch
        self.max_wait_s = max_wait_s
        self.work_tokens, self.inline_max_tokens = work_tokens, inline_max_tokens
        self.inline_tokens = inline_tokens or work_tokens
        chunking = prefill is not None and work_tokens is not None and chunk_tokens > 0
        self.prefill = prefill if chunking else None
        self.speed = PrefillSpeed(chunk_tokens if chunking else 0, prefill_turn_ms)  # and what it buys
        self.batch_turn = batch_turn if chunking and self.max_batch > 1 else None
        self._pending: deque[Entry] = deque()
        self._drainer: asyncio.Task | None = None
        self._arrived = asyncio.Event()
        self._last: set[str] = set()  # sessions of the previous batch
        self._batch_ended = 0.0  # time.perf_counter() when the last batch ended
        self._solo = False  # a call waits one loop turn to run alone (_ran_alone)
        self._turns_since_long = 0  # turns shorter prompts took while a long one waited (_next_turn)

    @property
    def chunk_tokens(self) -> int:
        """Chunked prefill's chunk (0: off), as the speed model sizes turns with it."""
        return self.speed.chunk_tokens

    async def submit(self, session_id: str, item: ItemT, deadline_s: float | None = None) -> tuple[T, float]:
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
            return False  # checked first: a call that cannot run alone pays no loop turn
        self._solo = True  # calls arriving meanwhile queue (and take this one along)
        try:
            await asyncio.sleep(0)
        finally:
            self._solo = False
        if not self._idle() or not self.worker.model_thread_idle():
            return False
        await self._run_batch([entry], inline=True)  # never suspends
        return True

    def _idle(self) -> bool:
        """Nothing queued, no batch running, no batch group to wait for."""
        if self._pending or (self._drainer is not None and not self._drainer.done()):
            return False
        return self.max_wait_s <= 0 or len(self._last) <= 1

    def _work(self, item: ItemT) -> int:
        """The tokens `item` computes; asked only where work_tokens is set (admission, chunked prefill)."""
        assert self.work_tokens is not None, "work_tokens is set where the work is sized"
        return self.work_tokens(item)

    def _admit(self, item: ItemT, deadline_s: float) -> None:
        if self.work_tokens is None:
            return
        reason = self.speed.refusal(self.work_tokens(item), self._ahead(), deadline_s)
        if reason:
            self.worker.state.shed_calls += 1
            raise ResourceExhausted(reason)

    def _ahead(self) -> list[int]:
        """The tokens each queued call computes."""
        return [self._work(entry[1]) for entry in self._pending]

    def wait_ms(self, own: int) -> float:
        """About how long a new call computing `own` tokens would take to be done behind the queued calls."""
        return self.speed.wait_ms(own, self._ahead())

    async def _drain(self) -> None:
        while self._pending:
            await self._wait_for_group()
            taken = self._take()
            work = {id(entry): self._work(entry[1]) for entry in taken} if self.chunk_tokens else {}
            decoding = any(tokens < PREFILL_MIN_TOKENS for tokens in work.values())
            batch, takers = self._split(taken, work, decoding)
            others_decoding = decoding or bool(batch) or self._decoded_lately()
            turn = self._next_turn(takers, work, others_decoding) if takers else None
            if batch and turn and self.batch_turn is not None:
                await self._run_batch(batch, turn=turn)  # the turn rides in the decode rounds' pass
            else:
                if batch:
                    await self._run_batch(batch)
                if turn:
                    await self._prefill_one(*turn)
            self._pending.extend(takers)  # behind the calls that came meanwhile (max_batch 1 interleaves too)
            if self.worker.loop_forwards:
                for _ in range(IO_TURNS_BETWEEN_PASSES):  # the pass held the loop: let the calls it held up in
                    await asyncio.sleep(0)

    def _next_turn(self, waiting: list[Entry], work: dict[int, int], others_decoding: bool) -> tuple[Entry, int, bool]:
        """(whose turn it is among the prefills that take turns, its tokens, whether it is a long prompt's). The
        oldest shorter prompt (at most a chunk), except that the oldest long one gets every LONG_TURN_EVERY-th
        turn while both kinds wait. First come first served across both would hold a 300-token prompt behind
        every turn of the 6,000-token prompts ahead of it (past its deadline); shorter ones always first would
        starve the long ones under a steady stream of prompts. A long prompt's turn is sized at the speed of
        such turns (long contexts), a shorter one's is the pass's prefill budget at the batches' speed."""
        waiting.sort(key=lambda entry: entry[3])
        longs = [entry for entry in waiting if work[id(entry)] > self.chunk_tokens]
        shorter = [entry for entry in waiting if work[id(entry)] <= self.chunk_tokens]
        if longs and shorter:
            self._turns_since_long += 1
            if self._turns_since_long >= LONG_TURN_EVERY:
                self._turns_since_long = 0
                shorter = []
        if shorter:
            return shorter[0], self.speed.pass_prefill_tokens(others_decoding), False
        return longs[0], self.speed.turn_tokens(others_decoding), True

    def _decoded_lately(self) -> bool:
        """Whether a batch ended less than prefill_turn_ms ago (its sessions are likely decoding)."""
        return (time.perf_counter() - self._batch_ended) * MS_PER_S < self.speed.prefill_turn_ms

    def _split(self, batch: list[Entry], work: dict[int, int], decoding: bool) -> tuple[list[Entry], list[Entry]]:
        """(calls to run as one batch now, prefills that take turns); `work`: each call's tokens, by id(entry);
        `decoding`: a decode round is among them. A prefill takes turns when it is longer than a chunk or,
        while others decode, than the pass's prefill budget; the batch's other prefills fill that budget (at
        least one runs) and the rest go back to the front of the queue. Not "a batch ended lately": a prompt
        that arrives alone right after another generation ended is prefilled whole, as the same prompt is on an
        idle target (int8's row-invariant identity, tests/integration/test_quantized_speculative_identity.py)."""
        if not self.chunk_tokens:
            return batch, []
        budget = self.speed.pass_prefill_tokens(decoding)
        takers = [
            entry
            for entry in batch
            if work[id(entry)] > self.chunk_tokens or budget < work[id(entry)] >= PREFILL_MIN_TOKENS
        ]
        held = {id(entry) for entry in takers}
        now, later, used = [], [], 0
        for entry in batch:
            tokens = work[id(entry)] if work[id(entry)] >= PREFILL_MIN_TOKENS else 0
            if id(entry) in held:
                continue
            if tokens and used and used + tokens > budget:
                later.append(entry)
                continue
            used += tokens
            now.append(entry)
        self._pending.extendleft(reversed(later))
        return now, takers

    async def _prefill_one(self, entry: Entry, tokens: int, long_context: bool) -> None:
        """One chunk (`tokens` tokens) of a prefill on the model thread; a failure fails that call alone. Its
        speed is learned as the long prefills' turns' (long_context) or the batches'."""
        _, item, future, _ = entry
        prefill = self.prefill
        assert prefill is not None, "turns are taken only with chunked prefill on"
        self.worker.state.prefill_chunks += 1
        started = time.perf_counter()
        try:
            await self.worker.run_on_thread(lambda: prefill(item, tokens))
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            if not future.done():
                future.set_exception(exc)
        finally:
            self.worker.state.prefill_ms += (time.perf_counter() - started) * MS_PER_S
            self.speed.learn(tokens, time.perf_counter() - started, long_context)

    async def _run_batch(
        self, batch: list[Entry], inline: bool | None = None, turn: tuple[Entry, int, bool] | None = None
    ) -> None:
        """One batch_fn call on the model thread (or inline: None = as `_small_items` says); each caller gets
        its result. With `turn` (entry, tokens, long_context), batch_turn runs that prefill's turn in the same
        pass (a failed turn fails its own call alone)."""
        prefill_tokens = self._begin_pass(batch) + (turn[1] if turn else 0)
        items = [item for _, item, _, _ in batch]
        started = time.perf_counter()
        try:
            if turn:
                batch_turn = self.batch_turn
                assert batch_turn is not None, "a turn rides in a batch only with batch_turn set"
                self.worker.state.prefill_chunks += 1
                results, left = await self.worker.run_on_thread(lambda: batch_turn(items, turn[0][1], turn[1]))
                self._fail_turn(turn[0], left)
            else:
                results = await self.worker.run_on_thread(
                    lambda: self.batch_fn(items), self._small_items(items) if inline is None else inline
                )
        except Exception as exc:  # noqa: BLE001 - the whole forward failed: every caller gets it
            results = [exc] * len(batch)
            if turn:
                self._fail_turn(turn[0], exc)
        self._end_pass(prefill_tokens, started, turn is not None and turn[2])
        for (_, _, future, queued), result in zip(batch, results, strict=False):
            if future.done():
                continue  # the caller went away (cancelled)
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result((result, (started - queued) * MS_PER_S))

    def _begin_pass(self, batch: list[Entry]) -> int:
        """Count a pass of `batch` (its sessions are the group the next batch waits for); returns the tokens it
        prefills (0: a pass of decode rounds)."""
        self._last = {entry[0] for entry in batch}
        self.worker.state.observe_batch(len(batch), FILL_WEIGHT)
        return self._prefill_tokens(batch)

    def _end_pass(self, prefill_tokens: int, started: float, long_context: bool) -> None:
        """After a pass that began at `started` (time.perf_counter()): its prefill speed, when it prefilled."""
        self._batch_ended = time.perf_counter()
        if prefill_tokens:
            self.worker.state.prefill_ms += (self._batch_ended - started) * MS_PER_S
            self.speed.learn(prefill_tokens, self._batch_ended - started, long_context)

    def run_now(self, session_id: str, item: ItemT) -> T | None:
        """A lone session's small call, run at once on the event loop: no session lock, future or loop turn.
        Lone: no call in flight or queued, the model thread idle and the last pass held this session alone (or
        none), so no other session's call can join it (a second session shows as a call in flight or in the last
        pass, and its calls go through `submit`, which batches). Small: a forward `submit` would run inline
        anyway (`_small_items`). What `submit` does for it, less the machinery a lone session never uses, which
        on a CPU is cold Python after every forward (docs/performance.md, "Where the per-round overhead goes").
        Returns its result (its error is raised), or None when the call is not such a call (submit it).
        """
        if not (self.lone(session_id) and self._small_items([item])):
            return None
        started = time.perf_counter()
        prefill_tokens = self._begin_pass([(session_id, item, None, started)])
        try:
            result = self.worker.call_now(lambda: self.batch_fn([item]))[0]
        finally:
            self._end_pass(prefill_tokens, started, False)
        if isinstance(result, Exception):
            raise result
        return result

    def lone(self, session_id: str) -> bool:
        """No call in flight or queued, the model thread idle, and the last pass held this session alone (or none)."""
        return not self._solo and self.worker.idle_now() and self._idle() and self._last <= {session_id}

    @staticmethod
    def _fail_turn(entry: Entry, left: object) -> None:
        """A turn's outcome: tokens left (the call queues on), or an error for that call alone."""
        future = entry[2]
        if isinstance(left, Exception) and not future.done():
            future.set_exception(left)

    async def _wait_for_group(self) -> None:
        """Wait (at most max_wait_s) until the previous batch's sessions are queued again: a group of them, or
        a lone one while a prefill would take turns (its turn then rides in that session's pass, batch_turn, or
        runs beside it)."""
        if self.max_wait_s <= 0 or not self._last or (len(self._last) == 1 and not self._turn_pending()):
            return
        started = time.perf_counter()
        try:
            await self._wait_until(started + self.max_wait_s)
        finally:
            self.worker.state.batch_wait_ms += (time.perf_counter() - started) * MS_PER_S

    def _turn_pending(self) -> bool:
        """Whether a queued prefill would take turns if a decode round came along (then the queue waits for
        the lone decoder: taken alone, the prompt would be prefilled whole and hold that session for it)."""
        if not self.chunk_tokens:
            return False
        budget = self.speed.pass_prefill_tokens(others_decoding=True)
        return any(self._work(entry[1]) > budget for entry in self._pending)

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

    def _small_items(self, items: list[ItemT]) -> bool:
        if self.inline_tokens is None or self.inline_max_tokens <= 0:  # skip sizing what cannot run inline
            return False
        return fits_inline(sum(self.inline_tokens(item) for item in items), self.inline_max_tokens)

    def _take(self) -> list[Entry]:
        batch: list[Entry] = []
        while self._pending and len(batch) < self.max_batch:
            entry = self._pending.popleft()
            if not entry[2].done():
                batch.append(entry)
        return batch
