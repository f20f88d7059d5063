"""bench-load's per-service CPU accounting (specdec/bench/load.py): /proc readings and their deltas."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from specdec.bench.load_cpu import cpu_by_service, cpu_delta, process_cpu_s

BUSY_S = 0.3


def test_a_busy_child_shows_its_cpu_and_an_idle_one_none() -> None:
    spin = (
        "import sys, time\nsys.stdin.readline()\nt = time.process_time()\n"
        f"while time.process_time() - t < {BUSY_S}: pass\nprint('spun', flush=True)\ntime.sleep(30)"
    )
    busy = subprocess.Popen([sys.executable, "-c", spin], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        pids = {"target": busy.pid, "draft": idle.pid, "gone": 2**22 + 7}
        before = cpu_by_service(pids)
        assert before["gone"] is None
        assert busy.stdin is not None
        busy.stdin.write("go\n")
        busy.stdin.flush()
        assert busy.stdout is not None and busy.stdout.readline().strip() == "spun"
        spent = cpu_delta(before, cpu_by_service(pids))
        assert set(spent) == {"target", "draft"}  # an unreadable process is left out, not counted as 0
        assert spent["target"] >= BUSY_S - 0.05  # the spin, which starts after `before` is read
        assert spent["draft"] < spent["target"]
    finally:
        busy.kill()
        idle.kill()
        busy.wait()
        idle.wait()


def test_own_process_cpu_grows_with_work() -> None:
    start = process_cpu_s(os.getpid())
    assert start is not None
    t = time.process_time()
    while time.process_time() - t < 0.2:
        pass
    assert process_cpu_s(os.getpid()) - start >= 0.1
