"""Chunked prefill through the stack: a target with a tiny chunk size (8 tokens), each service its own process.

Long prompts are prefilled 8 tokens a pass with other sessions' rounds in between; every session's
greedy output must still equal the target alone, and the first round must account for all the
prompt's tokens (the chunks' work is added to that Verify's stats).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from specdec.launcher import LocalStack, StackConfig
from specdec.models.loader import load_causal_lm, load_tokenizer
from specdec.server.model_service import WORKER_METADATA_PREFIX
from specdec.v1 import common_pb2, orchestrator_pb2_grpc, target_pb2_grpc
from specdec.v1 import orchestrator_pb2 as pb
from tests.prompts import IDENTITY_PROMPTS
from tests.support import divergence, make_tiny_pair, target_greedy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHUNK = 8
MAX_NEW = 20
RPC_TIMEOUT_S = 120.0


@pytest.fixture(scope="module", params=[1, 2], ids=["1-thread", "2-threads-forwards-on-loop"])
def setup(request, tmp_path_factory):
    """At 2 torch threads every forward, chunks and batches too, runs on the target's event loop
    (SPECDEC_LOOP_FORWARDS auto)."""
    target_dir, _ = make_tiny_pair(tmp_path_factory.mktemp("chunked"), IDENTITY_PROMPTS)
    stack = LocalStack(StackConfig(target_model=str(target_dir), threads=request.param,
                                   extra_env={"SPECDEC_PREFILL_CHUNK_TOKENS": str(CHUNK)})).start()
    channel = grpc.insecure_channel(stack.orchestrator_address)
    target = grpc.insecure_channel(stack.targets[0].address)
    yield orchestrator_pb2_grpc.OrchestratorStub(channel), target_pb2_grpc.TargetStub(target), \
        load_causal_lm(str(target_dir)).model, load_tokenizer(str(target_dir)), request.param
    channel.close()
    target.close()
    stack.stop()


def test_concurrent_long_prompts_prefilled_in_chunks_give_the_target_s_greedy_output(setup):
    stub, target_stub, target, tok, threads = setup
    rotated = [IDENTITY_PROMPTS[i:] + IDENTITY_PROMPTS[:i] for i in range(4)]
    prompts = [" ".join(texts) for texts in rotated]                         # several chunks each

    def generate(prompt: str) -> pb.GenerateResponse:
        req = pb.GenerateRequest(prompt=prompt, k=3, max_new_tokens=MAX_NEW, trace=True, ignore_eos=True)
        return stub.Generate(req, timeout=RPC_TIMEOUT_S)

    with ThreadPoolExecutor(len(prompts)) as pool:
        responses = list(pool.map(generate, prompts))
    for prompt, resp in zip(prompts, responses):
        ids = tok.encode(prompt)
        assert len(ids) > 3 * CHUNK
        want = target_greedy(target, ids, MAX_NEW, [-1])
        assert divergence(target, ids, list(resp.token_ids), want) in ("", "tie")
        first = resp.trace[0]
        assert first.target_cached_tokens + first.target_computed_tokens >= len(ids)
    stats = target_stub.Stats(common_pb2.InfoRequest(), timeout=10)
    assert stats.calls - stats.batches >= 3 * len(prompts)               # the chunks: passes of their own
    _, call = target_stub.Info.with_call(common_pb2.InfoRequest(), timeout=10)
    worker = {key[len(WORKER_METADATA_PREFIX):]: int(value) for key, value in call.trailing_metadata()
              if key.startswith(WORKER_METADATA_PREFIX)}
    assert (worker["inline-calls"] == worker["calls"]) == (threads > 1), worker   # all on the loop at 2 threads
