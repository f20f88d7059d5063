"""A configured KV-cache budget holds however many sessions arrive: evict, never crash."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from transformers import AutoConfig

from specdec.engine.kvcache import kv_bytes_per_token
from specdec.launcher import LocalStack, StackConfig
from specdec.v1 import common_pb2, orchestrator_pb2_grpc, target_pb2_grpc
from specdec.v1 import orchestrator_pb2 as pb
from tests.prompts import IDENTITY_PROMPTS
from tests.support import make_tiny_pair

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SESSIONS, MAX_NEW, BUDGET_TOKENS = 12, 16, 120  # 12 sessions of ~30 tokens: 3x the budget, evictions certain


def test_many_sessions_stay_within_the_target_budget(tmp_path, redis_server):
    target_dir, draft_dir = make_tiny_pair(tmp_path / "tiny", IDENTITY_PROMPTS)
    budget = BUDGET_TOKENS * kv_bytes_per_token(AutoConfig.from_pretrained(str(target_dir)), 4)
    cfg = StackConfig(
        target_model=str(target_dir),
        draft_model=str(draft_dir),
        draft_kind="model",
        redis_url=redis_server.url,
        cache_budget_bytes=budget,
    )

    def one(i: int) -> tuple[list[int], list[int]]:
        with grpc.insecure_channel(stack.orchestrator_address) as channel:
            stub = orchestrator_pb2_grpc.OrchestratorStub(channel)
            req = pb.GenerateRequest(
                prompt=IDENTITY_PROMPTS[i % len(IDENTITY_PROMPTS)], k=3, max_new_tokens=MAX_NEW, ignore_eos=True
            )
            spec = stub.Generate(req, timeout=120)
            req.k = 0
            return list(spec.token_ids), list(stub.Generate(req, timeout=120).token_ids)

    with LocalStack(cfg) as stack:
        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(one, range(SESSIONS)))
        with grpc.insecure_channel(stack.targets[0].address) as channel:
            stats = target_pb2_grpc.TargetStub(channel).Stats(common_pb2.InfoRequest(), timeout=10)
    print(
        f"\nbudget {budget} B: used {stats.cache_used_bytes} B, {stats.cached_sessions} sessions cached, "
        f"{stats.cache_evictions} evictions, {stats.failures} failures"
    )
    assert all(spec == plain for spec, plain in results)
    assert stats.cache_evictions > 0 and stats.failures == 0
    assert 0 < stats.cache_used_bytes <= stats.cache_budget_bytes == budget
