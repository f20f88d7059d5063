"""What `make deploy-test` asks of a running stack, from the host: gRPC and HTTP generation,
greedy identity with k = 0, replica spread (trace), calls per replica, a target killed mid-stream, tok/s.

Every call carries a deadline.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from specdec.v1 import common_pb2, draft_pb2_grpc, orchestrator_pb2_grpc, target_pb2_grpc
from specdec.v1 import orchestrator_pb2 as pb

CALL_TIMEOUT_S = 300.0
STATS_TIMEOUT_S = 10.0
PROMPT = "Explain in a few sentences why the sky is blue, then list three uses of speculative decoding."
GREEDY_TOKENS = 48
SPEED_TOKENS = 128
SPEED_RUNS = 3
SPREAD_SESSIONS = 8


@dataclass
class Orchestrator:
    """A gRPC client of one orchestrator with its bearer token."""

    address: str
    token: str

    def _stub(self, channel: grpc.Channel) -> orchestrator_pb2_grpc.OrchestratorStub:
        return orchestrator_pb2_grpc.OrchestratorStub(channel)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def generate(self, **fields) -> pb.GenerateResponse:
        """One unary Generate (greedy unless `sampling` is given)."""
        with grpc.insecure_channel(self.address) as channel:
            return self._stub(channel).Generate(
                pb.GenerateRequest(**fields), timeout=CALL_TIMEOUT_S, metadata=self.metadata
            )

    def stream(self, on_chunk: Callable[[pb.GenerateChunk], None], **fields) -> list[int]:
        """GenerateStream to the end; the completion token ids (on_chunk sees every chunk)."""
        ids: list[int] = []
        with grpc.insecure_channel(self.address) as channel:
            for chunk in self._stub(channel).GenerateStream(
                pb.GenerateRequest(**fields), timeout=CALL_TIMEOUT_S, metadata=self.metadata
            ):
                del ids[chunk.offset :]
                ids.extend(chunk.token_ids)
                on_chunk(chunk)
        return ids


def greedy_identity(client: Orchestrator) -> dict[str, Any]:
    """The default k and k = 0 give the same greedy tokens through the stack."""
    fields = dict(prompt=PROMPT, max_new_tokens=GREEDY_TOKENS, ignore_eos=True)
    spec = client.generate(**fields)
    plain = client.generate(k=0, **fields)
    return {
        "ok": list(spec.token_ids) == list(plain.token_ids),
        "tokens": len(spec.token_ids),
        "text": spec.text,
        "ids": list(plain.token_ids),
        "mal": spec.stats.mean_accepted_length,
    }


def http_completion(port: int, token: str, k: int | None = None) -> str:
    """Greedy /v1/completions through the gateway on 127.0.0.1; the completion text."""
    ext = {"ignore_eos": True} | ({"k": k} if k is not None else {})
    body = {"prompt": PROMPT, "max_tokens": GREEDY_TOKENS, "temperature": 0, "specdec": ext}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(request, timeout=CALL_TIMEOUT_S) as reply:  # noqa: S310 (loopback)
        return json.loads(reply.read())["choices"][0]["text"]


def replica_spread(client: Orchestrator, prefix: str) -> tuple[set[str], set[str]]:
    """(target replicas, draft replicas) that served the rounds of several sessions."""
    targets: set[str] = set()
    drafts: set[str] = set()
    for i in range(SPREAD_SESSIONS):
        resp = client.generate(
            prompt=f"{i}: {PROMPT}",
            max_new_tokens=16,
            ignore_eos=True,
            trace=True,
            session_id=f"{prefix}-{i}",
            create_session=True,
        )
        targets |= {r.target_replica for r in resp.trace if r.target_replica}
        drafts |= {r.draft_replica for r in resp.trace if r.draft_replica and r.draft_replica != "local"}
    return targets, drafts


def service_stats(address: str, role: str, service_token: str = "") -> common_pb2.ServiceStats:
    """A draft's or target's `Stats` over gRPC, with the token the orchestrator presents (none if empty)."""
    stub = target_pb2_grpc.TargetStub if role == "target" else draft_pb2_grpc.DraftStub
    metadata = (("authorization", f"Bearer {service_token}"),) if service_token else ()
    with grpc.insecure_channel(address) as channel:
        return stub(channel).Stats(common_pb2.InfoRequest(), timeout=STATS_TIMEOUT_S, metadata=metadata)


def kill_mid_stream(
    client: Orchestrator, reference: list[int], kill: Callable[[str], None], after_tokens: int = 8
) -> dict[str, object]:
    """Stream the reference prompt; once `after_tokens` arrived, kill(target replica serving it)."""
    state: dict[str, object] = {"killed": "", "at": 0}

    def on_chunk(chunk: pb.GenerateChunk) -> None:
        served = [r.target_replica for r in chunk.rounds if r.target_replica]
        count = chunk.offset + len(chunk.token_ids)
        if not state["killed"] and served and count >= after_tokens:
            state["killed"], state["at"] = served[-1], count
            kill(served[-1])

    started = time.monotonic()
    ids = client.stream(
        on_chunk,
        prompt=PROMPT,
        max_new_tokens=len(reference),
        ignore_eos=True,
        trace=True,
        session_id="deploy-kill",
        create_session=True,
    )
    return {
        "identical": ids == reference,
        "killed": state["killed"],
        "killed_at_token": state["at"],
        "tokens": len(ids),
        "seconds": time.monotonic() - started,
    }


def one_run(client: Orchestrator) -> dict[str, float]:
    """tok/s of the greedy speed prompt (fresh session) from the client, and median per-round costs."""
    started = time.monotonic()
    resp = client.generate(prompt=PROMPT, max_new_tokens=SPEED_TOKENS, ignore_eos=True, trace=True)
    wall = time.monotonic() - started
    median = lambda xs: sorted(xs)[len(xs) // 2] if xs else 0.0  # noqa: E731
    in_rounds = sum(r.draft_ms + r.target_ms + r.overhead_ms for r in resp.trace) / 1000
    return {
        "tok_s": len(resp.token_ids) / wall,
        "wall_s": wall,
        "rounds_s": in_rounds,
        "draft_ms": median([r.draft_ms for r in resp.trace]),
        "target_ms": median([r.target_ms for r in resp.trace]),
        "overhead_ms": median([r.overhead_ms for r in resp.trace]),
        "mal": resp.stats.mean_accepted_length,
    }


def side_by_side(a: Orchestrator, b: Orchestrator, runs: int = SPEED_RUNS) -> tuple[dict, dict]:
    """Interleaved (warm-up, then ABAB...) runs on two stacks; the median run of each by tok/s."""
    one_run(a), one_run(b)
    runs_a, runs_b = [], []
    for _ in range(runs):
        runs_a.append(one_run(a))
        runs_b.append(one_run(b))
    pick = lambda rs: sorted(rs, key=lambda r: r["tok_s"])[len(rs) // 2]  # noqa: E731
    return pick(runs_a), pick(runs_b)


def wait_serving_on(client: Orchestrator, replica: str, deadline_s: float) -> float:
    """Seconds until a new session's rounds run on `replica` (an IP:port), within deadline_s."""
    started = time.monotonic()
    i = 0
    while time.monotonic() - started < deadline_s:
        resp = client.generate(
            prompt=f"probe {i}",
            max_new_tokens=4,
            ignore_eos=True,
            trace=True,
            session_id=f"deploy-probe-{i}",
            create_session=True,
        )
        if any(r.target_replica == replica for r in resp.trace):
            return time.monotonic() - started
        i += 1
    raise TimeoutError(f"no round ran on {replica} within {deadline_s:.0f} s")
