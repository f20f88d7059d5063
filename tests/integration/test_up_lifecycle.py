"""`specdec up` as a user runs it: its processes end with it however it ends, Ctrl-C drains in order, the
temporary log folder goes at exit.

Each test starts `python -m specdec.cli up` in a session of its own (as a shell runs a command in the foreground),
finds its processes (Redis, target, draft, orchestrator, HTTP gateway, and the fork server's services where that
start method is used) by pid while it runs, ends it, and looks for them again.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import psutil
import pytest

from specdec import forkserver
from specdec.launcher import LocalStack, StackConfig
from specdec.redis_server import free_port
from specdec.v1 import orchestrator_pb2 as pb
from specdec.v1 import orchestrator_pb2_grpc

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 300.0
GONE_WITHIN_S = 5.0  # every process of the stack has ended this long after its parent did
DRAIN_EXIT_TIMEOUT_S = 90.0  # `specdec up` after Ctrl-C: the stream finishes, then everything stops in order
STACK_ROLES = 5  # redis-server, target, draft, orchestrator, http
STREAM_TOKENS = 160
TOKENS_BEFORE_CTRL_C = 8
RPC_TIMEOUT_S = 120.0
POLL_S = 0.1


class Up:
    """One `specdec up` process: its output so far and the pids of what it started."""

    def __init__(self, start_method: str) -> None:
        self.port, self.http_port = free_port(), free_port()
        env = {**os.environ, forkserver.START_METHOD_ENV: start_method, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "specdec.cli", "up", "--port", str(self.port), "--http-port", str(self.http_port)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output = ""
        threading.Thread(target=lambda: [self.lines.put(ln) for ln in self.proc.stdout], daemon=True).start()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._read_line().startswith("OpenAI-compatible API:"):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"specdec up exited with {self.proc.returncode}:\n{self.output}")
        raise TimeoutError(f"specdec up not ready after {READY_TIMEOUT_S} s:\n{self.output}")

    def _read_line(self) -> str:
        try:
            line = self.lines.get(timeout=0.5)
        except queue.Empty:
            return ""
        self.output += line
        return line

    def drain_output(self) -> str:
        while self._read_line():
            pass
        return self.output

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)

    def log_dir(self) -> Path:
        return Path(re.search(r"log: (\S+)/orchestrator-\d+\.log", self.output).group(1))

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def still_running(procs: list[psutil.Process], within: float) -> list[str]:
    """The processes of `procs` still running after `within` seconds (zombies count as ended)."""
    deadline = time.monotonic() + within
    while True:
        alive = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() >= deadline:
            return [" ".join(p.cmdline()[:6]) for p in alive]
        time.sleep(POLL_S)


def _end(procs: list[psutil.Process]) -> None:
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


@pytest.mark.parametrize(
    "sig,start_method",
    [
        (signal.SIGHUP, forkserver.EXEC),  # the terminal closed
        (signal.SIGKILL, forkserver.EXEC),  # no handler runs at all
        (signal.SIGKILL, forkserver.FORKSERVER),  # the services are forks of the fork server, not children of `up`
    ],
)
def test_every_process_of_the_stack_ends_with_specdec_up(sig, start_method):
    up = Up(start_method)
    procs: list[psutil.Process] = []
    try:
        up.wait_ready()
        procs = up.descendants()
        assert len(procs) >= STACK_ROLES, [p.cmdline() for p in procs]
        os.kill(up.proc.pid, sig)
        up.proc.wait(timeout=DRAIN_EXIT_TIMEOUT_S)
        left = still_running(procs, GONE_WITHIN_S)
        assert not left, f"still running {GONE_WITHIN_S} s after `specdec up` got {sig.name}: {left}"
    finally:
        up.kill()
        _end(procs)


def _stream(port: int, chunks: queue.Queue) -> None:
    """A long greedy stream; puts each chunk, then the error or None."""
    req = pb.GenerateRequest(
        prompt="Write a long story about a lighthouse keeper.",
        k=0,
        max_new_tokens=STREAM_TOKENS,
        min_tokens=STREAM_TOKENS,
    )
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            for chunk in orchestrator_pb2_grpc.OrchestratorStub(channel).GenerateStream(req, timeout=RPC_TIMEOUT_S):
                chunks.put(chunk)
            chunks.put(None)
        except grpc.RpcError as exc:
            chunks.put(exc)


def test_ctrl_c_lets_the_stream_in_flight_finish_then_stops_in_order_and_removes_its_logs():
    up = Up(forkserver.EXEC)
    procs: list[psutil.Process] = []
    try:
        up.wait_ready()
        procs, log_dir = up.descendants(), up.log_dir()
        assert log_dir.is_dir()
        chunks: queue.Queue = queue.Queue()
        threading.Thread(target=_stream, args=(up.port, chunks), daemon=True).start()
        tokens, end = 0, None
        while tokens < TOKENS_BEFORE_CTRL_C:
            chunk = chunks.get(timeout=RPC_TIMEOUT_S)
            assert isinstance(chunk, pb.GenerateChunk), chunk
            tokens += len(chunk.token_ids)
        os.killpg(up.proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals its foreground process group
        while end is None:
            item = chunks.get(timeout=RPC_TIMEOUT_S)
            if not isinstance(item, pb.GenerateChunk):
                end = item
                break
            tokens += len(item.token_ids)
        if isinstance(end, grpc.RpcError):
            assert end.code() == grpc.StatusCode.CANCELLED, f"{end.code().name}: {end.details()}"
        else:
            assert tokens == STREAM_TOKENS
        assert up.proc.wait(timeout=DRAIN_EXIT_TIMEOUT_S) == 0, up.drain_output()
        assert not still_running(procs, GONE_WITHIN_S)
        assert not log_dir.exists(), f"{log_dir} left behind"
    finally:
        up.kill()
        _end(procs)


def test_a_stack_that_failed_keeps_its_logs_and_says_where(redis_server, tmp_path, caplog):
    stack = LocalStack(StackConfig(target_model=str(tmp_path / "no-such-model"), redis_url=redis_server.url))
    try:
        with pytest.raises(RuntimeError, match="exited"):
            stack.start()
        stack.stop()
        assert stack.log_dir.is_dir() and any(stack.log_dir.iterdir())
        assert str(stack.log_dir) in caplog.text
    finally:
        shutil.rmtree(stack.log_dir, ignore_errors=True)


def test_a_stack_that_ran_well_removes_its_temporary_logs_but_not_a_given_folder(redis_server, tmp_path):
    for log_dir, kept in (("", False), (str(tmp_path), True)):
        stack = LocalStack(StackConfig(redis_url=redis_server.url, log_dir=log_dir))
        nobody = f"127.0.0.1:{free_port()}"  # no target answers there: the orchestrator runs NOT_SERVING
        proc = stack._spawn(
            "orchestrator", ["--target", nobody, "--redis-url", redis_server.url, "--tokenizer", "embedded"]
        )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while "listening on" not in LocalStack.tail(proc) and time.monotonic() < deadline:
            assert proc.popen.poll() is None, LocalStack.tail(proc)
            time.sleep(POLL_S)
        stack.stop()
        assert proc.popen.returncode == 0, LocalStack.tail(proc)
        assert stack.log_dir.exists() == kept, stack.log_dir
