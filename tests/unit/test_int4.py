"""--dtype int4: group-wise int4 weights on torch's weight-only int4 GEMM, bfloat16 activations. A row's
output does not depend on which rows share the call, the GGUF's own Q4_1 blocks are found again, and in
a row-invariant runner's pass each session's prefill rows take the bfloat16 GEMM on their own while
the returned rows take the int4 one (specdec/models/int4.py, specdec/models/row_groups.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from specdec.config import ModelServiceConfig
from specdec.engine.kvcache import kv_bytes_per_token
from specdec.engine.loading import load_target
from specdec.engine.torch_loading import quantize_weights, weight_quantization
from specdec.models.int4 import (
    GROUP_SIZE,
    LEVELS,
    Int4Linear,
    dequantize_groups,
    int4_available,
    quantize_groups,
    quantize_linears_int4,
    wants_int4,
)
from specdec.models.row_groups import RowGroups, current_row_groups, row_groups
from tests.support import make_tiny_pair

pytestmark = pytest.mark.skipif(not int4_available(), reason="torch's CPU int4 GEMM is not in this build")

IN, OUT = 96, 48


def linear(seed: int = 3, bias: bool = True) -> nn.Linear:
    gen = torch.Generator().manual_seed(seed)
    layer = nn.Linear(IN, OUT, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(OUT, IN, generator=gen))
        if bias:
            layer.bias.copy_(torch.randn(OUT, generator=gen))
    return layer


def test_the_dtype_option_names_int4():
    assert wants_int4("int4") and wants_int4(" INT4 ") and not wants_int4("int8")
    assert weight_quantization("int4") == "int4" and weight_quantization("int8") == "int8"
    assert weight_quantization("bfloat16") is None


def test_q4_1_blocks_are_found_again():
    """Weights that ARE Q4_1 blocks (w = d * q + m per 32, each block using codes 0 and 15) quantize back
    to the same codes, and dequantize to them up to the bfloat16 rounding of the scale and zero."""
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, LEVELS + 1, (OUT, IN), generator=gen)
    codes[:, ::GROUP_SIZE], codes[:, 1::GROUP_SIZE] = 0, LEVELS  # every block spans its range
    d = torch.rand(OUT, IN // GROUP_SIZE, 1, generator=gen) * 0.02 + 0.001
    m = torch.randn(OUT, IN // GROUP_SIZE, 1, generator=gen) * 0.1
    w = (codes.reshape(OUT, -1, GROUP_SIZE) * d + m).reshape(OUT, IN)
    got, scale, zero = quantize_groups(w)
    assert torch.equal(got, codes.to(torch.int32))
    assert torch.allclose(dequantize_groups(got, scale, zero), w, atol=1e-6)
    dense = Int4Linear(_with_weight(w), 8)
    assert float((dense.weight.float() - w).abs().max()) <= 2**-8 * float(w.abs().max()) * 2


def _with_weight(w: torch.Tensor) -> nn.Linear:
    layer = nn.Linear(w.shape[1], w.shape[0], bias=False)
    with torch.no_grad():
        layer.weight.copy_(w)
    return layer


def test_a_row_s_output_is_the_same_whatever_rows_share_the_call():
    q = Int4Linear(linear(), max_rows=64)
    x = torch.randn(1, 13, IN, generator=torch.Generator().manual_seed(1))
    x[0, 4] *= 40.0
    with torch.inference_mode():
        together = q(x)
        alone = torch.cat([q(x[:, i : i + 1]) for i in range(13)], dim=1)
        want = linear()(x)
    assert together.dtype == torch.bfloat16 and torch.equal(together, alone)
    assert torch.allclose(together.float(), want, rtol=0, atol=0.1 * float(want.abs().max()))  # 4-bit: close
    assert q.weight.shape == (OUT, IN)


def test_wide_calls_take_the_bfloat16_gemm_over_the_same_weights():
    q = Int4Linear(linear(), max_rows=4)
    x = torch.randn(9, IN, generator=torch.Generator().manual_seed(2)).bfloat16()
    with torch.inference_mode():
        assert torch.equal(q(x), F.linear(x, q.dense, q.bias))
        assert torch.equal(q(x[:4]), q._int4(x[:4]))


def test_a_pass_s_prefill_rows_run_per_session_and_its_returned_rows_on_int4():
    """Session a: 6 prefill rows + 2 returned; session b: 3 returned (a warm verify); session c: 5 + 1."""
    q = Int4Linear(linear(), max_rows=2)
    x = torch.randn(17, IN, generator=torch.Generator().manual_seed(4)).bfloat16()
    groups = RowGroups(starts=(0, 8, 11), ends=(8, 11, 17), keeps=(2, 3, 1))
    assert groups.prefill_spans == [(0, 6), (11, 16)] and not groups.every_row_returned
    with torch.inference_mode():
        with row_groups(groups):
            assert current_row_groups() is groups
            got = q(x)
        assert current_row_groups() is None
        assert torch.equal(got[0:6], F.linear(x[0:6], q.dense, q.bias))  # as that session's prefill alone
        assert torch.equal(got[11:16], F.linear(x[11:16], q.dense, q.bias))
        for row in (6, 7, 8, 9, 10, 16):  # as a 1-row decode step
            assert torch.equal(got[row], q._int4(x[row : row + 1])[0])


def test_unsupported_shapes_stay_dense_and_the_head_is_kept():
    model = nn.Sequential(nn.Linear(IN, OUT), nn.Linear(OUT, 40), nn.Linear(OUT, IN))  # 40 outputs: no
    head = model[2]
    replaced, nbytes = quantize_linears_int4(model, max_rows=8, keep=(head,))
    assert replaced == 1 and nbytes > 0
    assert isinstance(model[0], Int4Linear) and type(model[1]) is nn.Linear and model[2] is head
    assert model[1].weight.dtype == torch.bfloat16 and head.weight.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="does not fit"):
        Int4Linear(nn.Linear(IN, 40), 8)


def test_a_target_service_loads_int4(tmp_path):
    target, _ = make_tiny_pair(tmp_path / "pair", ["the cat sat on the mat"])
    bundle = load_target(
        ModelServiceConfig(role="target", model=str(target), dtype="int4", cache_dir=str(tmp_path / "cache"))
    )
    runner = bundle.engines["target"].runner
    assert bundle.info["dtype"] == "int4" and runner.row_invariant
    assert set(bundle.kernels.kernels) == {"int4_weight_only"}
    layers = [m for m in runner.model.modules() if isinstance(m, Int4Linear)]
    assert layers and runner.model.get_output_embeddings().weight.dtype == torch.bfloat16
    kv_bf16 = kv_bytes_per_token(runner.model.config, 2)  # the KV is bfloat16: its budget counts 2 bytes
    assert kv_bf16 <= runner.pool.bytes_per_token < kv_bytes_per_token(runner.model.config, 4)


def test_a_trained_draft_sharing_the_target_s_tensors_is_refused_with_a_clear_error():
    class SharedDraft(nn.Module):  # what a trained draft looks like to the loader: its own root
        device = torch.device("cpu")

        def kernel_root(self) -> nn.Module:
            return self

    with pytest.raises(ValueError, match="int4 is for a whole causal LM"):
        quantize_weights(SharedDraft(), "int4")
