"""tests/fork_map.py: work split across forks of the test process comes back whole, in order, and a fork's
failure reaches the test."""

from __future__ import annotations

import os
import time

import pytest
import torch

from tests.fork_map import ForkedWorkError, InBackground, deal, fork_map, workers


def test_results_come_back_in_item_order_and_are_computed_in_forks():
    out = fork_map(lambda x: (x * x, os.getpid()), range(11), n_workers=3)
    assert [v for v, _ in out] == [x * x for x in range(11)]
    pids = {pid for _, pid in out}
    assert os.getpid() in pids and len(pids) == 3     # this process took a share, two forks the rest


def test_state_built_before_the_fork_is_seen_by_the_forks():
    table = {i: f"row{i}" for i in range(6)}          # e.g. a model the test built: no pickling, inherited
    assert fork_map(table.__getitem__, [5, 0, 3], n_workers=2) == ["row5", "row0", "row3"]


def test_dealing_round_robin_and_by_weight():
    assert deal(5, 2) == [[0, 2, 4], [1, 3]]
    shares = deal(4, 2, weights=[68, 85, 8, 57])       # heaviest first, to the least loaded
    assert shares == [[1, 2], [0, 3]]
    assert sorted(i for share in shares for i in share) == [0, 1, 2, 3]


def test_a_failing_fork_raises_with_its_traceback():
    def fn(x):
        if x == 3:
            raise ValueError("bad item three")
        return x

    with pytest.raises(ForkedWorkError, match="bad item three"):
        fork_map(fn, range(4), n_workers=2)           # item 3 is the fork's (odd items)


def test_a_fork_that_dies_is_reported_not_waited_for_forever():
    with pytest.raises(ForkedWorkError, match="died without an answer"):
        fork_map(lambda x: os._exit(3) if x % 2 else x, range(4), n_workers=2)


def test_a_fork_past_its_deadline_is_killed():
    with pytest.raises(ForkedWorkError, match="deadline"):
        fork_map(lambda x: time.sleep(60) if x else x, range(2), n_workers=2, timeout_s=0.5)


def test_in_background_returns_results_and_close_reaps_an_unread_fork():
    with InBackground(lambda x: x + 1, [1, 2, 3]) as refs:
        assert refs.results() == [2, 3, 4]
    unread = InBackground(lambda x: [0] * 1_000_000, range(3))   # larger than a pipe: the fork blocks writing
    pid = unread._fork[0]
    unread.close()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)                   # already reaped


def test_workers_from_the_environment(monkeypatch):
    monkeypatch.setenv("SPECDEC_TEST_WORKERS", "1")
    assert workers() == 1
    assert fork_map(lambda x: os.getpid(), range(4)) == [os.getpid()] * 4
    monkeypatch.delenv("SPECDEC_TEST_WORKERS")
    assert 1 <= workers() <= 2


def test_a_fork_runs_torch_even_after_this_process_ran_it_on_several_threads():
    """libgomp's pool is copied into a fork without its threads: at the parent's team size, the fork's first
    parallel region would wait for them forever. The forks run one thread."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        a = torch.randn(256, 256)
        (a @ a).sum()                                    # a team of two now exists in this thread
        out = fork_map(lambda _: (float((a @ a).sum()), torch.get_num_threads()), range(2), n_workers=2)
    finally:
        torch.set_num_threads(threads)
    assert out[0][0] == pytest.approx(out[1][0], rel=1e-4) and out[1][1] == 1
