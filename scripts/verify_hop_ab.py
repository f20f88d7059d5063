"""Verify against a real target process, unary call and round stream alternating request by request
(A B A B ...), so load drift hits both alike. Per way and context length: p50 of (call wall time at the
client - the target's forward_ms), i.e. the hop plus the target's work outside the forward, delta form,
greedy, k draft tokens a call (the n-gram draft's proposals are stood in by fixed ids).

    PYTHONPATH=$PWD .venv/bin/python scripts/verify_hop_ab.py --threads 1 --contexts 100,4000 --calls 40
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import time

import grpc

from orchestrator.streams import RoundStreams
from specdec.core.prefix_hash import PrefixHashes
from specdec.launcher import LocalStack, StackConfig
from specdec.v1 import target_pb2, target_pb2_grpc


async def run(address: str, contexts: list[int], calls: int, k: int) -> None:
    channel = grpc.aio.insecure_channel(address)
    stub = target_pb2_grpc.TargetStub(channel)
    streams = RoundStreams(stub, lambda: (), 4)
    ways = {"unary": lambda req: stub.Verify(req, timeout=60), "stream": lambda req: streams.call("Verify", req, 60)}
    print(f"load average at start {os.getloadavg()}")
    for n in contexts:
        state = {}
        for way in ways:                                     # prefill each way's session, full form
            ids = [(i * 7919) % 40000 + 10 for i in range(n)]
            await stub.Verify(target_pb2.VerifyRequest(session_id=f"{way}-{n}", context_ids=ids), timeout=600)
            state[way] = (ids, PrefixHashes(ids))
        over: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(calls):
            for way, call in ways.items():
                ids, hashes = state[way]
                base = len(ids)
                ids.append(ids[-1] % 1000 + 1)
                hashes.extend(ids[base:])
                req = target_pb2.VerifyRequest(session_id=f"{way}-{n}", context_ids=ids[base:], position_base=base,
                                               prefix_hash=hashes.at(base), draft_ids=list(range(11, 11 + k)))
                start = time.perf_counter()
                response = await call(req)
                over[way].append((time.perf_counter() - start) * 1000 - response.stats.forward_ms)
        for way, v in over.items():
            print(f"context {n:5d} {way:6s}: call minus forward p50 {statistics.median(v):.3f} ms "
                  f"(min {min(v):.3f}, n={len(v)})")
    print(f"load average at end {os.getloadavg()}")
    streams.close_idle()
    await channel.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--contexts", default="100,4000")
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--k", type=int, default=4)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))   # `timeout` still stops the target (finally)
    stack = LocalStack(StackConfig(threads=args.threads))
    try:
        target = stack.start_target()
        stack.wait_ready(target)
        asyncio.run(run(target.address, [int(x) for x in args.contexts.split(",")], args.calls, args.k))
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
