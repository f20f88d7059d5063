"""Prefix sharing through the stack (three processes, real gRPC, real Redis): a new session whose prompt
starts with what another session holds (a chat client resending its conversation) is served that prefix
from the target's and the draft's KV caches; the output still equals the target alone, and the usage
reports the tokens served from the cache (OpenAI's prompt_tokens_details.cached_tokens)."""

from __future__ import annotations

import grpc
import pytest
import torch
from transformers import AutoModelForCausalLM

from specdec.engine.kvcache import common_prefix_len
from specdec.launcher import LocalStack, StackConfig
from specdec.models.loader import load_tokenizer
from specdec.v1 import orchestrator_pb2 as pb
from specdec.v1 import orchestrator_pb2_grpc
from tests.prompts import IDENTITY_PROMPTS
from tests.support import make_tiny_pair, target_greedy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

K, MAX_NEW = 3, 16
NO_EOS = [49151]  # ignore_eos: the reference must not stop either (an id the tiny target never emits here)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, redis_server):
    target_dir, draft_dir = make_tiny_pair(tmp_path_factory.mktemp("tiny"), IDENTITY_PROMPTS)
    cfg = StackConfig(
        target_model=str(target_dir), draft_model=str(draft_dir), draft_kind="model", redis_url=redis_server.url
    )
    with LocalStack(cfg) as s:
        s.target_dir = target_dir
        yield s


def generate(stub, prompt: str) -> pb.GenerateResponse:
    req = pb.GenerateRequest(prompt=prompt, k=K, max_new_tokens=MAX_NEW, trace=True, ignore_eos=True)
    return stub.Generate(req, timeout=120)


def test_a_resent_conversation_is_served_from_the_cache_with_the_same_output(stack):
    tok = load_tokenizer(str(stack.target_dir))
    model = AutoModelForCausalLM.from_pretrained(str(stack.target_dir), dtype=torch.float32).eval()
    with grpc.insecure_channel(stack.orchestrator_address) as channel:
        stub = orchestrator_pb2_grpc.OrchestratorStub(channel)
        first = generate(stub, IDENTITY_PROMPTS[0])
        assert first.trace[0].target_cached_tokens == 0 and first.usage.cached_prompt_tokens == 0
        turn2 = IDENTITY_PROMPTS[0] + first.text + " And then, what happened next in the story?"
        second = generate(stub, turn2)
    first_ids, turn2_ids = tok.encode(IDENTITY_PROMPTS[0]), tok.encode(turn2)
    shared = common_prefix_len(first_ids + list(first.token_ids), turn2_ids)
    assert shared > len(first_ids)  # the conversation, not only the first prompt
    cached = second.trace[0].target_cached_tokens
    assert shared - 2 <= cached <= shared, (cached, shared)  # the donor may not hold its last token(s)
    assert second.usage.cached_prompt_tokens == cached
    assert second.trace[0].draft_computed_tokens < len(turn2_ids) - len(first_ids)  # the draft shared too
    assert list(second.token_ids) == target_greedy(model, turn2_ids, MAX_NEW, NO_EOS)
