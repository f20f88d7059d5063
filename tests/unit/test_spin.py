"""specdec/spin.py: the event loop polls only inside expected windows, stops at an event or the window's end,
and sleeps otherwise; the auto setting; the CPU budget it is judged against."""

from __future__ import annotations

import asyncio
import math
import socket
import threading
import time

import pytest

from specdec import spin
from specdec.models.cpu_info import cpu_budget_cores, usable_cores


@pytest.fixture
def pair():
    """A connected socket pair: the selector watches `a`; writing to `b` makes `a` readable."""
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def selector_on(sock: socket.socket, max_spin_s: float) -> spin.SpinSelector:
    sel = spin.SpinSelector(max_spin_s)
    sel.register(sock, spin.selectors.EVENT_READ)
    return sel


def write_later(sock: socket.socket, delay_s: float) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(delay_s), sock.send(b"x")))
    thread.start()
    return thread


def test_without_a_window_the_selector_sleeps_and_never_polls(pair):
    a, b = pair
    sel = selector_on(a, 0.5)
    assert sel.select(0.01) == []
    write_later(b, 0.01).join()
    assert len(sel.select(1.0)) == 1
    assert (sel.stats.windows, sel.stats.caught, sel.stats.missed, sel.stats.spun_s) == (0, 0, 0, 0.0)


def test_an_event_inside_a_window_is_caught_while_polling(pair):
    a, b = pair
    sel = selector_on(a, 0.5)
    now = time.monotonic()
    sel.expect(now, now + 0.5)
    writer = write_later(b, 0.02)
    ready = sel.select(None)
    writer.join()
    assert len(ready) == 1
    assert sel.stats.caught == 1 and sel.stats.missed == 0
    assert 0.0 < sel.stats.spun_s < 0.5


def test_a_window_without_an_event_polls_to_its_end_then_sleeps_to_the_timeout(pair):
    a, _ = pair
    sel = selector_on(a, 0.5)
    now = time.monotonic()
    sel.expect(now, now + 0.02)
    began = time.monotonic()
    assert sel.select(0.1) == []
    assert time.monotonic() - began >= 0.1 - 1e-3  # the timeout still holds
    assert sel.stats.missed == 1 and sel.stats.caught == 0
    assert 0.015 < sel.stats.spun_s < 0.1  # polled for the window, slept for the rest
    polled = sel.stats.spun_s
    assert sel.select(0.005) == []
    assert sel.stats.spun_s == polled and sel.windows == []  # an ended window is dropped, never polled again


def test_a_later_window_sleeps_until_its_start_and_a_timeout_before_it_is_plain_sleep(pair):
    a, b = pair
    sel = selector_on(a, 0.5)
    now = time.monotonic()
    sel.expect(now + 0.05, now + 0.3)
    assert sel.select(0.01) == []  # the timeout comes before the window: no polling
    assert sel.stats.spun_s == 0.0
    writer = write_later(b, 0.1)
    assert len(sel.select(None)) == 1  # slept to the window's start, then polled
    writer.join()
    assert sel.stats.caught == 1 and 0.0 < sel.stats.spun_s < 0.3


def test_sleeping_toward_a_later_window_never_wakes_after_its_start():
    # epoll_wait takes whole milliseconds and Python rounds a float timeout up: 10.5 ms would sleep 11
    assert spin.sleep_before(0.0105) == 0.010
    assert spin.sleep_before(0.0009) == 0.0 and spin.sleep_before(0.002) == 0.002
    for gap in (0.0001, 0.0049, 0.0333, 1.2345):
        slept = spin.sleep_before(gap)
        assert slept <= gap and math.ceil(slept * 1000 - 1e-9) / 1000 <= gap


def test_windows_are_cut_to_the_bound_cancelled_ones_end_and_a_zero_bound_ignores_them(pair):
    a, _ = pair
    sel = selector_on(a, 0.01)
    now = time.monotonic()
    window = sel.expect(now, now + 10.0)
    assert window.end == pytest.approx(now + 0.01)
    window.cancel()
    assert sel.select(0.0) == [] and sel.select(0.01) == []
    assert sel.stats.spun_s == 0.0  # a cancelled window does not poll
    off = selector_on(a, 0.0)
    off.expect(now, now + 1.0)
    assert off.windows == [] and off.stats.windows == 0


def test_expect_is_a_no_op_until_a_spinning_loop_is_configured(monkeypatch):
    monkeypatch.setattr(spin, "_selector", None)
    assert spin.expect_soon(0.01) is None and spin.stats() is None
    loop = spin.new_loop()
    try:
        assert spin.expect_soon(0.01) is None  # made, but bound 0 until configured
        spin.configure(2000)
        window = spin.expect_soon(0.001)
        assert window is not None and window.end - window.start == pytest.approx(0.001)
        longer = spin.expect_soon(0.01)
        assert longer.end - longer.start == pytest.approx(0.002)  # cut to the 2,000 µs bound
        spin.configure(0)
        assert spin.expect_soon(0.01) is None
    finally:
        loop.close()
        monkeypatch.setattr(spin, "_selector", None)


def test_a_spinning_loop_runs_asyncio_code_and_catches_a_socket_answer(monkeypatch, pair):
    """The loop a service runs on (cli: asyncio.Runner(loop_factory=spin.new_loop)) with a window open while
    an answer is due: the reader gets it and the loop counts it caught."""
    a, b = pair
    monkeypatch.setattr(spin, "_selector", None)
    loop = spin.new_loop()
    spin.configure(500_000)
    try:

        async def main():
            reader, _ = await asyncio.open_connection(sock=a)
            spin.expect_soon(0.5)
            writer = write_later(b, 0.02)
            data = await reader.read(1)
            writer.join()
            return data

        assert loop.run_until_complete(main()) == b"x"
        assert spin.stats().caught >= 1
    finally:
        loop.close()
        monkeypatch.setattr(spin, "_selector", None)


@pytest.mark.parametrize(
    "configured, role, threads, cores, expected",
    [
        (-1, "orchestrator", 0, 0.0, spin.SPIN_AUTO_US),
        (-1, "target", 1, 2.0, spin.SPIN_AUTO_US),  # a core is free beside the forward
        (-1, "target", 2, 2.0, 0),  # every core in the forward: never poll
        (-1, "draft", 4, 3.5, 0),  # a CPU limit below the threads
        (0, "orchestrator", 0, 0.0, 0),
        (750, "target", 8, 2.0, 750),  # set explicitly: as set
    ],
)
def test_auto_polls_in_the_orchestrator_and_where_the_torch_threads_leave_a_core(
    configured, role, threads, cores, expected
):
    assert spin.auto_spin_us(configured, role, threads, cores) == expected


@pytest.mark.parametrize(
    "content, expected", [("max 100000\n", None), ("150000 100000\n", 1.5), ("50000 100000\n", 0.5), ("garbage", None)]
)
def test_the_cpu_budget_is_the_cgroup_quota_where_one_is_set(tmp_path, content, expected):
    path = tmp_path / "cpu.max"
    path.write_text(content)
    cores = usable_cores()
    assert cpu_budget_cores(str(path)) == (cores if expected is None else min(cores, expected))
    assert cpu_budget_cores(str(tmp_path / "absent")) == cores
