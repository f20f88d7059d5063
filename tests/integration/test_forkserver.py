"""Services forked from the fork server (specdec/forkserver.py) are processes of their own, as exec'd ones.

The suite starts its stacks this way (tests/conftest.py); this checks what that must keep from
`python -m specdec.cli serve`: a pid, session and log file of its own, the environment it was given (a
SPECDEC_ variable the server never had reaches the service's config), exit codes as subprocess reports them
(0 after SIGTERM's drain, -9 after SIGKILL, 2 for a model that cannot load, with the message in its log),
and `exec` wherever the environment differs in what a preloaded module may have read at import.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import grpc
import pytest

from specdec import forkserver
from specdec.launcher import LocalStack, StackConfig
from specdec.v1 import common_pb2, orchestrator_pb2, orchestrator_pb2_grpc, target_pb2_grpc

pytestmark = [pytest.mark.integration]

RPC_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
MAX_BATCH = "3"  # the services' default is 8: this value can only come from the environment
EXIT_LOAD_ERROR = 2  # specdec.cli's exit code for a model that cannot be loaded


def _parent(pid: int) -> int:
    """The parent pid of `pid` (/proc/PID/stat's fourth field; the name in parentheses may hold spaces)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.fixture
def forking(monkeypatch):
    monkeypatch.setenv(forkserver.START_METHOD_ENV, forkserver.FORKSERVER)


def test_forked_services_are_processes_of_their_own(forking, redis_server, tmp_path):
    cfg = StackConfig(
        target_model="embedded",
        draft_kind="ngram",
        redis_url=redis_server.url,
        log_dir=str(tmp_path),
        extra_env={"SPECDEC_MAX_BATCH": MAX_BATCH},
    )
    with LocalStack(cfg) as stack:
        server_pid = forkserver._server.popen.pid
        for proc in stack.procs:
            assert isinstance(proc.popen, forkserver.ForkedProcess), proc.role
            assert _parent(proc.popen.pid) == server_pid and os.getsid(proc.popen.pid) == proc.popen.pid
            assert "listening on" in proc.log_path.read_text(), proc.role
            with pytest.raises(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=0.1)
        target = stack.targets[0]
        with grpc.insecure_channel(target.address) as channel:
            info = target_pb2_grpc.TargetStub(channel).Info(common_pb2.InfoRequest(), timeout=RPC_TIMEOUT_S)
        assert info.max_batch == int(MAX_BATCH)
        with grpc.insecure_channel(stack.orchestrator_address) as channel:
            reply = orchestrator_pb2_grpc.OrchestratorStub(channel).Generate(
                orchestrator_pb2.GenerateRequest(prompt="The capital of France is", k=3, max_new_tokens=8),
                timeout=RPC_TIMEOUT_S,
            )
        assert len(reply.token_ids) > 0

        other = stack.start_target(env={"OMP_NUM_THREADS": "1"})  # read when torch loads: not forkable
        assert isinstance(other.popen, subprocess.Popen)
        stack.wait_ready(other)
        os.kill(target.popen.pid, signal.SIGKILL)
        assert target.popen.wait(timeout=STOP_TIMEOUT_S) == -signal.SIGKILL
        orchestrator = stack.orchestrator
        orchestrator.popen.send_signal(signal.SIGTERM)
        assert orchestrator.popen.wait(timeout=STOP_TIMEOUT_S) == 0
        assert "stopped" in orchestrator.log_path.read_text()


def test_a_forked_service_that_cannot_load_its_model_exits_2_with_the_reason(forking, redis_server, tmp_path):
    missing = tmp_path / "no-such-model"
    stack = LocalStack(StackConfig(target_model=str(missing), redis_url=redis_server.url, log_dir=str(tmp_path)))
    try:
        proc = stack.start_target()
        assert isinstance(proc.popen, forkserver.ForkedProcess)
        with pytest.raises(RuntimeError, match=f"exited \\({EXIT_LOAD_ERROR}\\)") as failed:
            stack.wait_ready(proc)
        assert f"local model directory {missing} does not exist" in str(failed.value)
    finally:
        stack.stop()
