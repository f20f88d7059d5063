"""Child processes that end with the process that started them, however it ends.

The services of a local stack run in sessions of their own (a terminal's Ctrl-C is for `specdec up`, which
stops them in order), so neither a closed terminal nor a `kill -9` of their parent reaches them. On Linux each
child asks the kernel for SIGTERM when its parent goes (prctl PR_SET_PDEATHSIG), which starts its drain as a
plain SIGTERM would. The kernel's "parent" is the thread that forked the child, so `popen` forks from a thread
that lives as long as the process: the main thread, or else a daemon thread of this module's.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
DEATH_SIGNAL = signal.SIGTERM

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform.startswith("linux") else None
_spawner: queue.Queue[tuple[Callable[[], Any], Future]] | None = None
_spawner_lock = threading.Lock()


def die_with(parent_pid: int) -> None:
    """In a child of `parent_pid`: have the kernel send DEATH_SIGNAL when the parent goes; if it already has
    (the child is now init's, or a subreaper's), send it now. A no-op where there is no prctl (not Linux)."""
    if _libc is None:
        return
    _libc.prctl(PR_SET_PDEATHSIG, DEATH_SIGNAL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), DEATH_SIGNAL)


def _run_spawner(requests: queue.Queue[tuple[Callable[[], Any], Future]]) -> None:
    while True:
        call, future = requests.get()
        try:
            future.set_result(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, who raises it
            future.set_exception(exc)


def _on_lasting_thread(call: Callable[[], Any]) -> Any:
    """call() on a thread that ends only with the process: this one if it is the main thread."""
    global _spawner
    if threading.current_thread() is threading.main_thread():
        return call()
    with _spawner_lock:
        if _spawner is None:
            _spawner = queue.Queue()
            threading.Thread(target=_run_spawner, args=(_spawner,), name="specdec-spawner", daemon=True).start()
        requests = _spawner
    future: Future = Future()
    requests.put((call, future))
    return future.result()


def popen(cmd: list[str], **kwargs: Any) -> subprocess.Popen:
    """subprocess.Popen(cmd, **kwargs) for a child that gets SIGTERM when this process ends."""
    parent = os.getpid()
    return _on_lasting_thread(lambda: subprocess.Popen(cmd, preexec_fn=lambda: die_with(parent), **kwargs))
