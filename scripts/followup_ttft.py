"""What prefix sharing saves a chat client that resends its conversation (no session id, as OpenAI clients do):
one local stack (Redis, target, orchestrator with the n-gram draft) per setting, started with prefix sharing on
(`SPECDEC_PREFIX_SHARE_MIN_TOKENS`, the default) or off (0), in turns. Per long bench prompt (a document and a
task, bench/prompts/long.jsonl) three requests, each a new session: the prompt itself, then the conversation
resent with a follow-up question, then a new conversation asking something else about the same document. Reports
each request's time to first token, prompt tokens and the prompt tokens served from the cache
(usage.cached_prompt_tokens). Greedy, k = 0 (the target alone), so only the prefill differs.

    PYTHONPATH=$PWD .venv/bin/python scripts/followup_ttft.py --repeats 2 --out bench/results/prefix_sharing_followup.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid
from pathlib import Path

from specdec.bench.plan import load_prompts
from specdec.healthcheck import channel_for
from specdec.launcher import LocalStack, StackConfig
from specdec.v1 import orchestrator_pb2 as pb
from specdec.v1 import orchestrator_pb2_grpc

SETTINGS = {"on": "16", "off": "0"}
FOLLOW_UP = "Now say the same in one short sentence."
OTHER_QUESTION = "\n\nAlso, before anything else: which three words in the text above matter most?"
RPC_TIMEOUT_S = 900


def request(messages: list[tuple[str, str]], tokens: int) -> pb.GenerateRequest:
    req = pb.GenerateRequest(max_new_tokens=tokens, ignore_eos=True, k=0, request_id=uuid.uuid4().hex)
    for role, content in messages:
        req.messages.messages.add(role=role, content=content)
    req.sampling.temperature = 0.0
    return req


def timed(stub, req: pb.GenerateRequest) -> dict:
    """Stream one request: time to first token (ms), its text, prompt and cached prompt tokens."""
    started, first, text, usage = time.perf_counter(), None, "", None
    for chunk in stub.GenerateStream(req, timeout=RPC_TIMEOUT_S):
        if chunk.token_ids and first is None:
            first = time.perf_counter()
        text += chunk.text_delta
        if chunk.HasField("usage"):
            usage = chunk.usage
    return {"ttft_ms": round((first - started) * 1000, 1), "text": text, "prompt_tokens": usage.prompt_tokens,
            "cached_prompt_tokens": usage.cached_prompt_tokens}


def conversation(stub, user: str, tokens: int) -> dict:
    """The three requests of one document (see the module docstring)."""
    first = timed(stub, request([("user", user)], tokens))
    follow = timed(stub, request([("user", user), ("assistant", first.pop("text")), ("user", FOLLOW_UP)], tokens))
    other = timed(stub, request([("user", user + OTHER_QUESTION)], tokens))
    follow.pop("text"), other.pop("text")
    return {"first": first, "follow_up": follow, "same_document": other}


def one_stack(setting: str, prompts: list, tokens: int) -> list[dict]:
    cfg = StackConfig(threads=1, extra_env={"SPECDEC_PREFIX_SHARE_MIN_TOKENS": SETTINGS[setting]})
    with LocalStack(cfg) as stack, channel_for(stack.orchestrator_address) as channel:
        stub = orchestrator_pb2_grpc.OrchestratorStub(channel)
        timed(stub, request([("user", "Hello")], 4))                      # first-call costs out
        return [{"prompt": p.id, **conversation(stub, p.user, tokens)} for p in prompts]


def summary(runs: dict[str, list[list[dict]]]) -> dict:
    out = {}
    for setting, repeats in runs.items():
        rows = [row for rep in repeats for row in rep]
        out[setting] = {kind: {"ttft_ms_median": statistics.median(r[kind]["ttft_ms"] for r in rows),
                               "prompt_tokens_mean": statistics.mean(r[kind]["prompt_tokens"] for r in rows),
                               "cached_prompt_tokens_mean": statistics.mean(r[kind]["cached_prompt_tokens"] for r in rows)}
                        for kind in ("first", "follow_up", "same_document")}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2, help="stacks per setting, on and off in turns")
    ap.add_argument("--prompts", type=int, default=2, help="long bench prompts per stack")
    ap.add_argument("--tokens", type=int, default=16, help="new tokens per request")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    prompts = load_prompts(["long"], args.prompts)
    runs: dict[str, list[list[dict]]] = {s: [] for s in SETTINGS}
    load_before = list(os.getloadavg())
    for rep in range(args.repeats):
        for setting in (list(SETTINGS) if rep % 2 == 0 else list(reversed(SETTINGS))):
            runs[setting].append(one_stack(setting, prompts, args.tokens))
            print(setting, json.dumps(runs[setting][-1]), flush=True)
    record = {"settings": {"repeats": args.repeats, "prompts": [p.id for p in prompts], "tokens": args.tokens,
                           "k": 0, "threads": 1, "prefix_share_min_tokens": SETTINGS},
              "load_avg_before": load_before, "load_avg_after": list(os.getloadavg()),
              "runs": runs, "summary": summary(runs)}
    print(json.dumps(record["summary"], indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
