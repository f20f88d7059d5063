"""Acceptance and wire bytes, greedy vs temperature 0.7, on the demo pair (and a model draft).

Usage: python scripts/measure_sampling.py [--draft-kind ngram|model --draft-model SPEC]
Prints mean accepted length (tokens per round, counting the recovered/bonus token),
acceptance rate and wire bytes per round, summed over the grounded bench prompts.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import grpc

from specdec.launcher import LocalStack, StackConfig
from specdec.v1 import common_pb2, orchestrator_pb2 as pb, orchestrator_pb2_grpc

PROMPTS = Path(__file__).resolve().parent.parent / "bench" / "prompts" / "grounded.jsonl"
SEEDS = (1, 2, 3)


def run(stub, user: str, k: int, temperature: float | None, seed: int) -> pb.GenerateResponse:
    req = pb.GenerateRequest(k=k, max_new_tokens=96)
    req.messages.messages.add(role="user", content=user)
    if temperature is not None:
        req.sampling.CopyFrom(common_pb2.SamplingParams(temperature=temperature, seed=seed))
    return stub.Generate(req, timeout=600)


def summarise(responses) -> dict:
    rounds = sum(r.stats.rounds for r in responses)
    drafted = sum(r.stats.draft_tokens for r in responses)
    return {"rounds": rounds, "tokens": sum(r.usage.completion_tokens for r in responses),
            "mean_accepted_length": sum(r.stats.mean_accepted_length * r.stats.rounds for r in responses) / rounds,
            "acceptance_rate": sum(r.stats.accepted_tokens for r in responses) / max(drafted, 1),
            "wire_bytes_per_round": sum(r.stats.wire_bytes for r in responses) / rounds}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft-kind", default="ngram")
    ap.add_argument("--draft-model", default="")
    ap.add_argument("--target-model", default="embedded")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=5)
    args = ap.parse_args()
    prompts = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()][: args.prompts]
    cfg = StackConfig(target_model=args.target_model, draft_kind=args.draft_kind, draft_model=args.draft_model)
    with LocalStack(cfg) as stack, grpc.insecure_channel(stack.orchestrator_address) as channel:
        stub = orchestrator_pb2_grpc.OrchestratorStub(channel)
        greedy = [run(stub, p["user"], args.k, None, 0) for p in prompts]
        sampled = [run(stub, p["user"], args.k, 0.7, s) for p in prompts for s in SEEDS]
    print(json.dumps({"k": args.k, "draft": args.draft_kind, "greedy": summarise(greedy),
                      "temperature_0.7": summarise(sampled)}, indent=2))


if __name__ == "__main__":
    main()
