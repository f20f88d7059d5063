"""BatchQueue: concurrent calls of distinct sessions run as one batch; no session twice in a batch."""

from __future__ import annotations

import asyncio
import time

import pytest

from specdec.engine.batch_queue import BatchQueue
from specdec.engine.worker import ModelWorker
from specdec.errors import InvalidArgument

STEP_S = 0.05


class Recorder:
    """A batch function that records its batches and takes STEP_S per batch."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[str, int]]] = []

    def __call__(self, items: list[tuple[str, int]]) -> list[object]:
        self.batches.append(list(items))
        time.sleep(STEP_S)
        return [InvalidArgument(f"bad {n}") if n < 0 else n * 10 for _, n in items]


def run(coro):
    return asyncio.run(coro)


def test_concurrent_calls_are_batched_and_each_gets_its_own_result():
    async def scenario():
        rec = Recorder()
        queue = BatchQueue(ModelWorker("t"), rec, max_batch=8)
        results = await asyncio.gather(*(queue.submit(f"s{i}", (f"s{i}", i)) for i in range(6)))
        return rec, queue, results

    rec, queue, results = run(scenario())
    assert [r for r, _ in results] == [i * 10 for i in range(6)]
    assert len(rec.batches) == 1 and len(rec.batches[0]) == 6
    assert (queue.worker.state.batches, queue.worker.state.batched_calls) == (1, 6)


def test_max_batch_caps_a_batch_and_a_lone_call_does_not_wait():
    async def scenario():
        rec = Recorder()
        queue = BatchQueue(ModelWorker("t"), rec, max_batch=4)
        await asyncio.gather(*(queue.submit(f"s{i}", (f"s{i}", i)) for i in range(10)))
        start = time.perf_counter()
        (_, queue_ms) = await queue.submit("alone", ("alone", 1))
        return rec, queue_ms, time.perf_counter() - start

    rec, queue_ms, took = run(scenario())
    assert [len(b) for b in rec.batches[:3]] == [4, 4, 2]
    assert queue_ms < STEP_S * 1000 and took < 3 * STEP_S


def test_one_session_is_never_twice_in_a_batch():
    async def scenario():
        rec = Recorder()
        queue = BatchQueue(ModelWorker("t"), rec, max_batch=8)
        await asyncio.gather(
            *(queue.submit("same" if i % 2 else f"s{i}", ("same" if i % 2 else f"s{i}", i)) for i in range(6))
        )
        return rec

    rec = run(scenario())
    for batch in rec.batches:
        sessions = [sid for sid, _ in batch]
        assert len(sessions) == len(set(sessions))
    assert sum(len(b) for b in rec.batches) == 6


def test_an_item_error_fails_that_caller_only():
    async def scenario():
        queue = BatchQueue(ModelWorker("t"), Recorder(), max_batch=8)
        return await asyncio.gather(queue.submit("a", ("a", 1)), queue.submit("b", ("b", -1)), return_exceptions=True)

    ok, bad = run(scenario())
    assert ok[0] == 10 and isinstance(bad, InvalidArgument)


def test_a_failed_forward_fails_every_caller_of_the_batch_and_marks_the_worker():
    def broken(items):
        raise RuntimeError("device lost")

    async def scenario():
        worker = ModelWorker("t")
        queue = BatchQueue(worker, broken, max_batch=8)
        out = await asyncio.gather(*(queue.submit(f"s{i}", i) for i in range(3)), return_exceptions=True)
        return worker, out

    worker, out = run(scenario())
    assert all(isinstance(o, RuntimeError) for o in out)
    assert not worker.state.last_ok and worker.state.in_flight == 0


def test_a_cancelled_caller_is_skipped():
    async def scenario():
        rec = Recorder()
        queue = BatchQueue(ModelWorker("t"), rec, max_batch=8)
        first = asyncio.create_task(queue.submit("a", ("a", 1)))
        await asyncio.sleep(0.01)  # "a" is running; the next ones queue behind it
        gone = asyncio.create_task(queue.submit("b", ("b", 2)))
        kept = asyncio.create_task(queue.submit("c", ("c", 3)))
        await asyncio.sleep(0.01)
        gone.cancel()
        await first
        with pytest.raises(asyncio.CancelledError):
            await gone
        return rec, (await kept)[0]

    rec, kept = run(scenario())
    assert kept == 30
    assert [sid for batch in rec.batches for sid, _ in batch] == ["a", "c"]


def test_a_group_that_comes_back_staggered_stays_one_batch():
    async def session(queue: BatchQueue, sid: str, delay_s: float, rounds: int) -> None:
        for r in range(rounds):
            await queue.submit(sid, (sid, r))
            await asyncio.sleep(delay_s)  # the orchestrator's round trip, different per session

    async def scenario(max_wait_s: float) -> list[int]:
        rec = Recorder()
        queue = BatchQueue(ModelWorker("t"), rec, max_batch=8, max_wait_s=max_wait_s)
        await asyncio.gather(*(session(queue, f"s{i}", 0.002 * i, rounds=5) for i in range(4)))
        return [len(b) for b in rec.batches]

    assert run(scenario(0.03)) == [4] * 5
    without_wait = run(scenario(0.0))
    assert without_wait[0] == 4 and without_wait[1] == 1  # the first one back went alone: the group split


def test_a_lone_session_never_waits_for_company():
    async def scenario() -> float:
        queue = BatchQueue(ModelWorker("t"), Recorder(), max_batch=8, max_wait_s=1.0)
        start = time.perf_counter()
        for r in range(3):
            await queue.submit("alone", ("alone", r))
        return time.perf_counter() - start

    assert run(scenario()) < 3 * STEP_S + 0.5


def test_small_calls_run_on_the_event_loop_large_ones_and_overlapping_ones_on_the_model_thread():
    import threading

    async def scenario():
        worker = ModelWorker("t")
        loop_thread = threading.get_ident()
        where = []

        def note(tag):
            where.append((tag, threading.get_ident() == loop_thread))
            time.sleep(STEP_S)
            return tag

        await worker.run("a", lambda: note("small"), small=lambda: True)
        await worker.run("a", lambda: note("large"), small=lambda: False)
        await worker.run("a", lambda: note("unsized"))
        # a small call while another call is on the model thread waits for the thread instead
        await asyncio.gather(
            worker.run("b", lambda: note("on-thread")),
            worker.run("c", lambda: note("small-but-busy"), small=lambda: True),
        )
        worker.shutdown()
        return dict(where), worker.state.inline_calls

    where, inline_calls = run(scenario())
    assert where == {"small": True, "large": False, "unsized": False, "on-thread": False, "small-but-busy": False}
    assert inline_calls == 1


def recording_batch_fn():
    """(a batch_fn answering each item's [1], the list of whether each batch ran on this thread): call it on the
    event loop's thread."""
    import threading

    loop_thread, on_loop = threading.get_ident(), []

    def batch_fn(items):
        on_loop.append(threading.get_ident() == loop_thread)
        return [item[1] for item in items]

    return batch_fn, on_loop


def test_batch_queue_runs_a_batch_inline_when_its_work_is_small():
    async def scenario():
        batch_fn, on_loop = recording_batch_fn()
        queue = BatchQueue(
            ModelWorker("t"), batch_fn, max_batch=8, work_tokens=lambda item: item[1], inline_max_tokens=16
        )
        await queue.submit("s", ("s", 16))  # 16 tokens: inline
        await queue.submit("s", ("s", 17))  # 17: model thread
        await asyncio.gather(*(queue.submit(f"s{i}", (f"s{i}", 5)) for i in range(3)))  # one batch, 15: inline
        await asyncio.gather(*(queue.submit(f"s{i}", (f"s{i}", 6)) for i in range(3)))  # one batch, 18: thread
        return on_loop

    assert run(scenario()) == [True, False, True, False]


def test_what_a_batch_writes_to_its_caches_decides_inline_not_only_what_it_computes():
    async def scenario():
        batch_fn, on_loop = recording_batch_fn()
        # item: (session, tokens computed, positions written: computed + copied from another session's prefix)
        queue = BatchQueue(
            ModelWorker("t"),
            batch_fn,
            max_batch=8,
            work_tokens=lambda item: item[1],
            inline_max_tokens=16,
            inline_tokens=lambda item: item[2],
        )
        await queue.submit("s", ("s", 2, 2))  # a decode round: inline
        await queue.submit("n", ("n", 2, 6702))  # a new session copying 6,700 positions first: model thread
        return on_loop

    assert run(scenario()) == [True, False]


def test_a_lone_sessions_small_call_runs_at_once_and_any_other_call_is_left_to_submit():
    async def scenario():
        recorded, on_loop = recording_batch_fn()

        def batch_fn(items):  # an item with a third field fails (its error in its place)
            return [InvalidArgument(item[2]) if len(item) > 2 else r for item, r in zip(items, recorded(items))]

        worker = ModelWorker("t")
        queue = BatchQueue(worker, batch_fn, max_batch=8, work_tokens=lambda item: item[1], inline_max_tokens=16)
        seen = {
            "first": queue.run_now("s", ("s", 5)),  # nothing ran yet: lone
            "again": queue.run_now("s", ("s", 5)),  # its own last pass: still lone
            "large": queue.run_now("s", ("s", 17)),  # not small: submit it (the model thread)
            "bad": None,
        }
        try:
            queue.run_now("s", ("s", 3, "bad 3"))
        except InvalidArgument as exc:  # an item's error is raised, as submit does
            seen["bad"] = str(exc)
        await queue.submit("t", ("t", 5))  # another session's pass ...
        seen["after another"] = queue.run_now("s", ("s", 5))  # ... so "s" may have company: submit
        await queue.submit("s", ("s", 5))  # alone again
        held = asyncio.ensure_future(worker.run("u", lambda: time.sleep(STEP_S)))  # a call in flight (thread)
        await asyncio.sleep(STEP_S / 5)
        seen["call in flight"] = queue.run_now("s", ("s", 5))
        await held
        worker.shutdown()
        return seen, on_loop, worker.state

    seen, on_loop, state = run(scenario())
    assert seen == {
        "first": 5,
        "again": 5,
        "large": None,
        "bad": "bad 3",
        "after another": None,
        "call in flight": None,
    }
    # at once: first, again, bad (the large one did not run); then t's and s's passes, inline through submit
    assert on_loop == [True, True, True, True, True]
    assert (state.batches, state.batched_calls) == (5, 5) and state.inline_calls == 5


def test_the_model_is_loaded_on_the_thread_that_runs_its_forwards_and_not_counted_as_a_call():
    """One thread for all torch work: a second thread running torch ops gets its own OpenMP team."""
    import threading

    async def main():
        worker = ModelWorker("t")
        loaded_on = await worker.setup(threading.get_ident)
        ran_on = await worker.run_on_thread(threading.get_ident)
        return loaded_on, ran_on, worker.state.calls, threading.get_ident()

    loaded_on, ran_on, calls, loop_thread = asyncio.run(main())
    assert loaded_on == ran_on != loop_thread and calls == 1


def test_small_forwards_run_inline_only_while_torch_runs_one_thread_or_every_forward_runs_on_the_loop():
    import torch

    from specdec.engine.loading import forwards_on_loop, inline_limit

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert inline_limit(16) == 16 and inline_limit(0) == 0
        assert not forwards_on_loop(-1) and forwards_on_loop(1) and not forwards_on_loop(0)
        torch.set_num_threads(2)
        assert inline_limit(16) == 0 and inline_limit(16, loop_forwards=True) == 16
        assert forwards_on_loop(-1) and not forwards_on_loop(0) and not forwards_on_loop(-1, "cuda:0")
        assert not forwards_on_loop(-1, bounded_passes=False) and forwards_on_loop(1, bounded_passes=False)
    finally:
        torch.set_num_threads(threads)


def test_with_forwards_on_the_loop_every_call_runs_there_and_the_model_thread_is_gone():
    """After loading on the model thread, use_the_loop ends that thread (and its OpenMP team): every call,
    large or small, runs on the event loop's thread."""
    import threading

    async def scenario():
        worker = ModelWorker("loopy")
        loaded_on = await worker.setup(threading.get_ident)
        worker.use_the_loop()
        threads_left = [t.name for t in threading.enumerate() if t.name.startswith("loopy-model")]
        ran_on = [
            await worker.run_on_thread(threading.get_ident),
            (await worker.run("s", threading.get_ident, small=lambda: False))[0],
        ]
        return loaded_on, threads_left, ran_on, threading.get_ident(), worker.state.inline_calls

    loaded_on, threads_left, ran_on, loop_thread, inline_calls = run(scenario())
    assert loaded_on != loop_thread and threads_left == [] and inline_calls == 2
    assert ran_on == [loop_thread, loop_thread]


class ChunkedWork:
    """Items are session ids; `left[sid]` tokens still to compute. Records every pass in order."""

    def __init__(self, left: dict[str, int]) -> None:
        self.left, self.log = dict(left), []

    def work(self, sid: str) -> int:
        return self.left[sid]

    def prefill(self, sid: str, budget: int) -> int:
        if sid == "bad":
            raise InvalidArgument("bad prompt")
        self.left[sid] -= budget
        self.log.append(("chunk", sid))
        time.sleep(STEP_S / 5)
        return self.left[sid]

    def batch(self, sids: list[str]) -> list[object]:
        self.log.append(("batch", tuple(sids)))
        for sid in sids:
            self.left[sid] = 1  # the next decode round of that session
        time.sleep(STEP_S / 5)
        return [f"{sid} done" for sid in sids]


def worker_for(loop_forwards: bool) -> ModelWorker:
    """A worker with a model thread, or one whose every call runs on the event loop (use_the_loop)."""
    worker = ModelWorker("t")
    if loop_forwards:
        worker.use_the_loop()
    return worker


@pytest.mark.parametrize("loop_forwards", [False, True], ids=["model-thread", "forwards-on-loop"])
def test_a_long_prefill_runs_in_chunks_with_the_other_sessions_rounds_in_between(loop_forwards):
    # on the loop, each pass holds the loop: the queue yields between passes so the decoders' next rounds,
    # sent meanwhile, get in (without the yields every chunk ran back to back)
    async def decode(queue: BatchQueue, sid: str, rounds: int) -> list[str]:
        return [(await queue.submit(sid, sid))[0] for _ in range(rounds)]

    async def scenario():
        work = ChunkedWork({"a": 1, "b": 1, "long": 10})
        queue = BatchQueue(
            worker_for(loop_forwards),
            work.batch,
            max_batch=8,
            work_tokens=work.work,
            prefill=work.prefill,
            chunk_tokens=4,
        )
        running = [asyncio.create_task(decode(queue, sid, 4)) for sid in ("a", "b")]
        await asyncio.sleep(0)
        long = await queue.submit("long", "long")
        return work.log, long, await asyncio.gather(*running), queue.worker.state.prefill_chunks

    log, (long, _), decoded, chunks = run(scenario())
    assert long == "long done" and decoded == [["a done"] * 4, ["b done"] * 4] and chunks == 2
    assert [entry for entry in log if entry[0] == "chunk"] == [("chunk", "long")] * 2  # 10 -> 6 -> 2 tokens
    first, last = log.index(("chunk", "long")), len(log) - 1 - log[::-1].index(("chunk", "long"))
    assert any(kind == "batch" for kind, _ in log[first:last]), log  # decode rounds ran between the chunks
    assert any(kind == "batch" and "long" in sids for kind, sids in log[last:]), log  # its last 2 tokens: a batch


@pytest.mark.parametrize("loop_forwards", [False, True], ids=["model-thread", "forwards-on-loop"])
def test_chunks_interleave_with_other_sessions_even_without_batching(loop_forwards):
    async def decode(queue: BatchQueue, sid: str, rounds: int) -> None:
        for _ in range(rounds):
            await queue.submit(sid, sid)

    async def scenario():
        work = ChunkedWork({"a": 1, "long": 13})
        queue = BatchQueue(
            worker_for(loop_forwards),
            work.batch,
            max_batch=1,
            work_tokens=work.work,
            prefill=work.prefill,
            chunk_tokens=4,
        )
        running = asyncio.create_task(decode(queue, "a", 6))
        await asyncio.sleep(0)
        await asyncio.gather(queue.submit("long", "long"), running)
        return work.log

    log = run(scenario())
    chunks = [i for i, entry in enumerate(log) if entry == ("chunk", "long")]
    assert len(chunks) == 3  # 13 -> 9 -> 5 -> 1 token
    assert all(("batch", ("a",)) in log[i:j] for i, j in zip(chunks, chunks[1:])), log


def test_a_failed_chunk_fails_that_call_alone_and_short_calls_never_chunk():
    async def scenario():
        work = ChunkedWork({"bad": 10, "short": 4})
        queue = BatchQueue(
            ModelWorker("t"), work.batch, max_batch=8, work_tokens=work.work, prefill=work.prefill, chunk_tokens=4
        )
        return work.log, await asyncio.gather(
            queue.submit("bad", "bad"), queue.submit("short", "short"), return_exceptions=True
        )

    log, (bad, short) = run(scenario())
    assert isinstance(bad, InvalidArgument) and short[0] == "short done"
    assert log == [("batch", ("short",))]


def test_the_worker_accounts_busy_prefill_and_batch_wait_time():
    # bench-concurrency's split reads these: model time, the part of it in passes that prefilled, and the
    # time a batch was held back for the previous batch's sessions (max_wait_s)
    work_of = {"p": 40, "d0": 1, "d1": 1}

    async def staggered(queue: BatchQueue, sid: str, delay_s: float) -> None:
        for r in range(3):
            await queue.submit(sid, (sid, r))
            await asyncio.sleep(delay_s)

    async def scenario():
        queue = BatchQueue(
            ModelWorker("t"), Recorder(), max_batch=8, max_wait_s=0.03, work_tokens=lambda item: work_of[item[0]]
        )
        await queue.submit("p", ("p", 0))  # one prefill pass
        await asyncio.gather(staggered(queue, "d0", 0.0), staggered(queue, "d1", 0.01))
        return queue.worker.state

    state = run(scenario())
    assert state.batches == 4  # the prefill, then 3 batches of 2
    assert state.busy_ms == pytest.approx(4 * STEP_S * 1000, rel=0.5)
    assert state.prefill_ms == pytest.approx(STEP_S * 1000, rel=0.5) and state.prefill_ms < state.busy_ms / 2
    assert 5 <= state.batch_wait_ms <= 2 * 30 + 20  # d1 came back ~10 ms after d0, twice


def test_a_prefill_that_would_outlast_its_deadline_is_refused_and_decode_rounds_never_are():
    from specdec.errors import ResourceExhausted

    work_of = {"a": 100, "b": 100, "late": 100, "dec": 1}

    async def scenario():
        queue = BatchQueue(ModelWorker("t"), Recorder(), max_batch=1, work_tokens=lambda item: work_of[item[0]])
        await queue.submit("a", ("a", 1), deadline_s=10.0)  # learns ~STEP_S per 100 tokens
        first = asyncio.create_task(queue.submit("a", ("a", 2)))
        queued = asyncio.create_task(queue.submit("b", ("b", 3)))  # 200 tokens ahead of the next one
        await asyncio.sleep(0.01)
        with pytest.raises(ResourceExhausted, match="overloaded"):
            await queue.submit("late", ("late", 4), deadline_s=0.1)  # ~0.15 s of work > half of 0.1 s
        decode = await queue.submit("dec", ("dec", 5), deadline_s=0.001)  # a decode round is never shed
        roomy = await queue.submit("late", ("late", 6), deadline_s=30.0)
        await asyncio.gather(first, queued)
        return queue, decode, roomy

    queue, decode, roomy = run(scenario())
    assert decode[0] == 50 and roomy[0] == 60 and queue.worker.state.shed_calls == 1
    assert queue.speed.ms_per_token == pytest.approx(STEP_S * 1000 / 100, rel=0.6)


def test_with_chunked_prefill_a_short_prefill_waits_for_one_turn_of_the_long_ones_not_their_whole():
    from specdec.errors import ResourceExhausted

    def queue_with(chunk_tokens: int) -> BatchQueue:
        queue = BatchQueue(
            ModelWorker("t"),
            Recorder(),
            max_batch=4,
            work_tokens=lambda item: item[1],
            prefill=lambda item, budget: item[1] - budget,
            chunk_tokens=chunk_tokens,
            prefill_turn_ms=200,
        )
        queue.speed.ms_per_token = 1.0  # batches: 1 ms per prefilled token
        for sid, tokens in (("long-a", 10_000), ("long-b", 10_000), ("short", 300)):
            queue._pending.append((sid, (sid, tokens), None, 0.0))
        return queue

    chunked, whole = queue_with(512), queue_with(0)
    assert chunked.wait_ms(300) == 300 + 300 + 512  # the next batch, after one whole chunk
    chunked.speed.chunk_ms_per_token = 4.0  # turns measured: 200 ms buy 50 tokens
    assert chunked.wait_ms(300) == 300 + 300 + 50 * 4.0  # ... one turn, at the turns' own speed
    assert chunked.wait_ms(2000) == 300 + (2000 + 20_000) * 4.0  # a long one: behind the long ones
    assert whole.wait_ms(300) == 300 + 20_300  # first come, first served
    chunked._admit(("new", 300), deadline_s=5.0)  # ~0.8 s: admitted
    with pytest.raises(ResourceExhausted):
        whole._admit(("new", 300), deadline_s=5.0)  # ~20.6 s without chunking
    with pytest.raises(ResourceExhausted):
        chunked._admit(("new", 300), deadline_s=0.5)  # ~0.8 s > 0.5 s: still refused
    with pytest.raises(ResourceExhausted):
        chunked._admit(("new", 2000), deadline_s=30.0)  # ~88 s behind the long ones


def test_the_speed_of_long_prefill_turns_does_not_price_short_prompts():
    """Turns at a long context cost several times a short prompt's token (attention over thousands of
    positions, small passes): each kind of pass keeps its own measured speed."""
    queue = BatchQueue(
        ModelWorker("t"),
        Recorder(),
        max_batch=4,
        work_tokens=lambda item: item,
        prefill=lambda item, budget: item - budget,
        chunk_tokens=512,
        prefill_turn_ms=200,
    )
    queue.speed.pass_ms_per_token(300, 0.3)  # nothing learned: _run_batch / _prefill_one do
    assert queue.speed.ms_per_token == 0.0
    queue.speed.ms_per_token, queue.speed.chunk_ms_per_token = 1.0, 10.0
    queue._pending.extend([("long", 6000, None, 0.0), ("short", 300, None, 0.0)])
    assert queue.wait_ms(300) == 600 + 32 * 10.0  # a turn of 32 tokens (the floor), not 600 at 10 ms


def test_the_oldest_long_prefill_takes_the_turns():
    async def scenario():
        work = ChunkedWork({"old": 12, "new": 12})
        queue = BatchQueue(
            ModelWorker("t"), work.batch, max_batch=8, work_tokens=work.work, prefill=work.prefill, chunk_tokens=4
        )
        old = asyncio.create_task(queue.submit("old", "old"))
        await asyncio.sleep(0.001)  # old is queued (and running) first
        await asyncio.gather(old, queue.submit("new", "new"))
        return [sid for kind, sid in work.log if kind == "chunk"]

    assert run(scenario()) == ["old", "old", "new", "new"]  # 12 -> 8 -> 4 each, old first


def test_a_long_prefill_takes_short_turns_while_others_decode_and_whole_chunks_alone():
    """Decode-first: between decode rounds a long prompt's turn is sized to prefill_turn_ms at the measured
    chunk speed (here ~1 ms a token: a 64 ms turn is ~64 tokens), alone it runs whole chunks."""

    class Timed(ChunkedWork):
        def prefill(self, sid: str, budget: int) -> int:
            self.log.append(("chunk", budget))
            self.left[sid] -= budget
            time.sleep(budget / 1000)
            return self.left[sid]

    async def decode(queue: BatchQueue, rounds: int) -> None:
        for _ in range(rounds):
            await queue.submit("a", "a")

    async def scenario():
        work = Timed({"a": 1, "long": 2000})
        queue = BatchQueue(
            ModelWorker("t"),
            work.batch,
            max_batch=8,
            work_tokens=work.work,
            prefill=work.prefill,
            chunk_tokens=256,
            prefill_turn_ms=64,
        )
        assert queue.speed.turn_tokens(others_decoding=True) == 256  # speed not measured yet: whole chunks
        running = asyncio.create_task(decode(queue, 8))
        await asyncio.sleep(0)
        await asyncio.gather(queue.submit("long", "long"), running)
        return work.log, queue

    log, queue = run(scenario())
    last_round = len(log) - 1 - [kind for kind, _ in log][::-1].index("batch")  # the long one's own last batch
    a_done = max(i for i, (kind, sids) in enumerate(log) if kind == "batch" and sids == ("a",))
    first = log.index(("chunk", 256))  # speed not measured yet
    beside = [budget for kind, budget in log[first + 1 : a_done] if kind == "chunk"]
    alone = [budget for kind, budget in log[a_done + 1 : last_round] if kind == "chunk"]
    assert first < a_done and beside and alone, log
    assert all(32 <= budget <= 128 for budget in beside), log  # ~64 tokens: short turns
    assert alone[-1] == 256, log  # alone again: whole chunks
    assert 0.5 < queue.speed.chunk_ms_per_token < 3


def test_turn_tokens_fit_the_turn_at_the_chunk_speed_within_bounds():
    queue = BatchQueue(
        ModelWorker("t"),
        lambda items: items,
        max_batch=8,
        work_tokens=len,
        prefill=lambda item, budget: 0,
        chunk_tokens=512,
        prefill_turn_ms=200,
    )
    queue.speed.chunk_ms_per_token = 4.0
    assert queue.speed.turn_tokens(others_decoding=True) == 50 and queue.speed.turn_tokens(others_decoding=False) == 512
    queue.speed.chunk_ms_per_token = 0.1  # a fast machine: whole chunks
    assert queue.speed.turn_tokens(others_decoding=True) == 512
    queue.speed.chunk_ms_per_token = 50.0  # a slow one: never below the floor
    assert queue.speed.turn_tokens(others_decoding=True) == 32
    queue.speed.prefill_turn_ms = 0
    assert queue.speed.turn_tokens(others_decoding=True) == 512
    queue.speed.prefill_turn_ms, queue.speed.chunk_tokens = 200, 8  # chunks below the floor: whole chunks
    assert queue.speed.turn_tokens(others_decoding=True) == 8


class PricedWork:
    """Items are session ids; a pass sleeps MS_PER_TOKEN per token it computes. A session's first call
    prefills `prompt[sid]` tokens, its later ones decode 1 token. Records each pass's sessions."""

    MS_PER_TOKEN = 0.1

    def __init__(self, prompt: dict[str, int]) -> None:
        self.left, self.log = dict(prompt), []

    def work(self, sid: str) -> int:
        return self.left[sid]

    def batch(self, sids: list[str]) -> list[str]:
        self.log.append(tuple(sids))
        time.sleep(sum(self.left[sid] for sid in sids) * self.MS_PER_TOKEN / 1000)
        for sid in sids:
            self.left[sid] = 1
        return [f"{sid} done" for sid in sids]

    def prefill(self, sid: str, budget: int) -> int:
        if self.left[sid] <= budget:
            return self.left[sid]
        self.log.append(("chunk", budget))
        time.sleep(budget * self.MS_PER_TOKEN / 1000)
        self.left[sid] -= budget
        return self.left[sid]


def test_a_burst_of_prompts_spreads_over_passes_and_running_sessions_decode_in_each():
    """Decode first for every prompt, not only long ones: while sessions decode, a pass prefills at most
    what prefill_turn_ms buys (beyond its first prompt), so a burst of prompts does not hold every running
    session for one pass of them all; the prompts run first come, first served."""
    prompts = {f"p{i}": 60 for i in range(4)}

    async def decode(queue: BatchQueue, sid: str, rounds: int) -> None:
        for _ in range(rounds):
            await queue.submit(sid, sid)

    async def scenario():
        work = PricedWork({"a": 1, "b": 1, **prompts})
        queue = BatchQueue(
            ModelWorker("t"),
            work.batch,
            max_batch=8,
            max_wait_s=0.02,
            work_tokens=work.work,
            prefill=work.prefill,
            chunk_tokens=512,
            prefill_turn_ms=10,
        )
        queue.speed.ms_per_token = PricedWork.MS_PER_TOKEN  # 10 ms buy 100 prompt tokens
        running = [asyncio.create_task(decode(queue, sid, 40)) for sid in ("a", "b")]
        await asyncio.sleep(0.005)
        await asyncio.gather(*(queue.submit(sid, sid) for sid in prompts))
        await asyncio.gather(*running)
        return work.log

    log = run(scenario())
    with_prompts = [sids for sids in log if any(sid in prompts for sid in sids)]
    assert [sid for sids in with_prompts for sid in sids if sid in prompts] == list(prompts)  # first come
    assert len(with_prompts) == 4, log  # 60 + 60 > 100: one prompt a pass
    assert all("a" in sids and "b" in sids for sids in with_prompts[1:]), log  # decode rounds in each


def test_alone_a_pass_prefills_at_most_a_chunk_of_prompts():
    async def scenario():
        work = PricedWork({f"p{i}": 60 for i in range(5)})
        queue = BatchQueue(
            ModelWorker("t"),
            work.batch,
            max_batch=8,
            work_tokens=work.work,
            prefill=lambda sid, budget: 0,
            chunk_tokens=128,
            prefill_turn_ms=0,
        )
        await asyncio.gather(*(queue.submit(f"p{i}", f"p{i}") for i in range(5)))
        return work.log

    assert run(scenario()) == [("p0", "p1"), ("p2", "p3"), ("p4",)]


def test_the_pass_prefill_budget_fits_the_turn_at_the_batch_speed_within_bounds():
    queue = BatchQueue(
        ModelWorker("t"),
        lambda items: items,
        max_batch=8,
        work_tokens=len,
        prefill=lambda item, budget: 0,
        chunk_tokens=512,
        prefill_turn_ms=200,
    )
    assert queue.speed.pass_prefill_tokens(others_decoding=True) == 512  # speed not measured yet
    queue.speed.ms_per_token, queue.speed.chunk_ms_per_token = 2.0, 8.0  # batches' speed, not the turns'
    assert queue.speed.pass_prefill_tokens(others_decoding=True) == 100
    assert queue.speed.pass_prefill_tokens(others_decoding=False) == 512
    queue.speed.ms_per_token = 50.0
    assert queue.speed.pass_prefill_tokens(others_decoding=True) == 32  # the floor
    queue.speed.prefill_turn_ms = 0
    assert queue.speed.pass_prefill_tokens(others_decoding=True) == 512


def test_while_others_decode_a_prompt_over_the_pass_budget_takes_turns_at_the_batch_speed():
    """A prompt shorter than a chunk but longer than what prefill_turn_ms buys is chunked too while other
    sessions decode (decode first); its turns are sized and timed as batches (short contexts), so the long
    prefills' turn speed is left alone."""

    async def decode(queue: BatchQueue, sid: str, rounds: int) -> None:
        for _ in range(rounds):
            await queue.submit(sid, sid)

    async def scenario():
        work = PricedWork({"a": 1, "mid": 300})
        queue = BatchQueue(
            ModelWorker("t"),
            work.batch,
            max_batch=8,
            max_wait_s=0.2,
            work_tokens=work.work,
            prefill=work.prefill,
            chunk_tokens=512,
            prefill_turn_ms=10,
        )
        queue.speed.ms_per_token = PricedWork.MS_PER_TOKEN  # 10 ms buy 100 prompt tokens
        running = asyncio.create_task(decode(queue, "a", 30))
        await asyncio.sleep(0.005)
        await queue.submit("mid", "mid")
        await running
        return work.log, queue

    log, queue = run(scenario())
    chunks = [i for i, entry in enumerate(log) if entry[0] == "chunk"]
    sizes = [log[i][1] for i in chunks]  # ~100 each (the measured speed moves the budget a little)
    assert 2 <= len(sizes) <= 3 and all(80 <= size <= 100 for size in sizes) and sum(sizes) < 300, log
    assert all(("a",) in log[i:j] for i, j in zip(chunks, chunks[1:])), log  # a decoded in between
    assert any(entry == ("a", "mid") or entry == ("mid", "a") for entry in log[chunks[-1] :]), log
    assert queue.speed.chunk_ms_per_token == 0.0 and queue.speed.ms_per_token > 0


def test_a_prompt_arriving_during_a_lone_decoders_pass_waits_for_it_and_takes_turns():
    """The queue takes the prompt when the decoder's pass ends, before the decoder has queued its next round;
    taken alone it would be prefilled whole (holding that session for all of it), so the queue waits for the
    lone decoder when a queued prompt would take turns, also without batch_turn (turns as passes of their own)."""

    class SlowFirstPass(PricedWork):
        def batch(self, sids: list[str]) -> list[str]:
            if len(self.log) == 0:
                time.sleep(0.05)  # the prompt arrives while this pass runs
            return super().batch(sids)

    async def scenario():
        work = SlowFirstPass({"a": 1, "mid": 300})
        queue = BatchQueue(
            ModelWorker("t"),
            work.batch,
            max_batch=8,
            max_wait_s=0.5,
            work_tokens=work.work,
            prefill=work.prefill,
            chunk_tokens=512,
            prefill_turn_ms=10,
        )
        queue.speed.ms_per_token = PricedWork.MS_PER_TOKEN  # 10 ms buy 100 prompt tokens
        done = asyncio.Event()

        async def decode() -> None:
            while not done.is_set():
                await queue.submit("a", "a")

        running = asyncio.create_task(decode())
        await asyncio.sleep(0.01)
        await queue.submit("mid", "mid")
        done.set()
        await running
        return work.log

    log = run(scenario())
    assert ("mid",) not in log, log  # never prefilled whole, alone
    assert [entry[0] for entry in log].count("chunk") >= 2, log


def test_a_turn_rides_in_the_decode_rounds_pass_when_the_engine_can_batch_it():
    """With batch_turn, a prefill's turn and the decode rounds share ONE pass (the weights stream once); a
    failed turn fails its own call alone."""

    class TurnWork(PricedWork):
        def batch_turn(self, sids: list[str], turn: str, budget: int) -> tuple[list[str], object]:
            if turn == "bad":
                return self.batch(sids), InvalidArgument("bad prompt")
            self.log.append(("turn", turn, budget))
            self.left[turn] -= budget
            return self.batch(sids), self.left[turn]

    async def decode(queue: BatchQueue, sid: str, rounds: int) -> None:
        for _ in range(rounds):
            await queue.submit(sid, sid)

    async def scenario():
        work = TurnWork({"a": 1, "mid": 300, "bad": 300})
        queue = BatchQueue(
            ModelWorker("t"),
            work.batch,
            max_batch=8,
            max_wait_s=0.02,
            work_tokens=work.work,
            prefill=work.prefill,
            chunk_tokens=512,
            prefill_turn_ms=10,
            batch_turn=work.batch_turn,
        )
        queue.speed.ms_per_token = PricedWork.MS_PER_TOKEN  # 10 ms buy 100 prompt tokens
        running = asyncio.create_task(decode(queue, "a", 30))
        await asyncio.sleep(0.005)
        results = await asyncio.gather(queue.submit("mid", "mid"), queue.submit("bad", "bad"), return_exceptions=True)
        await running
        return work.log, results, queue.worker.state

    log, (mid, bad), state = run(scenario())
    turns = [i for i, entry in enumerate(log) if entry[0] == "turn"]
    assert mid[0] == "mid done" and isinstance(bad, InvalidArgument)
    assert turns and all(log[i + 1] == ("a",) for i in turns), log  # each turn's pass carried a's round
    assert not any(entry[0] == "chunk" for entry in log), log  # no pass of its own (a is waited for)
    assert state.prefill_chunks == len(turns) + 1  # and the bad one's turn


def test_shorter_prompts_taking_turns_go_first_and_long_ones_still_get_turns():
    """A few-hundred-token prompt that takes turns beside decoding sessions is not held behind every turn of
    the long prompts queued before it, nor do shorter ones starve a long one."""

    async def decode(queue: BatchQueue, sid: str, rounds: int) -> None:
        for _ in range(rounds):
            await queue.submit(sid, sid)

    async def scenario():
        work = PricedWork({"a": 1, "long": 2000, "mid": 250, "mid2": 250})
        queue = BatchQueue(
            ModelWorker("t"),
            work.batch,
            max_batch=8,
            max_wait_s=0.02,
            work_tokens=work.work,
            prefill=work.prefill,
            chunk_tokens=512,
            prefill_turn_ms=10,
        )
        queue.speed.ms_per_token = queue.speed.chunk_ms_per_token = PricedWork.MS_PER_TOKEN  # turns of ~100 tokens
        running = asyncio.create_task(decode(queue, "a", 80))
        await asyncio.sleep(0.005)
        long = asyncio.create_task(queue.submit("long", "long"))
        await asyncio.sleep(0.02)  # long is taking turns
        await asyncio.gather(queue.submit("mid", "mid"), queue.submit("mid2", "mid2"))
        mids_done = work.left["long"]
        await asyncio.gather(long, running)
        return mids_done

    left_when_mids_done = run(scenario())
    assert 1000 < left_when_mids_done < 2000  # the mids finished while the long one had most of its turns left
