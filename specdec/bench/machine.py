"""The machine a bench ran on (CPU, cores, memory, library versions, load) and peak memory of processes."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def machine_info() -> dict[str, Any]:
    """The machine a result was measured on: the CPU (model, the flags that decide kernels: AVX-512,
    AMX, bf16), cores, memory, the GPU if any, library versions and load average."""
    import torch
    import transformers

    from specdec.models.cpu_info import cpu_summary, usable_cores

    usable = usable_cores()
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    return {
        **cpu_summary(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "memory_bytes": mem,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_avg_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "gpu": gpu_summary(),
    }


def gpu_summary() -> dict[str, Any] | None:
    """The CUDA device the services load onto by default (device "auto"), or None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return {
        "name": props.name,
        "count": torch.cuda.device_count(),
        "memory_bytes": props.total_memory,
        "cuda": torch.version.cuda,
    }


def peak_rss_bytes(pid: int) -> dict[str, Any]:
    """Peak resident memory of a process: VmHWM from /proc (psutil has no peak on Linux)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return {"bytes": int(line.split()[1]) * 1024, "source": "VmHWM"}
    except OSError:
        pass
    try:
        import psutil

        return {"bytes": psutil.Process(pid).memory_info().rss, "source": "psutil rss (current, not peak)"}
    except Exception:  # noqa: BLE001 - best effort
        return {"bytes": None, "source": "unavailable"}
