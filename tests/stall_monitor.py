"""A pytest plugin that records when the test process was not scheduled: a thread that wakes every
STEP_S and notes every wake-up more than STALL_S late, with the test running at the time, the load
average and the CPU time the hypervisor took (steal, /proc/stat) during the gap.

Why: a deadline that fires in a test (a gRPC DEADLINE_EXCEEDED) is either a hang in our code or a
machine that stopped running us (a shared CI host). The gaps tell them apart: a stall shows up here
as a late wake-up (a thread of ours holding the GIL would show up too, and be named by the test),
a hang in our code does not. Failing tests get the stalls seen during them as a report section; the
terminal summary lists the largest ones.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import pytest

STEP_S = 0.25  # how often the monitor wakes
STALL_S = 2.0  # a wake-up this much later than asked is recorded
SUMMARY_STALLS = 5  # the largest stalls listed at the end of the run


@dataclass
class Stall:
    started: float  # wall clock (time.time) when the late wake-up was due
    seconds: float  # how late it was
    test: str
    load: str  # /proc/loadavg's first three figures after the gap
    steal_pct: float  # share of the gap's CPU time the hypervisor took (-1: unknown)


def _steal_and_total() -> tuple[int, int]:
    """(steal, total) jiffies of all CPUs from /proc/stat ((0, 0) where there is none)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return (fields[7] if len(fields) > 7 else 0), sum(fields)


def _load() -> str:
    try:
        with open("/proc/loadavg", encoding="ascii") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


class StallMonitor:
    def __init__(self) -> None:
        self.current = "(between tests)"
        self.stalls: list[Stall] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        steal, total = _steal_and_total()
        due = time.monotonic() + STEP_S
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            now = time.monotonic()
            late = now - due
            new_steal, new_total = _steal_and_total()
            if late > STALL_S:
                share = (new_steal - steal) / (new_total - total) * 100 if new_total > total else -1.0
                self.stalls.append(Stall(time.time() - late, late, self.current, _load(), share))
            steal, total = new_steal, new_total
            due = now + STEP_S

    def during(self, since: float) -> list[Stall]:
        return [s for s in self.stalls if s.started >= since]


def describe(stall: Stall) -> str:
    steal = f", steal {stall.steal_pct:.0f} %" if stall.steal_pct >= 0 else ""
    return (
        f"{stall.seconds:.1f} s at {time.strftime('%H:%M:%S', time.localtime(stall.started))} "
        f"during {stall.test} (load {stall.load}{steal})"
    )


_monitor = StallMonitor()
_started = pytest.StashKey[float]()  # when each test began (time.time), for its report's stalls


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("SPECDEC_STALL_MONITOR", "1") != "0":
        _monitor.start()


def pytest_unconfigure(config: pytest.Config) -> None:
    _monitor.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    _monitor.current = item.nodeid
    item.stash[_started] = time.time()
    yield
    _monitor.current = "(between tests)"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        stalls = _monitor.during(item.stash.get(_started, 0.0))
        text = "\n".join(describe(s) for s in stalls) or f"none over {STALL_S} s"
        report.sections.append(("process not scheduled (stall monitor)", text))


def pytest_terminal_summary(terminalreporter) -> None:
    stalls = sorted(_monitor.stalls, key=lambda s: -s.seconds)
    if not stalls:
        return
    terminalreporter.write_line(f"stall monitor: {len(stalls)} wake-ups over {STALL_S} s late; the largest:")
    for stall in stalls[:SUMMARY_STALLS]:
        terminalreporter.write_line(f"  {describe(stall)}")
