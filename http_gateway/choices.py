"""OpenAI's `n`: several choices for one request, each its own orchestrator generation.

Pure functions (no I/O). A request with n > 1 becomes n GenerateRequests that differ only in
their seed and request id, run concurrently by the gateway (http_gateway/app.py):

* seed: choice i samples with seed + i (mod 2**64) when the request gives a seed, so the whole
  answer is reproducible and choice i equals an n = 1 request with seed + i; without a seed every
  choice gets its own server-chosen seed (as n requests would);
* request id: choice 0 keeps the request's id, choice i > 0 gets `<id>-<i>`;
* usage: the prompt is counted once (as OpenAI and vLLM do), completion tokens are summed.

Greedy requests (temperature 0, the default) give n identical choices, as the target alone would.
"""

from __future__ import annotations

from typing import Any

from specdec.v1 import orchestrator_pb2 as pb

SEED_MODULUS = 2**64  # SamplingParams.seed is a uint64


def choice_requests(req: pb.GenerateRequest, n: int) -> list[pb.GenerateRequest]:
    """The request of each of n choices (n = 1: the request itself)."""
    if n == 1:
        return [req]
    out = []
    for i in range(n):
        choice = pb.GenerateRequest()
        choice.CopyFrom(req)
        if i:
            choice.request_id = f"{req.request_id}-{i}"
            if req.sampling.HasField("seed"):
                choice.sampling.seed = (req.sampling.seed + i) % SEED_MODULUS
        out.append(choice)
    return out


def merged_usage(usages: list[dict[str, Any]]) -> dict[str, Any]:
    """One usage object for n choices of the same prompt: the prompt once, the completions summed."""
    first = usages[0]
    completion = sum(u["completion_tokens"] for u in usages)
    return {**first, "completion_tokens": completion, "total_tokens": first["prompt_tokens"] + completion}


def merged_body(bodies: list[dict[str, Any]]) -> dict[str, Any]:
    """n whole responses (one choice each, in choice order) -> one response with n choices.

    The `specdec` extension of each choice (its session, request id, stats, trace) moves to
    `specdec.choices[i]`; n = 1 keeps the single-choice shape.
    """
    if len(bodies) == 1:
        return bodies[0]
    choices: list[dict[str, Any]] = []
    for i, body in enumerate(bodies):
        choices.extend({**c, "index": i} for c in body["choices"])
    return {
        **bodies[0],
        "choices": choices,
        "usage": merged_usage([b["usage"] for b in bodies]),
        "specdec": {"choices": [{"index": i, **b["specdec"]} for i, b in enumerate(bodies)]},
    }
