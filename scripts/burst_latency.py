"""What a burst of new prompts costs the sessions already decoding: one local stack (Redis, one batched target,
its orchestrator, the n-gram draft in the orchestrator), `--running` sessions streaming long generations; once
each has streamed a few rounds, `--burst` new prompts arrive at the same instant. Reports, per repeat and over
all, the running sessions' gaps between chunks before the burst and while the burst is prefilled (from its
arrival until its last prompt's first token), and the burst's time to first token. Greedy, k as given
(0: the target alone, which isolates the scheduling).

    PYTHONPATH=$PWD .venv/bin/python scripts/burst_latency.py --running 4 --burst 4 --repeats 3

Run it once per tree (or setting) to compare, in turns; the JSON records the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

from specdec.bench.plan import load_prompts
from specdec.healthcheck import channel_for
from specdec.launcher import LocalStack, StackConfig
from specdec.v1 import orchestrator_pb2 as pb
from specdec.v1 import orchestrator_pb2_grpc

WARM_CHUNKS = 4            # chunks each running session streams before the burst arrives
RPC_TIMEOUT_S = 600


def request(user: str, k: int, tokens: int) -> pb.GenerateRequest:
    req = pb.GenerateRequest(max_new_tokens=tokens, ignore_eos=True, k=k, request_id=uuid.uuid4().hex)
    req.messages.messages.add(role="user", content=user)
    req.sampling.temperature = 0.0
    return req


def stream(stub, req: pb.GenerateRequest, arrivals: list[float], started: threading.Event | None) -> None:
    """Record the arrival time of every chunk that carries tokens; set `started` after WARM_CHUNKS."""
    for chunk in stub.GenerateStream(req, timeout=RPC_TIMEOUT_S):
        if chunk.token_ids:
            arrivals.append(time.perf_counter())
            if started is not None and len(arrivals) == WARM_CHUNKS:
                started.set()


def one_repeat(stub, running: list, burst: list, k: int, tokens: int, burst_tokens: int) -> dict:
    runs = [[] for _ in running]
    warm = [threading.Event() for _ in running]
    threads = [threading.Thread(target=stream, args=(stub, request(p.user, k, tokens), runs[i], warm[i]))
               for i, p in enumerate(running)]
    for t in threads:
        t.start()
    for event in warm:
        event.wait(RPC_TIMEOUT_S)
    fired = time.perf_counter()
    bursts = [[] for _ in burst]
    burst_threads = [threading.Thread(target=stream, args=(stub, request(p.user, k, burst_tokens), bursts[i], None))
                     for i, p in enumerate(burst)]
    for t in burst_threads:
        t.start()
    for t in burst_threads + threads:
        t.join()
    ttft = [(b[0] - fired) * 1000 for b in bursts if b]
    until = fired + max(ttft) / 1000
    before, during = [], []
    for arrivals in runs:
        for prev, now in zip(arrivals, arrivals[1:]):
            if now <= fired:
                before.append((now - prev) * 1000)
            elif prev < until:
                during.append((now - prev) * 1000)
    return {"gap_ms_before": before, "gap_ms_during": during, "burst_ttft_ms": ttft}


def summary(values: list[float]) -> dict:
    if not values:
        return {}
    ordered = sorted(values)
    return {"n": len(values), "p50": round(statistics.median(values), 1),
            "p90": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 1), "max": round(ordered[-1], 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--running", type=int, default=4)
    ap.add_argument("--burst", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--k", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=64, help="tokens each running session generates")
    ap.add_argument("--burst-tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    prompts = load_prompts(["grounded", "open"], 0)
    running = prompts[:args.running]
    burst = [p for p in prompts if p.set == "grounded"][-args.burst:]
    stack = LocalStack(StackConfig(threads=args.threads, draft_replicas=0, max_concurrent=4 * (args.running + args.burst)))
    stack.cfg.draft_replicas = 0
    load_start = os.getloadavg()
    results = []
    try:
        stack.start()
        stub = orchestrator_pb2_grpc.OrchestratorStub(channel_for(stack.orchestrator_address, stack.tls()))
        one_repeat(stub, running[:1], burst[:1], args.k, 8, 2)                        # warm-up, discarded
        for r in range(args.repeats):
            results.append(one_repeat(stub, running, burst, args.k, args.tokens, args.burst_tokens))
            row = {name: summary(v) for name, v in results[-1].items()}
            print(f"repeat {r + 1}: {json.dumps(row)}  load {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        stack.stop()
    total = {name: summary([x for res in results for x in res[name]]) for name in results[0]}
    print("all:", json.dumps(total))
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "load_start": load_start, "load_end": os.getloadavg(),
                                              "summary": total, "repeats": results}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
