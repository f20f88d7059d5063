"""The CUDA-graph path of the torch runner, tested where the CPU can: static slots, replay discipline, the guard.

A CUDA graph replays the kernels it captured on fixed buffers; `EagerGraph` replays the captured function on
the same fixed buffers, so a slot that forgot to copy its inputs in, read a stale output, or rolled back the
wrong length gives wrong logits here as it would on a GPU. The GPU itself is measured by scripts/gpu_check.sh.
"""

from __future__ import annotations

import pytest
import torch

from specdec.engine.cuda_graphs import CudaGraph, EagerGraph, GraphCacheOps
from specdec.engine.kvcache import KVCachePool, kv_bytes_per_token
from specdec.engine.runner import ExtendItem
from specdec.engine.torch_runner import CausalLMRunner
from specdec.errors import ResourceExhausted
from specdec.models.compat import cache_argument
from tests.tiny_llama import tiny_llama

MAX_ROWS = 5
ATOL = 1e-5


class FailingGraph(EagerGraph):
    """A capture that the graph cannot hold (as a host sync inside the forward would be on a GPU)."""

    def capture(self, fn):
        raise RuntimeError("operation not permitted when stream is capturing")


def _runners(graph=EagerGraph, slots=4, max_tokens=128, share=0, device="cpu"):
    model = tiny_llama().to(device)
    per_token = kv_bytes_per_token(model.config, 4)
    ops = GraphCacheOps(
        model, cache_argument(model), slots=slots, max_tokens=max_tokens, max_rows=MAX_ROWS, graph_factory=graph
    )
    graphed = CausalLMRunner(model, KVCachePool(10_000 * per_token, per_token, model.config, share, ops=ops))
    plain = CausalLMRunner(model, KVCachePool(10_000 * per_token, per_token, model.config, share))
    return graphed, plain, ops


def _same(graphed, plain, session, ids, first):
    a = graphed.extend(session, ids, first).logits
    b = plain.extend(session, ids, first).logits
    assert a.shape == b.shape
    torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


def test_graphed_passes_give_the_eager_logits_through_prefill_decode_verify_and_rollback():
    graphed, plain, ops = _runners()
    ids = [(7 * i + 3) % 90 + 1 for i in range(40)]
    _same(graphed, plain, "s", ids[:20], 19)  # a prefill longer than MAX_ROWS: eager on the slot
    _same(graphed, plain, "s", ids[:21], 20)  # a decode step: 1 row, captured
    _same(graphed, plain, "s", ids[:25], 21)  # a verify pass: 4 rows, captured
    _same(graphed, plain, "s", ids[:22] + [5, 6, 7], 22)  # rollback of 3 rejected positions, then 3 rows
    _same(graphed, plain, "s", ids[:22] + [5, 6, 8], 24)  # a replayed 1-row graph at another position
    _same(graphed, plain, "s", ids[:22] + [5, 6, 8, 9], 25)
    assert ops.captures == 3  # rows 1, 3 and 4: each captured once


def test_a_released_slot_is_reused_with_its_graphs():
    graphed, plain, ops = _runners(slots=1)
    ids = list(range(1, 30))
    for session in ("a", "b", "c"):
        _same(graphed, plain, session, ids[:10], 9)
        _same(graphed, plain, session, ids[:11], 10)
        graphed.pool.release(session)
    assert len(ops._slots) == 1 and ops.captures == 1


def test_sessions_beyond_the_slots_evict_the_least_recent():
    graphed, plain, _ = _runners(slots=2)
    ids = list(range(1, 30))
    for session in ("a", "b", "c"):
        _same(graphed, plain, session, ids[:8], 7)
    result = graphed.extend("a", ids[:9], 8)  # "a" was evicted for "c": recomputed, correct
    assert result.cached_tokens == 0
    torch.testing.assert_close(result.logits, plain.extend("a", ids[:9], 8).logits, atol=ATOL, rtol=0)


def test_a_new_session_copies_another_sessions_prefix_into_its_slot():
    graphed, plain, _ = _runners(share=4)
    ids = list(range(1, 30))
    _same(graphed, plain, "a", ids[:16], 15)
    result = graphed.extend("b", ids[:16] + [3, 4], 16)
    assert result.cached_tokens > 0  # its prefix came from "a"'s slot
    torch.testing.assert_close(result.logits, plain.extend("b", ids[:16] + [3, 4], 16).logits, atol=ATOL, rtol=0)


def test_a_capture_that_fails_leaves_that_shape_eager_and_correct(caplog):
    graphed, plain, ops = _runners(graph=FailingGraph)
    ids = list(range(1, 30))
    _same(graphed, plain, "s", ids[:10], 9)
    _same(graphed, plain, "s", ids[:11], 10)
    _same(graphed, plain, "s", ids[:12], 11)
    assert "capture of 1 rows failed" in caplog.text and ops.captures == 1  # tried once, not per pass


def test_a_session_longer_than_a_slot_is_refused_and_its_slot_dropped():
    graphed, _, _ = _runners(max_tokens=16)
    with pytest.raises(ResourceExhausted, match="at most 16 positions"):
        graphed.extend("s", list(range(1, 20)), 18)
    assert graphed.extend("s", list(range(1, 12)), 10).logits.shape[0] == 1  # a fresh slot serves it again


def test_batches_of_several_sessions_are_refused_with_graphs():
    graphed, _, _ = _runners()
    with pytest.raises(ValueError, match="batches of one only"):
        graphed.extend_batch([ExtendItem("a", [1, 2], 1), ExtendItem("b", [1, 3], 1)])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run by scripts/gpu_check.sh)")
def test_real_cuda_graphs_give_the_eager_logits():
    graphed, plain, ops = _runners(graph=CudaGraph, device="cuda")
    ids = [(5 * i + 2) % 90 + 1 for i in range(40)]
    _same(graphed, plain, "s", ids[:20], 19)
    for end in range(21, 30):  # decode steps replayed at moving positions
        _same(graphed, plain, "s", ids[:end], end - 1)
    _same(graphed, plain, "s", ids[:25] + [4, 5, 6, 7], 25)  # rollback, then a 4-row verify pass
    assert ops.captures == 2


def test_graphs_are_refused_where_no_cuda_device_runs_the_model():
    from specdec.config import ModelServiceConfig
    from specdec.engine.torch_loading import graph_cache_ops

    cfg = ModelServiceConfig(role="target", model="embedded", cuda_graphs=True)
    with pytest.raises(ValueError, match="SPECDEC_CUDA_GRAPHS needs a CUDA device; embedded is on cpu"):
        graph_cache_ops(cfg, tiny_llama(), feature=False)
    assert graph_cache_ops(ModelServiceConfig(role="target", model="embedded"), tiny_llama(), feature=False) is None
