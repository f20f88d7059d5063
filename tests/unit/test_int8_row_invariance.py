"""The int8 and int4 targets are row-count invariant: every row whose logits a verify pass returns is bitwise what
the 1-row decode step computes at that position (attention included), so greedy speculation at any k
is token-identical to the quantized target decoding alone. Before row-invariant attention, SDPA over k + 1
query rows rounded differently from the 1-row call in the last bits (specdec/models/int8.py)."""

from __future__ import annotations

import pytest
import torch

from specdec.config import ModelServiceConfig
from specdec.engine.loading import load_target
from specdec.engine.runner import ExtendItem
from specdec.engine.torch_loading import wants_row_invariant
from specdec.engine.torch_runner import CausalLMRunner
from specdec.models.int4 import int4_available
from specdec.models.int8 import int8_available
from tests.support import make_tiny_pair
from tests.tiny_llama import tiny_llama, tiny_runner

AVAILABLE = {"int8": int8_available(), "int4": int4_available()}

PROMPT = [5, 9, 11, 3, 70, 2, 8, 5, 9, 11, 40, 41, 42, 43, 7, 7, 12, 90, 33, 1]
STEPS = 24
K_VALUES = (1, 4, 8)


@pytest.fixture(scope="module", params=["int8", "int4"])
def quantized_runner(request, tmp_path_factory) -> CausalLMRunner:
    """The int8 / int4 target exactly as a target service loads it (--dtype int8 / int4, default options)."""
    if not AVAILABLE[request.param]:
        pytest.skip(f"torch's {request.param} CPU kernels are not in this build")
    target, _ = make_tiny_pair(tmp_path_factory.mktemp("int8rows"), ["the cat sat on the mat"])
    bundle = load_target(
        ModelServiceConfig(
            role="target", model=str(target), dtype=request.param, cache_dir=str(tmp_path_factory.mktemp("cache"))
        )
    )
    assert bundle.info["dtype"] == request.param
    return bundle.engines["target"].runner


class AttentionRows:
    """Captures every layer's attention output (the o_proj input, [rows, H]) of the last forward."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.rows: list[torch.Tensor] = []
        for layer in model.model.layers:
            layer.self_attn.o_proj.register_forward_pre_hook(self._keep)

    def _keep(self, _module, args) -> None:
        self.rows.append(args[0].reshape(-1, args[0].shape[-1]).clone())

    def take(self) -> list[torch.Tensor]:
        rows, self.rows = self.rows, []
        return rows


def decode_alone(runner: CausalLMRunner, capture: AttentionRows, session: str) -> tuple[list[int], list, list]:
    """k = 0: the prompt, then one row per step. Returns the tokens, each step's logits [V] and
    each step's per-layer attention row [H] (step 0: the prompt pass's last row)."""
    ids, logits, attention = list(PROMPT), [], []
    for _ in range(STEPS):
        capture.take()
        row = runner.extend(session, ids, len(ids) - 1).logits[-1]
        logits.append(row)
        attention.append([layer[-1] for layer in capture.take()])
        ids.append(int(row.argmax()))
    return ids[len(PROMPT) :], logits, attention


def assert_rows_match_steps(
    runner: CausalLMRunner,
    capture: AttentionRows,
    session: str,
    k: int,
    tokens: list[int],
    logits: list,
    attention: list,
) -> None:
    """Verify passes of k + 1 rows (the last context token + k of the k = 0 tokens as the draft), from a
    cold cache (the prompt's prefill in the same pass) and at every later start: bitwise equal rows."""
    runner.pool.release(session)
    for t in range(STEPS - k):
        ids = PROMPT + tokens[: t + k]
        capture.take()
        out = runner.extend(session, ids, len(PROMPT) + t - 1).logits  # [k + 1, V]
        layers = capture.take()
        for j in range(k + 1):
            assert torch.equal(out[j], logits[t + j]), f"k={k}: logits of position {t + j} differ"
            for n, layer in enumerate(layers):
                got = layer[layer.shape[0] - (k + 1) + j]
                assert torch.equal(got, attention[t + j][n]), f"k={k}: layer {n} attention at {t + j} differs"


def test_every_verify_row_is_bitwise_the_one_row_step(quantized_runner):
    capture = AttentionRows(quantized_runner.model)
    tokens, logits, attention = decode_alone(quantized_runner, capture, "alone")
    for k in K_VALUES:
        assert_rows_match_steps(quantized_runner, capture, f"verify{k}", k, tokens, logits, attention)


def test_a_batched_pass_of_several_sessions_is_row_invariant_too(quantized_runner):
    assert quantized_runner.batching and quantized_runner.row_invariant
    capture = AttentionRows(quantized_runner.model)
    tokens, logits, _ = decode_alone(quantized_runner, capture, "ref")
    for s, t in enumerate((3, 7, 11)):  # three sessions decoded alone up to different points
        for i in range(t):
            quantized_runner.extend(f"b{s}", PROMPT + tokens[:i], len(PROMPT) + i - 1)
    items = [
        ExtendItem(f"b{s}", PROMPT + tokens[: t + k], len(PROMPT) + t - 1)  # then k = 1, 4, 2 in one pass
        for s, (t, k) in enumerate(((3, 1), (7, 4), (11, 2)))
    ]
    results = quantized_runner.extend_batch(items)
    assert results[0].batch_size == 3
    for item, got in zip(items, results):
        step = item.first + 1 - len(PROMPT)  # row j is the k = 0 step step + j
        for j, row in enumerate(got.logits):
            assert torch.equal(row, logits[step + j]), f"{item.session_id}: step {step + j} differs"


def test_row_invariance_is_the_quantized_default_and_can_be_forced():
    assert wants_row_invariant("auto", quantized=True) and not wants_row_invariant("auto", quantized=False)
    assert wants_row_invariant("ON", quantized=False) and not wants_row_invariant("off", quantized=True)
    with pytest.raises(ValueError, match="row_invariant"):
        wants_row_invariant("maybe", quantized=True)
    model = tiny_llama()
    runner = CausalLMRunner(model, tiny_runner(model).pool, row_invariant=True)
    assert runner.row_invariant and model.config._attn_implementation == "specdec_row_invariant"
