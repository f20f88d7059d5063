"""Chunked prefill through the stack: a target and a model draft with a tiny chunk size (8 tokens), each service
its own process, at 1 and at 2 torch threads.

Long prompts are prefilled 8 tokens a pass with other sessions' rounds in between; every session's
greedy output must still equal the target alone, and the first round must account for all the
prompt's tokens (the chunks' work is added to that Verify's stats). The draft's first Propose of a
session prefills in 8-token model calls too.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from specdec.launcher import LocalStack, StackConfig
from specdec.models.loader import load_causal_lm, load_tokenizer
from specdec.server.model_service import WORKER_METADATA_PREFIX
from specdec.v1 import common_pb2, draft_pb2_grpc, orchestrator_pb2_grpc, target_pb2_grpc
from specdec.v1 import orchestrator_pb2 as pb
from tests.prompts import IDENTITY_PROMPTS
from tests.support import divergence, make_tiny_pair, target_greedy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHUNK = 8
MAX_NEW = 20
RPC_TIMEOUT_S = 120.0


@pytest.fixture(scope="module", params=[1, 2], ids=["1-thread", "2-threads-forwards-on-loop"])
def setup(request, tmp_path_factory):
    """A model draft beside the target, both chunking prefills; at 2 torch threads every forward, chunks and
    batches too, runs on each service's event loop (SPECDEC_LOOP_FORWARDS auto)."""
    target_dir, draft_dir = make_tiny_pair(tmp_path_factory.mktemp("chunked"), IDENTITY_PROMPTS)
    stack = LocalStack(
        StackConfig(
            target_model=str(target_dir),
            draft_model=str(draft_dir),
            draft_kind="model",
            threads=request.param,
            extra_env={"SPECDEC_PREFILL_CHUNK_TOKENS": str(CHUNK)},
        )
    ).start()
    channels = [grpc.insecure_channel(p.address) for p in (stack.targets[0], stack.drafts[0])]
    channel = grpc.insecure_channel(stack.orchestrator_address)
    yield (
        orchestrator_pb2_grpc.OrchestratorStub(channel),
        target_pb2_grpc.TargetStub(channels[0]),
        draft_pb2_grpc.DraftStub(channels[1]),
        load_causal_lm(str(target_dir)).model,
        load_tokenizer(str(target_dir)),
        request.param,
    )
    for c in [channel, *channels]:
        c.close()
    stack.stop()


def worker_counters(stub) -> dict[str, int]:
    """The service's worker counters (Info's trailing metadata)."""
    _, call = stub.Info.with_call(common_pb2.InfoRequest(), timeout=10)
    return {
        key[len(WORKER_METADATA_PREFIX) :]: int(value)
        for key, value in call.trailing_metadata()
        if key.startswith(WORKER_METADATA_PREFIX)
    }


def test_concurrent_long_prompts_prefilled_in_chunks_give_the_target_s_greedy_output(setup):
    stub, target_stub, draft_stub, target, tok, threads = setup
    rotated = [IDENTITY_PROMPTS[i:] + IDENTITY_PROMPTS[:i] for i in range(4)]
    prompts = [" ".join(texts) for texts in rotated]  # several chunks each

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
    assert stats.calls - stats.batches >= 3 * len(prompts)  # the chunks: passes of their own
    proposals = sum(1 for resp in responses for r in resp.trace if r.draft_kind == "model")
    draft_calls = draft_stub.Stats(common_pb2.InfoRequest(), timeout=10).calls
    assert proposals and draft_calls - proposals >= 2 * len(prompts)  # the draft's first Propose: in chunks too
    for worker in (worker_counters(target_stub), worker_counters(draft_stub)):  # all on the loop at 2 threads
        assert (worker["inline-calls"] == worker["calls"]) == (threads > 1), worker
