"""A feature (EAGLE-style) draft through the whole system, each service its own process.

The target returns its hidden states with each Verify, the orchestrator relays them to the
draft with the next Propose (orchestrator/features.py). A tiny random target and a random feature
draft around it: acceptance is not the point here (test_shipped_draft.py measures the real one);
the relay, the draft's catch-up and lossless output are.
"""

from __future__ import annotations

import grpc
import pytest

from specdec.launcher import LocalStack, StackConfig
from specdec.models.feature_draft import build_feature_draft, save_feature_draft
from specdec.models.loader import load_causal_lm, load_tokenizer
from specdec.v1 import orchestrator_pb2 as pb
from specdec.v1 import orchestrator_pb2_grpc
from tests.prompts import IDENTITY_PROMPTS
from tests.support import divergence, make_tiny_pair, refused_generate, target_greedy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

K = 3
MAX_NEW = 24
RPC_TIMEOUT_S = 120.0
PROMPTS = 3


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("feature")
    target_dir, _ = make_tiny_pair(root, IDENTITY_PROMPTS)
    target = load_causal_lm(str(target_dir)).model
    draft = build_feature_draft(target, head_ids=None)
    draft.init_from_target(target)
    save_feature_draft(root / "feature-draft", draft, str(target_dir))
    return target, target_dir, root / "feature-draft", load_tokenizer(str(target_dir))


@pytest.fixture(scope="module")
def stub(models):
    _, target_dir, draft_dir, _ = models
    stack = LocalStack(
        StackConfig(target_model=str(target_dir), draft_model=str(draft_dir), draft_kind="model")
    ).start()
    channel = grpc.insecure_channel(stack.orchestrator_address)
    yield orchestrator_pb2_grpc.OrchestratorStub(channel)
    channel.close()
    stack.stop()


def request(prompt: str, **extra) -> pb.GenerateRequest:
    return pb.GenerateRequest(prompt=prompt, k=K, max_new_tokens=MAX_NEW, trace=True, ignore_eos=True, **extra)


def test_greedy_output_equals_the_target_and_the_draft_drafts_from_round_two(stub, models):
    target, _, _, tok = models
    for prompt in IDENTITY_PROMPTS[:PROMPTS]:
        resp = stub.Generate(request(prompt), timeout=RPC_TIMEOUT_S)
        ids = tok.encode(prompt)
        assert divergence(target, ids, list(resp.token_ids), target_greedy(target, ids, MAX_NEW, [-1])) in ("", "tie")
        rounds = list(resp.trace)
        assert len(rounds[0].draft_ids) == 0  # round 1: the target's rows are not there yet
        assert all(len(r.draft_ids) == r.k for r in rounds[1:] if r.k)
        assert sum(len(r.draft_ids) for r in rounds) > 0


def test_a_second_turn_continues_with_the_rows_the_draft_kept(stub, models):
    target, _, _, tok = models
    one = stub.Generate(request("Once upon a time"), timeout=RPC_TIMEOUT_S)
    two = stub.Generate(request(" And then", session_id=one.session_id), timeout=RPC_TIMEOUT_S)
    ids = tok.encode("Once upon a time") + list(one.token_ids) + tok.encode(" And then", add_special_tokens=False)
    assert divergence(target, ids, list(two.token_ids), target_greedy(target, ids, MAX_NEW, [-1])) in ("", "tie")
    # Round 1 of any turn is the target's prefill of the new tokens (no rows for them yet); the draft
    # kept turn one's rows and needs only the new ones: it drafts from round 2.
    assert len(two.trace[0].draft_ids) == 0 and len(two.trace[1].draft_ids) == K


def test_a_target_without_hidden_states_is_refused_with_a_clear_message(models, redis_server):
    _, target_dir, draft_dir, _ = models
    err = refused_generate(
        StackConfig(
            target_model=str(target_dir),
            draft_model=str(draft_dir),
            draft_kind="model",
            redis_url=redis_server.url,
            extra_env={"SPECDEC_KEEP_HIDDEN": "0"},
        ),
        request("Once upon a time"),
        RPC_TIMEOUT_S,
    )
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "hidden states" in err.details() and "SPECDEC_KEEP_HIDDEN" in err.details()


def test_a_feature_draft_cannot_be_the_combined_kind(models):
    """It needs the target's rows every round; lookup rounds in between would starve it: refused at load."""
    from specdec.config import ModelServiceConfig
    from specdec.engine.loading import load_draft

    _, _, draft_dir, _ = models
    with pytest.raises(ValueError, match="cannot be combined with prompt lookup"):
        load_draft(ModelServiceConfig(role="draft", model=str(draft_dir), draft_kind="combined"))
    bundle = load_draft(ModelServiceConfig(role="draft", model=str(draft_dir), draft_kind="model"))
    assert "combined" not in bundle.engines and bundle.info["needs_target_hidden"]
