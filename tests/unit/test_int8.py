"""--dtype int8: int8 linear weights whose outputs do not depend on which rows share a call, so
speculation (k + 1 rows per verify) is greedy-identical to the int8 target as served (1 row a step)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specdec.config import ModelServiceConfig
from specdec.engine.loading import load_target
from specdec.engine.torch_runner import CausalLMRunner
from specdec.models.int8 import Int8Linear, int8_available, quantize_linears, wants_int8
from tests.support import make_tiny_pair
from tests.tiny_llama import tiny_llama, tiny_runner

pytestmark = pytest.mark.skipif(not int8_available(), reason="torch's fbgemm engine (x86) is not in this build")


def test_a_row_s_output_is_the_same_whatever_rows_share_the_call():
    gen = torch.Generator().manual_seed(2)
    linear = nn.Linear(64, 48, bias=True)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(48, 64, generator=gen))
    q = Int8Linear(linear)
    x = torch.randn(1, 9, 64, generator=gen)
    x[0, 3] *= 50.0  # one row with a far larger range than the rest
    with torch.inference_mode():
        together = q(x)
        alone = torch.cat([q(x[:, i : i + 1]) for i in range(9)], dim=1)
        assert torch.equal(together, alone)
        want = linear(x)
    assert torch.allclose(together, want, rtol=0, atol=0.05 * float(want.abs().max()))  # int8: close, not equal
    assert q.weight.shape == (48, 64)


def greedy_steps(r: CausalLMRunner, prompt: list[int], n: int) -> list[int]:
    """The target as served at k = 0: one row per step, KV cache reused."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(r.extend("plain", ids, len(ids) - 1).logits[-1].argmax()))
    return ids[len(prompt) :]


def speculative(r: CausalLMRunner, prompt: list[int], n: int, k: int) -> list[int]:
    """Greedy speculation: draft k tokens by prompt lookup (the tokens after the last earlier match of
    the tail; a fixed guess when none), verify the k + 1 rows in ONE pass, keep the agreed prefix and
    the target's token after it."""
    ids = list(prompt)
    while len(ids) - len(prompt) < n:
        tail = ids[-1]
        starts = [i + 1 for i in range(len(ids) - 1) if ids[i] == tail]
        draft = (ids[starts[-1] : starts[-1] + k] if starts else []) or [7] * k
        logits = r.extend("spec", ids + draft, len(ids) - 1).logits  # [len(draft) + 1, V]
        targets = logits.argmax(-1).tolist()
        kept = 0
        while kept < len(draft) and draft[kept] == targets[kept]:
            kept += 1
        ids += draft[:kept] + [targets[kept]]
    return ids[len(prompt) : len(prompt) + n]


def test_speculation_is_greedy_identical_to_the_int8_target_as_served_on_a_tiny_model():
    # (a plain runner: the tiny model happens not to flip; the service runs row-invariant attention,
    # tests/unit/test_int8_row_invariance.py, which SmolLM2 needs: see specdec/models/int8.py)
    model = tiny_llama(hidden=64, seed=5)
    replaced, nbytes = quantize_linears(model)
    assert replaced == 2 * 7 + 1 and nbytes == (2 * (64 * 64 * 2 + 64 * 32 * 2 + 64 * 128 * 3) + 96 * 64)
    assert isinstance(model.lm_head, Int8Linear) and type(model.model.embed_tokens) is nn.Embedding
    prompt = [5, 9, 11, 3, 70, 2, 8, 5, 9, 11]
    want = greedy_steps(tiny_runner(model), prompt, 40)
    for k in (1, 4, 8):
        assert speculative(tiny_runner(model), prompt, 40, k) == want, k


def test_a_target_service_loads_int8_and_says_so(tmp_path):
    target, _ = make_tiny_pair(tmp_path, ["the cat sat on the mat"])
    bundle = load_target(
        ModelServiceConfig(role="target", model=str(target), dtype="int8", cache_dir=str(tmp_path / "cache"))
    )
    assert bundle.info["dtype"] == "int8" and bundle.kernels.kernels[0] == "int8_fbgemm"
    assert wants_int8("INT8") and not wants_int8("float32")
    engine_model = bundle.engines["target"].runner.model
    assert isinstance(engine_model.lm_head, Int8Linear)
