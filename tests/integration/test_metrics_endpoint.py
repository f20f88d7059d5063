"""Every service exports Prometheus metrics on /metrics; counters move with real traffic."""

from __future__ import annotations

import urllib.request

import grpc
import pytest

from specdec.launcher import LocalStack, StackConfig
from specdec.v1 import orchestrator_pb2 as pb
from specdec.v1 import orchestrator_pb2_grpc

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return resp.read().decode()


def value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


def test_metrics_of_all_three_services(redis_server):
    cfg = StackConfig(
        target_model="embedded",
        draft_kind="ngram",
        redis_url=redis_server.url,
        metrics=True,
        extra_env={"SPECDEC_LOCAL_NGRAM": "0"},
    )  # n-gram through the draft service, to see its metrics
    with LocalStack(cfg) as stack:
        with grpc.insecure_channel(stack.orchestrator_address) as channel:
            stub = orchestrator_pb2_grpc.OrchestratorStub(channel)
            req = pb.GenerateRequest(
                prompt="one two three four one two three four one two", k=4, max_new_tokens=16, ignore_eos=True
            )
            stub.Generate(req, timeout=60)
            chat = pb.GenerateRequest(k=4, max_new_tokens=4, ignore_eos=True)  # stateless: routed by its conversation
            chat.messages.messages.add(role="user", content="Count to ten.")
            stub.Generate(chat, timeout=60)
        texts = {p.role: scrape(p.metrics_port) for p in stack.procs}
    orch, target = texts["orchestrator"], texts["target"]
    assert value(orch, "specdec_spec_decode_num_drafts_total") >= 1
    assert value(orch, "specdec_spec_decode_num_draft_tokens_total") >= value(
        orch, "specdec_spec_decode_num_accepted_tokens_total"
    )
    assert value(orch, "specdec_spec_decode_num_emitted_tokens_total") == 16 + 4
    assert value(orch, "specdec_generations_total") == 2
    assert value(orch, 'specdec_generation_routes_total{by="session"}') == 1  # a short plain prompt: no key
    assert value(orch, 'specdec_generation_routes_total{by="conversation"}') == 1
    assert (
        "specdec_time_to_first_token_seconds_bucket" in orch
        and 'specdec_round_seconds_bucket{le="0.001",part="verify"}' in orch
    )
    assert value(target, "specdec_calls_total") >= 1 and value(target, "specdec_cache_hits_total") >= 1
    assert value(target, "specdec_computed_tokens_total") > 0
    assert value(texts["draft"], "specdec_calls_total") >= 1
