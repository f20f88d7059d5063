"""Start the gateway as its own process (`python -m specdec.cli serve http ...`) and wait for /health.

Used by `specdec up` and the integration tests, next to specdec.launcher.LocalStack.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdec import children
from specdec.redis_server import free_port

READY_TIMEOUT_S = 60.0
POLL_S = 0.2
STOP_TIMEOUT_S = 10.0


def get_health(url: str, timeout: float = 2.0) -> tuple[int, dict]:
    """(HTTP status, body) of GET {url}/health; (0, {error}) when nothing answers."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
    except (OSError, ValueError) as exc:
        return 0, {"error": str(exc)}


@dataclass
class GatewayProcess:
    """One `specdec serve http` process in front of `orchestrator`."""

    orchestrator: str
    port: int = 0  # 0: a free port
    host: str = "127.0.0.1"
    log_dir: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return Path(self.log_dir or os.environ.get("TMPDIR", "/tmp")) / f"http-{self.port}.log"

    def start(self, wait: bool = True, timeout: float = READY_TIMEOUT_S) -> GatewayProcess:
        self.port = self.port or free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.extra_env}
        cmd = [
            sys.executable,
            "-m",
            "specdec.cli",
            "serve",
            "http",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--orchestrator",
            self.orchestrator,
        ]
        self.popen = children.popen(
            cmd, stdout=self.log_path.open("wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Until /health answers 200 (the orchestrator behind it is SERVING)."""
        assert self.popen is not None, "start() ran first"
        deadline = time.monotonic() + timeout
        last: tuple[int, dict[str, Any]] = (0, {})
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"http gateway exited ({self.popen.returncode}):\n{self.tail()}")
            last = get_health(self.url)
            if last[0] == 200:
                return
            time.sleep(POLL_S)
        raise TimeoutError(f"http gateway on {self.url} not healthy after {timeout:.0f}s: {last}\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
