"""CPU seconds each process of the bench-load stack spends per guidellm run, and guidellm's own.

The stack shares the cores with the load generator, so a configuration's cost shows beside its latency.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import Any


def service_pids(stack: Any, gateway: Any) -> dict[str, int]:
    """role -> pid of every process of the stack (a second replica of a role gets "-2", ...), the HTTP gateway
    ("http") and the embedded Redis ("redis"), for the CPU each one spends per guidellm run."""
    pids: dict[str, int] = {}
    for proc in stack.procs:
        name, n = proc.role, 1
        while name in pids:
            n += 1
            name = f"{proc.role}-{n}"
        pids[name] = proc.popen.pid
    if gateway is not None and gateway.popen is not None:
        pids["http"] = gateway.popen.pid
    redis_proc = getattr(stack.redis, "_proc", None)
    if redis_proc is not None:
        pids["redis"] = redis_proc.pid
    return pids


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds the process `pid` has used so far (/proc/PID/stat; None where unreadable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def cpu_by_service(pids: dict[str, int]) -> dict[str, float | None]:
    return {role: process_cpu_s(pid) for role, pid in pids.items()}


def cpu_delta(before: dict[str, float | None], after: dict[str, float | None]) -> dict[str, float]:
    """CPU seconds each service spent between two cpu_by_service readings (services unreadable in either left out)."""
    return {
        role: round(end - start, 2)
        for role, start in before.items()
        if start is not None and (end := after.get(role)) is not None
    }


def children_cpu_s() -> float:
    """User + system CPU seconds of this process's waited-for children (guidellm and its workers)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
