"""tests/worker_pool.py: items shared between this process and pool workers come back whole and in order, a
worker's failure reaches the test, and work is dealt by weight."""

from __future__ import annotations

import functools
import os

import pytest
import torch

from tests.worker_pool import deal, lend, per_process, pool_map, workers


def square_and_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def fails_on(bad: int, x: int) -> int:
    if x == bad:
        raise ValueError(f"bad item {x}")
    return x


def matmul_sum_and_threads(seed: int) -> tuple[float, int]:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(64, 64, generator=g)
    return float((a @ a).sum()), torch.get_num_threads()


def test_results_come_back_in_item_order_computed_here_and_in_a_worker():
    out = pool_map(square_and_pid, range(11), n_workers=2)
    assert [v for v, _ in out] == [x * x for x in range(11)]
    pids = {pid for _, pid in out}
    assert os.getpid() in pids and len(pids) == 2


def test_a_worker_computes_what_this_process_would_on_one_thread():
    here = [matmul_sum_and_threads(s) for s in range(4)]
    shared = pool_map(matmul_sum_and_threads, range(4), n_workers=2)
    assert [v for v, _ in shared] == pytest.approx([v for v, _ in here], rel=1e-6)
    assert {t for _, t in shared} == {1}


def test_dealing_round_robin_and_by_weight():
    assert deal(5, 2) == [[0, 2, 4], [1, 3]]
    shares = deal(4, 2, weights=[68, 85, 8, 57])  # heaviest first, to the least loaded
    assert shares == [[1, 2], [0, 3]]


def test_a_failing_worker_raises_here():
    with pytest.raises(ValueError, match="bad item 3"):
        pool_map(functools.partial(fails_on, 3), range(4), n_workers=2)  # item 3 is the worker's (odd items)


def test_workers_from_the_environment(monkeypatch):
    monkeypatch.setenv("SPECDEC_TEST_WORKERS", "1")
    assert workers() == 1
    assert {pid for _, pid in pool_map(square_and_pid, range(4))} == {os.getpid()}
    monkeypatch.delenv("SPECDEC_TEST_WORKERS")
    assert 1 <= workers() <= 2


def dies(x: int) -> int:
    if x % 2:
        os._exit(3)
    return x


def test_a_worker_that_dies_fails_the_call_and_the_next_call_gets_a_new_pool():
    from concurrent.futures.process import BrokenProcessPool

    with pytest.raises(BrokenProcessPool):
        pool_map(dies, range(4), n_workers=2)
    assert pool_map(square_and_pid, range(4), n_workers=2)[3][0] == 9


def loaded_here() -> str:
    return f"loaded in {os.getpid()}"


def what_per_process_gives(_: int) -> tuple[str, int]:
    return per_process("unit-test object", loaded_here), os.getpid()


def test_a_lent_object_is_used_here_and_a_worker_loads_its_own():
    with lend("unit-test object", "lent"):
        out = pool_map(what_per_process_gives, range(4), n_workers=2)
    assert {v for v, pid in out if pid == os.getpid()} == {"lent"}
    assert {v for v, pid in out if pid != os.getpid()} == {f"loaded in {pid}" for _, pid in out if pid != os.getpid()}
    assert per_process("unit-test object", lambda: "after") == "after"  # the loan ended with the block
