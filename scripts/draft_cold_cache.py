"""What sharing a machine with the target costs the draft: a proposal after a target pass starts cache-cold.

The model draft proposes k tokens per call from a context that grows by one token per call (the session's KV
cache kept, as in a round), once back to back ("warm") and once with a sweep over SWEEP_MB of memory before
each call, the bytes a target pass streams between two proposals on a shared box ("after a target pass").
Reports the p50 proposal time and the draft's forward_ms for each, one torch thread, per --dtype, as one JSON
document with the machine (CPU, load average at start and end; docs/overlap.md, "What co-location costs the draft").

    PYTHONPATH=$PWD .venv/bin/python scripts/draft_cold_cache.py --dtype float32,bfloat16,int8 --k 2 \
        --out bench/results/draft_cold_cache.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

import torch

from specdec.bench.machine import machine_info
from specdec.config import ModelServiceConfig
from specdec.core.sampling import SamplingConfig
from specdec.engine.loading import load_draft
from specdec.engine.types import ProposeInput

SWEEP_MB = 320          # ~ a bf16 pass of the embedded target plus its activations
CALLS = 30
CONTEXT = 80
MS_PER_S = 1000.0


def measure(dtype: str, k: int, draft: str) -> dict:
    torch.set_num_threads(1)
    sweep = torch.ones(SWEEP_MB * (1 << 20) // 4)
    bundle = load_draft(ModelServiceConfig(role="draft", model=draft, draft_kind="model",
                                           cache_budget_bytes=1 << 30, dtype=dtype, threads=1))
    engine, greedy = bundle.engines["model"], SamplingConfig(temperature=0.0)
    ids = [random.Random(1).randrange(100, 5000) for _ in range(CONTEXT)]
    engine.propose(ProposeInput("s", ids, k, greedy))
    out = {}
    for name, cold in (("warm", False), ("after_a_target_pass", True)):
        wall, forward = [], []
        for i in range(CALLS):
            ids = ids + [ids[i]]
            if cold:
                sweep.sum()
            start = time.perf_counter()
            result = engine.propose(ProposeInput("s", ids, k, greedy))
            wall.append((time.perf_counter() - start) * MS_PER_S)
            forward.append(result.stats.forward_ms)
        out[name] = {"propose_ms_p50": round(statistics.median(wall), 2),
                     "forward_ms_p50": round(statistics.median(forward), 2)}
    return {"dtype": dtype, "k": k, "draft": draft, "sweep_mb": SWEEP_MB, **out}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="float32", help="comma-separated: float32,bfloat16,int8")
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--draft", default="embedded:smollm2-draft")
    p.add_argument("--out", default="", help="also write the JSON here")
    ns = p.parse_args()
    record = {"machine": machine_info(), "runs": [measure(dtype.strip(), ns.k, ns.draft) for dtype in ns.dtype.split(",")]}
    record["machine"]["load_avg_at_end"] = list(os.getloadavg())
    text = json.dumps(record, indent=1)
    print(text)
    if ns.out:
        with open(ns.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
