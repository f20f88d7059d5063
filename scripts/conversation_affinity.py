"""A resent conversation on two target replicas: routed by its conversation (orchestrator/affinity.py) vs by
each request's own new session id, side by side.

One local stack: Redis, two targets, and two orchestrators over both targets: `affinity` (the default) and
`by-session` (SPECDEC_AFFINITY_PROMPT_CHARS=0). Every conversation is a stateless chat (no session id, as an
OpenAI client sends it): a system message (its own per orchestrator, so the two share no cached prefix), a
bench prompt as the first user message, then `--turns` turns that resend the whole history with a short
follow-up. Each conversation runs on both orchestrators in turn,
so load on the machine hits both alike. Reports per orchestrator, for the turns after the first: time to
first token (p50, mean), the context tokens the target reused from its KV cache in the turn's first round
(own session or another's shared prefix), and how often a turn's target replica was its first turn's.

    PYTHONPATH=$PWD .venv/bin/python scripts/conversation_affinity.py --conversations 6 --turns 3
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time

import grpc

from specdec.bench.machine import machine_info
from specdec.bench.plan import load_prompts
from specdec.launcher import LocalStack, StackConfig
from specdec.redis_server import EmbeddedRedis
from specdec.v1 import orchestrator_pb2 as pb
from specdec.v1 import orchestrator_pb2_grpc

SYSTEM = "You are a careful assistant. Answer in two short sentences."
FOLLOW_UPS = ("Say more.", "Why?", "Give an example.", "Summarise that.")
VARIANTS = {"affinity": {}, "by-session": {"SPECDEC_AFFINITY_PROMPT_CHARS": "0"}}


def turn(stub, messages: list[tuple[str, str]], tokens: int) -> pb.GenerateResponse:
    req = pb.GenerateRequest(k=0, max_new_tokens=tokens, ignore_eos=True, trace=True)
    req.sampling.temperature = 0.0
    for role, content in messages:
        req.messages.messages.add(role=role, content=content)
    return stub.Generate(req, timeout=600)


def conversation(stub, system: str, first_user: str, turns: int, tokens: int) -> list[dict]:
    """One conversation's turns: [{turn, ttft_ms, prompt_tokens, reused, replica}]."""
    messages, out = [("system", system), ("user", first_user)], []
    for t in range(turns):
        resp = turn(stub, messages, tokens)
        out.append({"turn": t, "ttft_ms": resp.stats.time_to_first_token_ms, "prompt_tokens": resp.usage.prompt_tokens,
                    "reused": resp.trace[0].target_cached_tokens, "replica": resp.trace[0].target_replica})
        messages += [("assistant", resp.text), ("user", FOLLOW_UPS[t % len(FOLLOW_UPS)])]
    return out


def summary(records: list[list[dict]]) -> dict:
    later = [r for conv in records for r in conv[1:]]
    same = [r["replica"] == conv[0]["replica"] for conv in records for r in conv[1:]]
    ttft = [r["ttft_ms"] for r in later]
    return {"later_turns": len(later), "ttft_ms_p50": statistics.median(ttft), "ttft_ms_mean": statistics.mean(ttft),
            "reused_share": sum(r["reused"] for r in later) / max(1, sum(r["prompt_tokens"] for r in later)),
            "on_first_turns_replica": sum(same) / max(1, len(same)),
            "first_turn_ttft_ms_p50": statistics.median(conv[0]["ttft_ms"] for conv in records)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conversations", type=int, default=6)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=16, help="tokens generated per turn")
    ap.add_argument("--prompts", default="grounded,open")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))   # `timeout` still stops the stack (finally)
    firsts = [p.user for p in load_prompts(args.prompts.split(","), args.conversations)][: args.conversations]
    stack = LocalStack(StackConfig(draft_replicas=0))
    stack.redis = EmbeddedRedis().start()
    stack.redis_url = stack.redis.url
    try:
        targets = [stack.start_target() for _ in range(2)]
        for proc in targets:
            stack.wait_ready(proc)
        stubs, channels = {}, []
        for name, env in VARIANTS.items():
            proc = stack.start_orchestrator(targets=targets, drafts=[], env=env)
            stack.wait_ready(proc)
            stack.wait_connected(proc, targets)
            channels.append(grpc.insecure_channel(proc.address))
            stubs[name] = orchestrator_pb2_grpc.OrchestratorStub(channels[-1])
        machine = machine_info()         # CPU, cores, versions, load average at the start
        records = {name: [] for name in VARIANTS}
        for i, first in enumerate(firsts):
            for name, stub in (stubs.items() if i % 2 == 0 else reversed(list(stubs.items()))):
                system = f"{SYSTEM} ({name})"    # no prefix shared with the other orchestrator's conversations
                records[name].append(conversation(stub, system, first, args.turns, args.tokens))
                print(name, i, [(r["ttft_ms"], r["reused"], r["prompt_tokens"]) for r in records[name][-1]],
                      file=sys.stderr)
        result = {"conversations": len(firsts), "turns": args.turns, "tokens": args.tokens, "prompts": args.prompts,
                  "machine": machine, "load_avg_at_end": list(os.getloadavg()),
                  "summary": {name: summary(recs) for name, recs in records.items()}, "records": records,
                  "when": time.strftime("%Y-%m-%d %H:%M:%S")}
        for name, s in result["summary"].items():
            print(f"{name:11s} later turns {s['later_turns']}: TTFT p50 {s['ttft_ms_p50']:.0f} ms, mean "
                  f"{s['ttft_ms_mean']:.0f} ms; reused {s['reused_share']:.0%} of their prompt tokens; "
                  f"on the first turn's replica {s['on_first_turns_replica']:.0%} "
                  f"(first turns: TTFT p50 {s['first_turn_ttft_ms_p50']:.0f} ms)")
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
        for channel in channels:
            channel.close()
    finally:
        stack.stop()                     # and its Redis


if __name__ == "__main__":
    main()
