"""Start service processes as forks of a server that has imported the services' code once.

`python -m specdec.cli serve ROLE` spends most of its start importing: torch, transformers and the Llama
modeling code take 6-9 s of CPU on the 2-core test machine, where loading the tiny test models takes well
under a second. A local stack pays that for every process, and the test suite starts about seventy. With
`SPECDEC_START_METHOD=forkserver`, `specdec.launcher.LocalStack` asks a fork server, which imported
PRELOAD once, for each service: the service is then a fork that runs what the command would,
`specdec.cli.main(["serve", ...])`, as a process of its own (its own pid, session, autogroup niceness, log
file, environment and sockets), stopped by the same signals.

A module imported by the server read the environment the server had, so only an environment that differs
from the server's in SPECDEC_* variables (read when a config is built, never at import) is forked;
anything else (OMP_NUM_THREADS, GOMP_SPINCOUNT, HF_*, ...) is started with `exec` as before (`forkable`).
The default start method stays `exec`: it is what a deployment runs; the test suite sets `forkserver`.
A fork copies the forking thread's state: torch keeps the OpenMP team size of the thread that imported it,
so a service sets its `--threads` on its main thread itself (specdec/server/model_service.settle_threads),
not only on the thread that loads the model.

The protocol, over a Unix socket per service: the client sends one request (argv, env, cwd, log path:
length-prefixed JSON); the server forks and answers the child's pid, then, when it has reaped the child,
its exit code (negative: killed by that signal, as subprocess reports it). The server exits when the
process that started it closes its stdin (it exited) or at SIGTERM, which it gets when that process ends
(specdec.children); each fork gets SIGTERM when the server ends, so the services end with the client.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import NoReturn

from specdec import children

START_METHOD_ENV = "SPECDEC_START_METHOD"
EXEC, FORKSERVER = "exec", "forkserver"
START_METHODS = (EXEC, FORKSERVER)
#: imported once by the fork server: everything a model service or an orchestrator imports to start.
PRELOAD = (
    "specdec",
    "torch",
    "transformers",
    "target_service.main",
    "draft_service.main",
    "orchestrator.main",
    "specdec.cli",
)
#: what loading a tokenizer imports on first use in transformers 5 (0.3 s an orchestrator); skipped where absent
PRELOAD_IF_PRESENT = ("transformers.tokenization_utils_tokenizers", "transformers.convert_slow_tokenizer")
#: environment variables a forked service may set differently from the server (read at call time only).
FORKABLE_PREFIX = "SPECDEC_"
FORKABLE_NAMES = frozenset({"PYTHONUNBUFFERED", "PYTEST_CURRENT_TEST"})  # the latter: pytest's, set per test
LISTEN_BACKLOG = 64
_INT = struct.Struct("!q")
_LEN = struct.Struct("!I")

#: the exit code reported for a child whose fork server died before it did (its real code went to init)
ORPHAN_EXIT = -signal.SIGKILL
ORPHAN_POLL_S = 0.05

_server: _ServerHandle | None = None
_server_lock = threading.Lock()


def start_method() -> str:
    """The start method asked for by SPECDEC_START_METHOD (default exec); refuses unknown names."""
    method = os.environ.get(START_METHOD_ENV, "") or EXEC
    if method not in START_METHODS:
        raise ValueError(f"{START_METHOD_ENV}={method!r}: expected one of {', '.join(START_METHODS)}")
    return method


def forkable(env: dict[str, str]) -> bool:
    """Whether a service with environment `env` may be forked from the server: it differs from the server's
    environment (this process's, for a server not yet started) only in SPECDEC_* and FORKABLE_NAMES."""
    base = _server.env if _server is not None else dict(os.environ)
    changed = {name for name in env.keys() | base.keys() if env.get(name) != base.get(name)}
    return all(name.startswith(FORKABLE_PREFIX) or name in FORKABLE_NAMES for name in changed)


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    """n bytes from conn, or b"" if it closed first."""
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            return b""
        data += chunk
    return data


def _alive(pid: int) -> bool:
    """Whether pid still runs (a child whose fork server died is reaped by init, so it disappears)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def inherit_niceness(pid: int) -> bool:
    """Give a child started in a session of its own (start_new_session) our niceness as its autogroup's.

    With the kernel's autogroup scheduling (/proc/sys/kernel/sched_autogroup_enabled = 1) every new
    session is its own scheduling group and groups share the CPU as equals whatever their processes'
    nice values: services started by a `nice -n 19` test or bench would compete with a timed benchmark
    at full weight. Writing our niceness to /proc/PID/autogroup restores what `nice` meant. Returns
    whether it was set (False: not niced, or no autogroup on this kernel)."""
    niceness = os.nice(0)
    if niceness <= 0:
        return False
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(niceness))
    except OSError:
        return False
    return True


class ForkedProcess:
    """The part of subprocess.Popen's interface that LocalStack, the bench and the tests use, for a service
    forked by the fork server (which reaps it and reports its exit code over `conn`)."""

    def __init__(self, args: list[str], pid: int, conn: socket.socket) -> None:
        self.args = args
        self.pid = pid
        self.returncode: int | None = None
        self._conn: socket.socket | None = conn  # None once read, or once the server is gone (then: _alive)

    def _read_exit(self, timeout: float | None) -> int | None:
        if self.returncode is None and self._conn is not None:
            self._conn.settimeout(timeout)
            try:
                data = _recv_exact(self._conn, _INT.size)
            except (BlockingIOError, TimeoutError):
                return None
            self._conn.close()
            self._conn = None
            if data:
                self.returncode = _INT.unpack(data)[0]
        if self.returncode is None and self._conn is None:  # the server died first: watch the pid itself
            deadline = None if timeout is None else time.monotonic() + timeout
            while _alive(self.pid):
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                time.sleep(ORPHAN_POLL_S)
            self.returncode = ORPHAN_EXIT
        return self.returncode

    def poll(self) -> int | None:
        return self._read_exit(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._read_exit(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _ServerHandle:
    """The client's side: the server process, its socket path and the environment it was started with."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="specdec-forkserver-"))
        self.path = str(self.dir / "socket")
        self.env = dict(os.environ)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(LISTEN_BACKLOG)
        with (self.dir / "server.log").open("ab") as log:
            self.popen = children.popen(
                [
                    sys.executable,
                    "-c",
                    "from specdec.forkserver import serve; serve()",
                    str(listener.fileno()),
                    str(self.dir),
                ],
                pass_fds=[listener.fileno()],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        listener.close()

    def fork(self, cmd: list[str], env: dict[str, str], log_path: Path) -> ForkedProcess:
        module = cmd.index("-m") + 1  # cmd: [python, "-m", MODULE, *argv]
        request = {
            "module": cmd[module],
            "argv": cmd[module + 1 :],
            "env": env,
            "cwd": os.getcwd(),
            "log_path": str(log_path),
        }
        body = json.dumps(request).encode()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        conn.sendall(_LEN.pack(len(body)) + body)
        data = _recv_exact(conn, _INT.size)  # the first answer waits for the server's imports
        if not data:
            conn.close()
            log = (self.dir / "server.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the fork server exited ({self.popen.poll()}):\n{log}")
        return ForkedProcess(cmd, _INT.unpack(data)[0], conn)


def spawn(cmd: list[str], env: dict[str, str], log_path: Path) -> ForkedProcess:
    """Fork `cmd` (`[python, "-m", MODULE, *argv]`: MODULE.main(argv) runs) from the fork server, logging to
    log_path."""
    global _server
    with _server_lock:
        if _server is None or _server.popen.poll() is not None:
            _server = _ServerHandle()
        server = _server
    return server.fork(cmd, env, log_path)


def _run_child(request: dict, server_pid: int) -> None:
    """In the fork: become the process `python -m MODULE ARGV` would have been, run MODULE.main(ARGV), exit."""
    os.setsid()  # a session of its own, as Popen(start_new_session=True)
    children.die_with(server_pid)  # the server forks on its main thread, which lives as long as it
    inherit_niceness(os.getpid())
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(request["log_path"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for fd, target in ((null, 0), (log, 1), (log, 2)):
        os.dup2(fd, target)
    os.close(null)
    os.close(log)
    # the process's own streams from here to its exit (closed by os._exit)
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = [sys.executable, *request["argv"]]
    code = 1
    try:
        code = importlib.import_module(request["module"]).main(request["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - whatever ends the service is reported as a nonzero exit, as a crash
        traceback.print_exc()
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class _Server:
    """The server's side: accept requests, fork, report pids and exit codes."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        self.waiting: dict[int, socket.socket] = {}  # pid -> the connection that asked for it
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so SIGCHLD writes to the wake-up fd
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the client, which stops us
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, self._accept)
        self.selector.register(self.wake_r, selectors.EVENT_READ, self._reap)
        self.selector.register(sys.stdin.fileno(), selectors.EVENT_READ, None)

    def run(self) -> None:
        """Serve until the client closes our stdin."""
        while True:
            for key, _ in self.selector.select():
                if key.data is None:
                    if not os.read(key.fd, 4096):
                        return
                else:
                    key.data()

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        size = _recv_exact(conn, _LEN.size)
        body = _recv_exact(conn, _LEN.unpack(size)[0]) if size else b""
        if not body:
            conn.close()
            return
        server_pid = os.getpid()
        pid = os.fork()
        if pid == 0:
            self._close_in_child(conn)
            _run_child(json.loads(body), server_pid)
        conn.sendall(_INT.pack(pid))
        self.waiting[pid] = conn

    def _close_in_child(self, conn: socket.socket) -> None:
        """What the fork must not keep: the server's sockets, pipes and signal handling."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self.selector.close()
        for sock in (self.listener, conn, *self.waiting.values()):
            sock.close()
        os.close(self.wake_r)
        os.close(self.wake_w)

    def _reap(self) -> None:
        try:
            while os.read(self.wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        while self.waiting:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.waiting.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):  # the client is gone: nobody to tell
                    conn.sendall(_INT.pack(os.waitstatus_to_exitcode(status)))
                conn.close()


def serve() -> None:
    """The fork server's main (`python -c "from specdec.forkserver import serve; serve()" LISTEN_FD DIR`):
    import PRELOAD, serve until the client exits (or SIGTERM: the client ended, specdec.children), then remove
    DIR (its socket and this server's log) and exit."""
    signal.signal(signal.SIGTERM, lambda *_: _quit(0))
    listener = socket.socket(fileno=int(sys.argv[1]))
    for name in PRELOAD:
        importlib.import_module(name)
    for name in PRELOAD_IF_PRESENT:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    try:
        _Server(listener).run()
    except Exception:  # noqa: BLE001 - logged; the folder goes all the same
        traceback.print_exc()
        _quit(1)
    _quit(0)


def _quit(code: int) -> NoReturn:
    """Remove DIR and exit now, without the interpreter's teardown of what PRELOAD imported (a second or more):
    the forks get SIGTERM only once this process is gone."""
    shutil.rmtree(sys.argv[2], ignore_errors=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
