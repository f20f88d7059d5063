"""Scale-out: 2 draft and 2 target processes behind one orchestrator (real gRPC, real Redis).

Sessions spread over both replicas of each pool, every round of a session goes
to the same replica (rendezvous hashing on the session id), so the replicas'
KV caches are hit, and the output equals the target alone.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import torch
from transformers import AutoModelForCausalLM

from deploy_tools.checks import service_stats
from specdec.launcher import LocalStack, StackConfig
from specdec.v1 import orchestrator_pb2 as pb
from specdec.v1 import orchestrator_pb2_grpc
from tests.prompts import IDENTITY_PROMPTS
from tests.support import make_tiny_pair, target_greedy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SESSIONS, MAX_NEW, K = 12, 24, 3
NO_EOS = [49151]  # ignore_eos: the reference must not stop either (an id the tiny target never emits here)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, redis_server):
    target_dir, draft_dir = make_tiny_pair(tmp_path_factory.mktemp("tiny"), IDENTITY_PROMPTS)
    cfg = StackConfig(
        target_model=str(target_dir),
        draft_model=str(draft_dir),
        draft_kind="model",
        draft_replicas=2,
        target_replicas=2,
        redis_url=redis_server.url,
    )
    with LocalStack(cfg) as s:
        s.target_dir = target_dir
        yield s


def run_session(address: str, i: int) -> pb.GenerateResponse:
    with grpc.insecure_channel(address) as channel:
        stub = orchestrator_pb2_grpc.OrchestratorStub(channel)
        req = pb.GenerateRequest(
            prompt=IDENTITY_PROMPTS[i],
            k=K,
            max_new_tokens=MAX_NEW,
            trace=True,
            ignore_eos=True,
            session_id=f"scale-{i}",
            create_session=True,
        )
        return stub.Generate(req, timeout=120)


def test_sessions_spread_stick_and_match_the_target(stack):
    with ThreadPoolExecutor(max_workers=4) as pool:
        responses = list(pool.map(lambda i: run_session(stack.orchestrator_address, i), range(SESSIONS)))
    model = AutoModelForCausalLM.from_pretrained(str(stack.target_dir), dtype=torch.float32).eval()

    def tok_ids(text):
        return __import__("specdec.models.loader", fromlist=["x"]).load_tokenizer(str(stack.target_dir)).encode(text)  # noqa: E731

    used_targets, used_drafts = set(), set()
    for i, resp in enumerate(responses):
        targets = {r.target_replica for r in resp.trace}
        drafts = {r.draft_replica for r in resp.trace if r.k > 0}
        assert len(targets) == 1 and len(drafts) == 1, f"session {i} moved between replicas: {targets} {drafts}"
        used_targets |= targets
        used_drafts |= drafts
        assert list(resp.token_ids) == target_greedy(model, tok_ids(IDENTITY_PROMPTS[i]), MAX_NEW, NO_EOS)
    assert len(used_targets) == 2 and len(used_drafts) == 2, (used_targets, used_drafts)
    for proc in stack.procs:
        if proc.role in ("target", "draft"):
            st = service_stats(proc.address, proc.role)
            print(
                f"{proc.role} {proc.address}: calls={st.calls} hits={st.cache_hits} misses={st.cache_misses} "
                f"rollbacks={st.cache_rollbacks} computed={st.computed_tokens} reused={st.reused_tokens}"
            )
            assert st.cache_hits > st.cache_misses > 0


def chat_turn(messages: list[tuple[str, str]]) -> pb.GenerateRequest:
    """A stateless chat request (no session id: routed by its conversation, orchestrator/affinity.py)."""
    req = pb.GenerateRequest(k=K, max_new_tokens=8, trace=True, ignore_eos=True)
    for role, content in messages:
        req.messages.messages.add(role=role, content=content)
    return req


def test_a_resent_conversation_goes_to_the_replicas_that_hold_its_earlier_turn(stack):
    """Each turn comes under a new session id; all turns of one conversation meet the same target and draft
    replica, where the new session starts from the previous turn's cached prefix (prefix sharing)."""
    system = ("system", "You answer in one short sentence.")
    with grpc.insecure_channel(stack.orchestrator_address) as channel:
        stub = orchestrator_pb2_grpc.OrchestratorStub(channel)
        for i in range(4):
            first = [system, ("user", IDENTITY_PROMPTS[i])]
            one = stub.Generate(chat_turn(first), timeout=120)
            two = stub.Generate(chat_turn(first + [("assistant", one.text), ("user", "Say more.")]), timeout=120)
            assert one.session_id != two.session_id
            targets = {r.target_replica for r in [*one.trace, *two.trace]}
            drafts = {r.draft_replica for r in [*one.trace, *two.trace] if r.k > 0}
            assert len(targets) == 1 and len(drafts) == 1, f"conversation {i} moved: {targets} {drafts}"
            assert two.trace[0].target_cached_tokens >= one.usage.prompt_tokens, "turn 2 shared no prefix"


def test_identical_openings_arriving_together_take_the_keys_next_routes(stack):
    """A load test repeating one prompt must not pile onto one replica: past SPECDEC_AFFINITY_MAX_LIVE
    generations of one key in flight, the next take `key#1`, `key#2`, ... (rendezvous-hashed like any key)."""
    from orchestrator.affinity import conversation_key
    from specdec.routing import rendezvous_rank

    proc = stack.start_orchestrator(env={"SPECDEC_AFFINITY_MAX_LIVE": "1"})
    stack.wait_ready(proc)
    stack.wait_connected(proc, stack.targets)
    request = chat_turn([("user", IDENTITY_PROMPTS[5])])
    request.max_new_tokens = 96  # long enough that the four are in flight together
    with grpc.insecure_channel(proc.address) as channel:
        stub = orchestrator_pb2_grpc.OrchestratorStub(channel)
        with ThreadPoolExecutor(max_workers=4) as pool:
            responses = list(pool.map(lambda _: stub.Generate(request, timeout=120), range(4)))
    key, targets = conversation_key(request, 1024), [p.address for p in stack.targets]
    expected = {rendezvous_rank(route, targets)[0] for route in [key] + [f"{key}#{n}" for n in range(1, 4)]}
    seen = [{r.target_replica for r in resp.trace} for resp in responses]
    assert all(len(s) == 1 for s in seen) and set.union(*seen) == expected
