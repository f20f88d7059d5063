"""The trained-draft model: shared target tensors, restricted head, store-only-own-layers roundtrip."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from specdec.engine.kvcache import KVCachePool, kv_bytes_per_token
from specdec.engine.torch_runner import CausalLMRunner
from specdec.models.draft_format import DRAFT_CONFIG, HEAD_KEY, WEIGHTS, is_draft_dir
from specdec.models.draft_model import assemble, build_draft, save_draft
from specdec.models.tiny import build_tiny_causal_lm
from tests.support import smollm2_tokenizer

HEAD = list(range(100, 700)) + [2]


@pytest.fixture(scope="module")
def target():
    return build_tiny_causal_lm(smollm2_tokenizer(), layers=3, seed=3)


def test_shares_the_targets_tensors(target):
    draft = build_draft(target, 2, HEAD)
    assert draft.model.embed_tokens.weight.data_ptr() == target.model.embed_tokens.weight.data_ptr()
    assert draft.model.norm.weight.data_ptr() == target.model.norm.weight.data_ptr()
    assert draft.get_output_embeddings().weight.data_ptr() == target.lm_head.weight.data_ptr()
    assert draft.get_output_embeddings().weight.shape[0] == target.lm_head.weight.shape[0]
    assert draft.config.num_hidden_layers == 2 and len(draft.model.layers) == 2
    # initialised from the target's first and last layers
    assert torch.equal(draft.model.layers[0].mlp.up_proj.weight, target.model.layers[0].mlp.up_proj.weight)
    assert torch.equal(draft.model.layers[1].mlp.up_proj.weight, target.model.layers[2].mlp.up_proj.weight)


def test_restricted_head_is_minus_inf_outside_the_subset(target):
    draft = build_draft(target, 1, HEAD)
    with torch.inference_mode():
        logits = draft(input_ids=torch.tensor([[5, 6, 7, 8]]), logits_to_keep=2).logits  # [1, 2, V]
    width = target.lm_head.weight.shape[0]
    assert logits.shape == (1, 2, width)
    inside = torch.zeros(width, dtype=torch.bool)
    inside[HEAD] = True
    assert torch.isinf(logits[..., ~inside]).all() and (logits[..., ~inside] < 0).all()
    assert torch.isfinite(logits[..., inside]).all()
    assert set(logits.argmax(-1).flatten().tolist()) <= set(HEAD)


def test_runs_under_the_kv_cache_runner(target):
    draft = build_draft(target, 2, HEAD)
    pool = KVCachePool(1 << 26, kv_bytes_per_token(draft.config, 4), draft.config)
    runner = CausalLMRunner(draft, pool)
    ids = [11, 12, 13, 14, 15, 16]
    runner.extend("s", ids[:4], first=3)
    step = runner.extend("s", ids, first=4)  # reuses 4 cached tokens, computes 2
    with torch.inference_mode():
        full = draft(input_ids=torch.tensor([ids])).logits[0, 4:]
    inside = torch.isfinite(full)
    assert step.cached_tokens == 4 and step.computed_tokens == 2
    assert torch.allclose(step.logits[inside], full[inside], atol=1e-4, rtol=1e-4)
    assert pool.bytes_per_token == 2 * 2 * 2 * (64 // 4) * 4  # 2 draft layers, not the target's 3


@pytest.mark.parametrize("name", ["cache", "past_key_values"])
def test_a_cache_passed_under_either_name_is_used_and_returned(target, name):
    """The engine passes `cache`; Hugging Face's generate passes `past_key_values` in transformers
    releases before 5.2x (seen on 5.17). Either way the draft fills that cache and returns it."""
    from transformers import DynamicCache

    from specdec.models.compat import returned_cache

    draft = build_draft(target, 2, HEAD)
    ids = torch.tensor([[11, 12, 13, 14, 15, 16]])
    with torch.inference_mode():
        cache = DynamicCache(config=draft.config)
        first = draft(input_ids=ids[:, :4], use_cache=True, **{name: cache})
        step = draft(input_ids=ids[:, 4:], position_ids=torch.tensor([[4, 5]]), use_cache=True, **{name: cache})
        full = draft(input_ids=ids).logits[0, 4:]
    assert returned_cache(first) is cache and cache.get_seq_length() == 6
    inside = torch.isfinite(full)
    assert torch.allclose(step.logits[0][inside], full[inside], atol=1e-4, rtol=1e-4)


def test_save_load_roundtrip_stores_only_the_layers(target, tmp_path):
    draft = build_draft(target, 2, HEAD)
    with torch.no_grad():
        for p in draft.model.layers.parameters():
            p.mul_(0.5)  # differ from the target's layers
    save_draft(tmp_path, draft, "local:/somewhere/target", meta={"training": {"steps": 1}})
    assert is_draft_dir(tmp_path)
    config = json.loads((tmp_path / DRAFT_CONFIG).read_text())
    assert config["kind"] == "specdec-draft" and config["layers"] == 2 and config["head_tokens"] == len(HEAD)
    with safe_open(str(tmp_path / WEIGHTS), framework="pt") as f:
        keys = set(f.keys())
        assert sorted(f.get_tensor(HEAD_KEY).tolist()) == sorted(HEAD)
        assert all(f.get_tensor(k).dtype == torch.float16 for k in keys if k != HEAD_KEY)
    assert all(k.startswith("layers.") for k in keys - {HEAD_KEY})
    assert not any("embed" in k or "lm_head" in k or k.startswith("norm") for k in keys)
    stored = sum(f.numel() for f in draft.model.layers.parameters())
    assert (tmp_path / WEIGHTS).stat().st_size < 2 * stored + 64 * 1024  # fp16 layers + ids + header

    loaded = assemble(target, tmp_path)
    assert loaded.model.embed_tokens.weight.data_ptr() == target.model.embed_tokens.weight.data_ptr()
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    with torch.inference_mode():
        a, b = draft(input_ids=ids).logits, loaded(input_ids=ids).logits
    finite = torch.isfinite(a)
    assert torch.equal(finite, torch.isfinite(b))
    assert torch.equal(a.argmax(-1), b.argmax(-1))
    assert (a[finite] - b[finite]).abs().max() < 0.05 * a[finite].abs().max()  # fp16 storage
