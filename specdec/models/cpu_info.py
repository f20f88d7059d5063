"""What CPU this is: model name and the instruction-set flags that decide which kernels are fast.

Used to key the kernel-choice cache (specdec/models/kernels.py) and to name the CPU in every bench
result (specdec/bench/machine.py).
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# Flags that change which linear kernel wins: vector width, fused multiply-add, int8 dot products,
# bfloat16 dot products and Intel's matrix tiles (AMX), which oneDNN uses for bf16/int8 GEMMs.
FLAGS_THAT_MATTER = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "avx_vnni",
)


@functools.cache
def cpu_model_and_flags() -> tuple[str, tuple[str, ...]]:
    """(model name, the FLAGS_THAT_MATTER this CPU has), from /proc/cpuinfo where there is one."""
    model = platform.processor() or platform.machine()
    flags: set[str] = set()
    try:
        for line in CPUINFO.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in ("", platform.processor(), platform.machine()):
                model = value.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return model, tuple(f for f in FLAGS_THAT_MATTER if f in flags)


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS tells it, else all of them)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cpu_budget_cores(cpu_max: str = "/sys/fs/cgroup/cpu.max") -> float:
    """usable_cores(), or fewer where a cgroup v2 CPU quota allows less (a container's CPU limit)."""
    cores = float(usable_cores())
    try:
        quota, period = Path(cpu_max).read_text().split()[:2]
    except (OSError, ValueError):
        return cores
    return cores if quota == "max" else min(cores, int(quota) / int(period))


def load_per_core() -> float:
    """The 1-minute load average per usable core (0.0 where the OS keeps no load average)."""
    return (os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0) / usable_cores()


def cpu_summary() -> dict[str, object]:
    """The CPU as a bench result and the service log name it: model, flags, and the three questions
    a reader asks of a CPU result (AVX-512? AMX? native bf16?) plus torch's own capability string."""
    import torch

    model, flags = cpu_model_and_flags()
    return {
        "cpu_model": model,
        "cpu_flags": list(flags),
        "avx512": "avx512f" in flags,
        "amx": "amx_tile" in flags,
        "bf16": "avx512_bf16" in flags or "amx_bf16" in flags,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
