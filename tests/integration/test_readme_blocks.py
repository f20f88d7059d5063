"""Every README code block without a `<!-- not run: reason -->` marker runs, as written, against ONE
stack started by the README's own `specdec up` line (only its ports are swapped for free ones).

The blocks run in README order from the repository root, a bash block command by command (each in
`bash -e -o pipefail`), a python block as one script; each must exit 0, print something and print
no traceback. Curl answers must be OpenAI-shaped JSON.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from specdec import forkserver
from specdec.redis_server import free_port
from tests.readme_support import HTTP_ADDRESS, ORCH_ADDRESS, README, ROOT, Block, code_blocks

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STACK_READY_S = 300.0
BLOCK_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
BLOCKS = [b for b in code_blocks(README.read_text()) if b.not_run is None and b.lang in ("bash", "python")]
UP = next(b for b in BLOCKS if "specdec up" in b.code)
RUN = [b for b in BLOCKS if b is not UP]


def _commands(block: Block) -> list[Block]:
    """A bash block split into its commands (continuation lines joined): one test each, so no test
    waits for several generations; the README's run blocks share no shell state (test_readme.py)."""
    if block.lang != "bash":
        return [block]
    out, current = [], ""
    for line in block.code.splitlines():
        current += line + "\n"
        if not line.rstrip().endswith("\\"):
            if current.strip() and not current.lstrip().startswith("#"):
                out.append(Block(block.lang, current.rstrip(), block.line, None))
            current = ""
    return out


CASES = [(c, n) for b in RUN for n, c in enumerate(_commands(b), 1)]


def _local(code: str, orch_port: int, http_port: int) -> str:
    """The block with the README's fixed ports replaced by this test's free ones."""
    return (
        code.replace(ORCH_ADDRESS, f"127.0.0.1:{orch_port}")
        .replace(HTTP_ADDRESS, f"127.0.0.1:{http_port}")
        .replace("--port 50050", f"--port {orch_port}")
        .replace("--http-port 8000", f"--http-port {http_port}")
    )


def _wait_ready(proc: subprocess.Popen, timeout: float) -> str:
    """`specdec up`'s output up to its line with the HTTP address (the last one it prints when ready)."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout], daemon=True).start()
    seen, deadline = "", time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            if proc.poll() is not None:
                raise RuntimeError(f"specdec up exited with {proc.returncode}:\n{seen}") from None
            continue
        seen += line
        if line.startswith("OpenAI-compatible API:"):
            return seen
    raise TimeoutError(f"specdec up not ready after {timeout} s:\n{seen}")


@pytest.fixture(scope="module")
def stack():
    """The README's `specdec up` line, run as written on free ports, until the module ends."""
    orch_port, http_port = free_port(), free_port()
    cmd = _local(UP.code.strip(), orch_port, http_port)
    assert str(orch_port) in cmd and str(http_port) in cmd, cmd
    env = {**os.environ, forkserver.START_METHOD_ENV: forkserver.EXEC}  # as a user runs it (tests/conftest.py)
    proc = subprocess.Popen(
        ["bash", "-c", f"exec {cmd}"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=env,
    )
    try:
        _wait_ready(proc, STACK_READY_S)
        yield orch_port, http_port
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # `specdec up` stops every process it started on Ctrl-C
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _run(block, orch_port: int, http_port: int) -> subprocess.CompletedProcess:
    code = _local(block.code, orch_port, http_port)
    argv = ["bash", "-e", "-o", "pipefail", "-c", code] if block.lang == "bash" else [sys.executable, "-c", code]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)


@pytest.mark.parametrize("block", [c for c, _ in CASES], ids=[f"line{c.line}-{c.lang}-{n}" for c, n in CASES])
def test_readme_block_runs(stack, block) -> None:
    done = _run(block, *stack)
    report = f"README line {block.line}:\n{block.code}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    assert done.returncode == 0, report
    assert done.stdout.strip(), report
    assert "Traceback" not in done.stderr + done.stdout, report
    if block.code.lstrip().startswith("curl"):
        answer = json.loads(done.stdout)
        assert answer["choices"] and answer["usage"]["completion_tokens"] > 0, report


def test_blocks_reach_only_this_stack(stack) -> None:
    """After the port swap no run block points at any address but this test's stack."""
    ports = {str(p) for p in stack}
    for block in RUN:
        used = set(re.findall(r"(?:127\.0\.0\.1|localhost):(\d+)", _local(block.code, *stack)))
        assert used <= ports, f"README line {block.line} reaches {used - ports}"
