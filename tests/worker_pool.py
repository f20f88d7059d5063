"""Run a test's independent, seeded work items on both cores: this process and a pool of worker processes.

The chi-square tests loop over thousands of seeds through tiny engines with one torch thread, while
the machine's second core idles. `pool_map(fn, items)` deals the items out: this process computes
one share, worker processes the others, and the results come back in item order. Each item is fixed
by its own seed and fn builds (and caches) what it needs from constants, so every process computes
what the plain loop would.

Why workers and not forks of the test process: a fork of a process that runs threads (the stall
monitor, an in-process stack's event loop and gRPC threads) crashed now and then in CPython 3.11's
after-fork cleanup (SIGSEGV in threading._after_fork and filelock's fork hook, about one run in four
beside an in-process stack), and one that had run torch with two threads hung in its first parallel
region. The workers fork from the multiprocessing fork server, a single-threaded process that
imported PRELOAD once, so a worker starts in milliseconds and shares nothing with this one. fn must
therefore pickle: a module-level function, or a functools.partial of one.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, TypeVar

import torch

T = TypeVar("T")
R = TypeVar("R")

MAX_WORKERS = 2  # the CI machine's cores; this process is one of the workers
WORKERS_ENV = "SPECDEC_TEST_WORKERS"  # 1: the plain loop in this process
TIMEOUT_S = 600.0  # how long this process waits for a worker's share once its own is done
PRELOAD = ["torch", "transformers", "scipy.stats", "specdec.engine.target", "specdec.engine.draft"]

_pool: ProcessPoolExecutor | None = None
_objects: dict[str, Any] = {}  # per_process: what this process computes items with


def workers() -> int:
    """How many processes share the items: SPECDEC_TEST_WORKERS, else the CPUs we may use, at most MAX_WORKERS."""
    if os.environ.get(WORKERS_ENV):
        return max(1, int(os.environ[WORKERS_ENV]))
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))


def _one_torch_thread() -> None:
    torch.set_num_threads(1)


def pool(size: int) -> ProcessPoolExecutor:
    """The session's worker pool (started on first use, shut down at exit), at least `size` workers; a pool
    broken by a worker that died is replaced."""
    global _pool
    if _pool is None or _pool._max_workers < size or _pool._broken:  # noqa: SLF001 - grow or replace a broken one
        if _pool is not None:
            _pool.shutdown(cancel_futures=True)
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        _pool = ProcessPoolExecutor(max_workers=size, mp_context=context, initializer=_one_torch_thread)
        atexit.register(_pool.shutdown, cancel_futures=True)
    return _pool


def per_process(key: str, load: Callable[[], T]) -> T:
    """This process's object for `key` (the models an item function computes with): the one a test lent
    (`lend`), else `load()`, once per process (what a worker does)."""
    if key not in _objects:
        _objects[key] = load()
    return _objects[key]


@contextlib.contextmanager
def lend(key: str, value: Any) -> Iterator[None]:
    """Within the block, per_process(key, ...) in this process is `value` (e.g. models the test already loaded,
    instead of a second copy); afterwards this process holds no reference to it."""
    _objects[key] = value
    try:
        yield
    finally:
        _objects.pop(key, None)


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


def run_share(fn: Callable[[T], R], share: Sequence[T]) -> list[R]:
    """[fn(x) for x in share] (what a worker runs)."""
    return [fn(x) for x in share]


def pool_map(
    fn: Callable[[T], R],
    items: Sequence[T],
    n_workers: int | None = None,
    weights: Sequence[float] | None = None,
    timeout_s: float = TIMEOUT_S,
) -> list[R]:
    """[fn(x) for x in items], computed by n_workers processes (default `workers()`): this one and pool workers.

    The items are dealt as `deal` says; the workers' shares are submitted first, then this process computes
    its own with one torch thread (as the workers), then waits up to timeout_s for theirs. A worker's exception
    is raised here.
    """
    items = list(items)
    n = min(n_workers or workers(), len(items)) or 1
    shares = deal(len(items), n, weights)
    futures: list[Future] = []
    if n > 1:
        executor = pool(n - 1)
        futures = [executor.submit(run_share, fn, [items[i] for i in share]) for share in shares[1:]]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        results = [run_share(fn, [items[i] for i in shares[0]])]
    finally:
        torch.set_num_threads(threads)
    results += [f.result(timeout=timeout_s) for f in futures]
    out: list = [None] * len(items)
    for share, res in zip(shares, results):
        for i, value in zip(share, res):
            out[i] = value
    return out
