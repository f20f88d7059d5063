"""Run a test's independent, seeded work items in processes forked from the test process.

The sampling and identity tests loop over thousands of seeds (or a list of prompts) with one torch
thread, while the machine's second core idles. `fork_map(fn, items)` splits the items across
`workers()` processes: each is a fork of the test process, so it holds the models and engines the
test already built, and computes `fn(item)` for its share; the results come back in item order.
Each item is fixed by its own seed, so the results are those of the plain loop, only sooner.

Only for work that needs nothing but memory and the CPU: a fork holds no thread of the parent but
the caller, so fn must not use gRPC, a Redis client or a Hugging Face tokenizer (its Rust thread
pool does not survive a fork: tokenize first). Torch does: the forks run it on one thread. A
failure in a fork is raised in the test with the fork's traceback.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import time
import traceback
from typing import Callable, Sequence, TypeVar

import torch

T = TypeVar("T")
R = TypeVar("R")

MAX_WORKERS = 2           # the CI machine's cores; the test process is one of the workers
WORKERS_ENV = "SPECDEC_TEST_WORKERS"   # 1: the plain loop in the test process
TIMEOUT_S = 600.0         # a fork still at work this long after its results are asked for is killed (a hang)
PIPE_CHUNK = 1 << 16


class ForkedWorkError(RuntimeError):
    """A fork's fn raised; the message carries its traceback."""


def workers() -> int:
    """How many processes share the items: SPECDEC_TEST_WORKERS, else the CPUs we may use, at most MAX_WORKERS."""
    if os.environ.get(WORKERS_ENV):
        return max(1, int(os.environ[WORKERS_ENV]))
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))


def _child(fn: Callable[[T], R], share: Sequence[T], write_fd: int) -> None:
    """In the fork: compute the share with one torch thread, send ("ok", results) or ("error", traceback), exit
    without cleanup. (The fork inherits the parent's OpenMP pool but not its threads: where the parent had run
    torch with more than one thread, the fork's first parallel region would wait for them forever.)"""
    try:
        torch.set_num_threads(1)
        payload = pickle.dumps(("ok", [fn(x) for x in share]))
    except BaseException:  # noqa: B902 - everything, KeyboardInterrupt included, goes back to the test
        payload = pickle.dumps(("error", traceback.format_exc()))
    try:
        with os.fdopen(write_fd, "wb") as out:
            out.write(payload)
    finally:
        os._exit(0)  # no atexit, no pytest teardown in a fork


def _collect(pid: int, read_fd: int, deadline: float) -> tuple[str, object]:
    """Read a fork's whole answer (before waiting, so a large one cannot block it), then reap it; a fork still
    at work at `deadline` (time.monotonic) is killed."""
    chunks = []
    with os.fdopen(read_fd, "rb", buffering=0) as src:
        while True:
            ready, _, _ = select.select([src], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return "error", f"fork {pid} still at work after its deadline: killed"
            chunk = src.read(PIPE_CHUNK)
            if not chunk:
                break
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        return "error", f"fork {pid} died without an answer (wait status {status})"
    return pickle.loads(b"".join(chunks))


def _start(fn: Callable[[T], R], share: Sequence[T]) -> tuple[int, int]:
    """Fork a process that computes [fn(x) for x in share]; (its pid, the read end of its answer)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(fn, share, write_fd)
    os.close(write_fd)
    return pid, read_fd


def _answers(forks: list[tuple[int, int]], timeout_s: float = TIMEOUT_S) -> list[list]:
    """Every fork's results, each fork reaped; a failed fork raises ForkedWorkError after all are reaped."""
    deadline = time.monotonic() + timeout_s
    answers = [_collect(pid, fd, deadline) for pid, fd in forks]
    for kind, value in answers:
        if kind != "ok":
            raise ForkedWorkError(f"a fork failed:\n{value}")
    return [value for _, value in answers]


class InBackground:
    """[fn(x) for x in items] computed by one fork while this process goes on (e.g. the reference outputs of an
    identity test while the stack generates); `results()` waits for them. With one worker (`workers()`), no
    fork: `results()` computes them here."""

    def __init__(self, fn: Callable[[T], R], items: Sequence[T]):
        self._work = (fn, list(items))
        self._fork = _start(fn, self._work[1]) if workers() > 1 else None
        self._results: list | None = None
        self._done = False

    def results(self) -> list:
        if not self._done:
            self._done = True
            fn, items = self._work
            self._results = _answers([self._fork])[0] if self._fork else [fn(x) for x in items]
        return self._results

    def __enter__(self) -> "InBackground":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Where the results were never asked for (a test that failed first): the fork is killed and reaped."""
        if not self._done and self._fork:
            pid, read_fd = self._fork
            os.kill(pid, signal.SIGKILL)
            os.close(read_fd)
            os.waitpid(pid, 0)
        self._done = True


def deal(n_items: int, n_workers: int, weights: Sequence[float] | None = None) -> list[list[int]]:
    """Which item indices each worker computes: round robin, or with weights (each item's expected cost) the
    heaviest first, each to the worker with the least so far."""
    if weights is None:
        return [list(range(w, n_items, n_workers)) for w in range(n_workers)]
    shares: list[list[int]] = [[] for _ in range(n_workers)]
    loads = [0.0] * n_workers
    for i in sorted(range(n_items), key=lambda j: -weights[j]):
        w = loads.index(min(loads))
        shares[w].append(i)
        loads[w] += weights[i]
    return shares


def fork_map(fn: Callable[[T], R], items: Sequence[T], n_workers: int | None = None,
             weights: Sequence[float] | None = None, timeout_s: float = TIMEOUT_S) -> list[R]:
    """[fn(x) for x in items], computed by n_workers processes (default `workers()`): this one and forks of it.

    The items are dealt as `deal` says; the forks start first, then this process computes its share (with
    one torch thread, as the forks), then each fork gets until timeout_s to answer.
    """
    items = list(items)
    n = min(n_workers or workers(), len(items)) or 1
    shares = deal(len(items), n, weights)
    forks = [_start(fn, [items[i] for i in share]) for share in shares[1:]]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)      # as the forks: one thread per worker, a worker per core
        results = [[fn(items[i]) for i in shares[0]]]
    finally:
        torch.set_num_threads(threads)
        answers = _answers(forks, timeout_s)     # every fork reaped, whatever happened here
    out: list = [None] * len(items)
    for share, res in zip(shares, results + answers):
        for i, value in zip(share, res):
            out[i] = value
    return out
