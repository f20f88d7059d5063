"""specdec/forkserver.py without a server: which start method is asked for, which environments may be forked,
and a fork whose server is gone."""

from __future__ import annotations

import os
import signal
import socket
import subprocess

import pytest

from specdec import forkserver


@pytest.fixture
def no_server(monkeypatch):
    """forkable() against this process's environment (no fork server started yet)."""
    monkeypatch.setattr(forkserver, "_server", None)


def test_start_method_defaults_to_exec_and_refuses_unknown_names(monkeypatch):
    monkeypatch.delenv(forkserver.START_METHOD_ENV, raising=False)
    assert forkserver.start_method() == forkserver.EXEC
    monkeypatch.setenv(forkserver.START_METHOD_ENV, "forkserver")
    assert forkserver.start_method() == forkserver.FORKSERVER
    monkeypatch.setenv(forkserver.START_METHOD_ENV, "spawn")
    with pytest.raises(ValueError, match="SPECDEC_START_METHOD='spawn'"):
        forkserver.start_method()


def test_only_specdec_variables_may_differ_from_the_servers_environment(no_server, monkeypatch):
    monkeypatch.setenv("HOME", "/home/x")
    base = dict(os.environ)
    assert forkserver.forkable(base)
    assert forkserver.forkable(
        {**base, "SPECDEC_MAX_BATCH": "3", "PYTHONUNBUFFERED": "1", "PYTEST_CURRENT_TEST": "t.py::x (call)"}
    )
    assert not forkserver.forkable({**base, "OMP_NUM_THREADS": "1"})  # read when torch loads
    assert not forkserver.forkable({**base, "HOME": "/elsewhere"})
    assert not forkserver.forkable({k: v for k, v in base.items() if k != "HOME"})
    monkeypatch.setenv("SPECDEC_LEASE_SECONDS", "9")
    assert forkserver.forkable({k: v for k, v in os.environ.items() if k != "SPECDEC_LEASE_SECONDS"})


def test_a_service_whose_fork_server_died_is_watched_by_its_pid():
    """The server reaps its forks and reports their exit codes; if it is gone first, a fork is an orphan (init
    reaps it): poll() watches the pid, and a stopped orphan reads ORPHAN_EXIT."""
    orphan = subprocess.run(
        ["bash", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True
    )
    pid = int(orphan.stdout)
    ours, servers = socket.socketpair()
    servers.close()  # the server died without a word
    proc = forkserver.ForkedProcess(["sleep", "60"], pid, ours)
    try:
        assert proc.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.2)
    finally:
        proc.kill()
    assert proc.wait(timeout=10) == forkserver.ORPHAN_EXIT == -signal.SIGKILL
