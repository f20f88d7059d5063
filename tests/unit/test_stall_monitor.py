"""The suite's stall monitor (tests/stall_monitor.py) records a process that was not run, and only then."""

from __future__ import annotations

import os
import subprocess
import time

from tests.stall_monitor import STALL_S, StallMonitor, describe


def test_a_stopped_process_is_recorded_as_a_stall_with_its_test():
    monitor = StallMonitor()
    monitor.current = "the test"
    monitor.start()
    try:
        time.sleep(1.0)
        assert monitor.stalls == []  # awake and idle: nothing recorded
        since = time.time()
        stop_s = STALL_S + 1.0
        subprocess.run(["sh", "-c", f"kill -STOP {os.getpid()}; sleep {stop_s}; kill -CONT {os.getpid()}"], check=True)
        time.sleep(0.5)
    finally:
        monitor.stop()
    (stall,) = monitor.during(since)
    assert STALL_S < stall.seconds <= stop_s + 0.5 and stall.test == "the test"
    assert "during the test" in describe(stall)
