"""A few-kilobyte Llama built from a config, and a runner over it: for unit tests of layouts and kernels."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdec.engine.kvcache import KVCachePool, kv_bytes_per_token
from specdec.engine.torch_runner import CausalLMRunner


def tiny_llama(tied: bool = True, hidden: int = 32, seed: int = 3) -> LlamaForCausalLM:
    """A 2-layer Llama (vocab 96, `hidden` wide, MLP 2x), weights from `seed` without touching the global RNG."""
    cfg = LlamaConfig(
        vocab_size=96,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=tied,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(cfg).eval()


def tiny_runner(model: LlamaForCausalLM) -> CausalLMRunner:
    """A CausalLMRunner with a KV pool of 1,000 tokens of `model`."""
    per_token = kv_bytes_per_token(model.config, 4)
    return CausalLMRunner(model, KVCachePool(1000 * per_token, per_token, model.config))
