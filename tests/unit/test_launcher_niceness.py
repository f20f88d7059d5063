"""LocalStack's children run in sessions of their own; under autogroup scheduling they must keep `nice`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdec.launcher import inherit_niceness

AUTOGROUP = Path("/proc/self/autogroup")


@pytest.mark.skipif(not AUTOGROUP.exists(), reason="no autogroup scheduling on this kernel")
def test_a_child_in_its_own_session_gets_our_niceness_as_its_autogroups():
    code = (
        "import subprocess, sys, time\n"
        "from specdec.launcher import inherit_niceness\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'], start_new_session=True)\n"
        "try:\n"
        "    print(inherit_niceness(p.pid), open(f'/proc/{p.pid}/autogroup').read().split()[-1])\n"
        "finally:\n"
        "    p.kill()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    niced = subprocess.run(
        ["nice", "-n", "7", sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert niced.stdout.split() == ["True", str(min(19, os.nice(0) + 7))], niced.stdout + niced.stderr


def test_nothing_is_written_when_we_are_not_niced(monkeypatch):
    monkeypatch.setattr(os, "nice", lambda inc: 0)
    assert inherit_niceness(os.getpid()) is False
