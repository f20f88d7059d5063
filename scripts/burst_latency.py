"""What a burst of new prompts costs the sessions already decoding: one local stack (Redis, one batched target,
its orchestrator, the n-gram draft in the orchestrator), `--running` sessions streaming long generations; once
each has streamed a few rounds, `--burst` new prompts arrive at the same instant. Reports, per repeat and over
all, the running sessions' gaps between chunks before the burst and while the burst is prefilled (from its
arrival until its last prompt's first token), and the burst's time to first token. Greedy, k as given
(0: the target alone, which isolates the scheduling).

    PYTHONPATH=$PWD .venv/bin/python scripts/burst_latency.py --running 4 --burst 4 --repeats 3

Run it once per tree (or setting) to compare, in turns; the JSON records the load average. `--draft-model`: a draft
service with that model drafts instead (k > 0); `--compare-draft-env 'NAME=V,...'`: a second draft with that
environment behind a second orchestrator on the same target, the repeats alternating between the two (side by
side), e.g. `--draft-model embedded:smollm2-draft --k 4 --burst-set long
--compare-draft-env SPECDEC_PREFILL_CHUNK_TOKENS=0`.
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

from specdec.bench.machine import machine_info
from specdec.bench.plan import env_assignments, load_prompts
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
    ap.add_argument("--draft-model", default="", help="a draft service with this model (default: n-gram in the "
                    "orchestrator)")
    ap.add_argument("--burst-set", default="grounded", help="the prompt set the burst's prompts come from")
    ap.add_argument("--compare-draft-env", default="", help="NAME=V,...: a second draft with this environment")
    args = ap.parse_args()
    prompts = load_prompts(list(dict.fromkeys(["grounded", "open", args.burst_set])), 0)
    running = [p for p in prompts if p.set in ("grounded", "open")][:args.running]
    burst = [p for p in prompts if p.set == args.burst_set][-args.burst:]
    stack, stubs = start(args)
    load_start = os.getloadavg()
    results: dict[str, list[dict]] = {name: [] for name in stubs}
    try:
        for stub in stubs.values():
            one_repeat(stub, running[:1], burst[:1], args.k, 8, 2)                    # warm-up, discarded
        for r in range(args.repeats):
            for name, stub in stubs.items():
                results[name].append(one_repeat(stub, running, burst, args.k, args.tokens, args.burst_tokens))
                row = {key: summary(v) for key, v in results[name][-1].items()}
                print(f"{name} repeat {r + 1}: {json.dumps(row)}  load {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        stack.stop()
    total = {name: {key: summary([x for res in runs for x in res[key]]) for key in runs[0]}
             for name, runs in results.items()}
    print("all:", json.dumps(total))
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "machine": machine_info(), "load_start": load_start,
                                              "load_end": os.getloadavg(), "summary": total, "repeats": results},
                                             indent=1))


def start(args: argparse.Namespace) -> tuple[LocalStack, dict[str, object]]:
    """The stack (a draft service when --draft-model), and {name: orchestrator stub}: "base", plus "env" behind a
    second draft with --compare-draft-env on the same target."""
    drafts = 1 if args.draft_model else 0
    stack = LocalStack(StackConfig(threads=args.threads, draft_replicas=drafts, draft_model=args.draft_model,
                                   draft_kind="model" if drafts else "ngram",
                                   max_concurrent=4 * (args.running + args.burst),
                                   # every repeat prefills its prompts (no copy from an earlier repeat's cache)
                                   extra_env={"SPECDEC_PREFIX_SHARE_MIN_TOKENS": "0"} if drafts else {}))
    stack.start()
    stub = orchestrator_pb2_grpc.OrchestratorStub
    stubs = {"base": stub(channel_for(stack.orchestrator_address, stack.tls()))}
    if args.compare_draft_env:
        draft = stack.start_draft(env=env_assignments(args.compare_draft_env))
        stack.wait_ready(draft)
        orchestrator = stack.start_orchestrator(targets=stack.targets, drafts=[draft])
        stack.wait_ready(orchestrator)
        stack.wait_connected(orchestrator, stack.targets + [draft])
        stubs["env"] = stub(channel_for(orchestrator.address, stack.tls()))
    return stack, stubs


if __name__ == "__main__":
    sys.exit(main())
