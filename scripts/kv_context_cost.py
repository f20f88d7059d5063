"""A decode step (1 row) and a k = 4 verify pass (5 rows) of the embedded target against context length,
in process, with the KV cache and attention as shipped ("now": GrowingLayer caches, specdec_ragged
attention) and as transformers has them ("before": DynamicCache's torch.cat layers, its `sdpa` attention).
The two alternate in one process per length (load hits both alike); prints a Markdown table of medians
(docs/performance.md, "Long contexts inside the forward").

    PYTHONPATH=$PWD .venv/bin/python scripts/kv_context_cost.py --lengths 300,300,2000,5000,8000 --threads 1

(The first length is a warm-up: name it twice.)
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import torch
from transformers import DynamicCache

import specdec.engine.kvcache as kvcache
from specdec.config import ModelServiceConfig
from specdec.engine.loading import load_target
from specdec.engine.ragged import ATTN_NAME

VOCAB_RANGE = (100, 40_000)       # token ids drawn for the synthetic context
PREFILL_CHUNK = 512               # the context is prefilled in chunks of this many tokens
VERIFY_ROWS = 5                   # a k = 4 verify pass


def torch_cat_cache(config=None) -> DynamicCache:
    return DynamicCache(config=config) if config is not None else DynamicCache()


MODES = {"before": ("sdpa", torch_cat_cache), "now": (ATTN_NAME, kvcache.new_session_cache)}


def time_steps(runner, session: str, ids: list[int], steps: int, rng: random.Random) -> tuple[list, list]:
    """(decode-step ms, verify-pass ms) for `steps` rounds after prefilling `ids` into `session`."""
    for start in range(0, len(ids), PREFILL_CHUNK):
        end = min(len(ids), start + PREFILL_CHUNK)
        runner.extend(session, ids[:end], end - 1)
    decode, verify = [], []
    for _ in range(steps):
        ids.append(rng.randrange(*VOCAB_RANGE))
        started = time.perf_counter()
        runner.extend(session, ids, len(ids) - 1)
        decode.append((time.perf_counter() - started) * 1000)
        drafted = ids + [rng.randrange(*VOCAB_RANGE) for _ in range(VERIFY_ROWS - 1)]
        started = time.perf_counter()
        runner.extend(session, drafted, len(ids) - 1)           # rolled back by the next decode step
        verify.append((time.perf_counter() - started) * 1000)
    runner.pool.release(session)
    return decode, verify


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="300,300,2000,5000,8000")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=12, help="rounds per length, mode and repeat")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    runner = load_target(ModelServiceConfig(role="target", model="embedded", threads=args.threads)
                         ).engines["target"].runner
    rng = random.Random(0)
    print("| cached tokens | 1 row before → now | 5 rows before → now |\n|---|---|---|")
    for length in (int(x) for x in args.lengths.split(",")):
        context = [rng.randrange(*VOCAB_RANGE) for _ in range(length)]
        times = {mode: ([], []) for mode in MODES}
        for repeat in range(args.repeats):
            for mode, (attention, factory) in MODES.items():
                runner.model.set_attn_implementation(attention)
                kvcache.new_session_cache = factory        # what KVCachePool.acquire builds
                decode, verify = time_steps(runner, f"{mode}-{length}-{repeat}", list(context), args.steps, rng)
                times[mode][0].extend(decode)
                times[mode][1].extend(verify)
        (b1, b5), (n1, n5) = times["before"], times["now"]
        print(f"| {length:,} | {statistics.median(b1):.1f} → {statistics.median(n1):.1f} ms | "
              f"{statistics.median(b5):.1f} → {statistics.median(n5):.1f} |", flush=True)
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
