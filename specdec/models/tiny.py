"""Tiny random causal LMs for tests and demos, sharing a real tokenizer's id space.

``build_tiny_causal_lm`` makes a small fp32 Llama or Qwen2 whose vocabulary is the
given tokenizer's (49152 ids for the SmolLM2 tokenizer); ``perturbed_copy`` makes a
draft that mostly but not always agrees with it; ``save_tiny_pair`` writes both as
local model directories that the services load by local-dir spec. All randomness
comes from seeded ``torch.Generator`` objects -- no global seeds are touched.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ARCH_LLAMA = "llama"
ARCH_QWEN2 = "qwen2"
SUPPORTED_ARCHS = (ARCH_LLAMA, ARCH_QWEN2)
DEFAULT_HIDDEN = 64
DEFAULT_LAYERS = 2
DEFAULT_HEADS = 4
DEFAULT_KV_HEADS = 2
DEFAULT_SEED = 0
DEFAULT_INIT_RANGE = 0.5
DEFAULT_NOISE = 0.005  # ~70% greedy agreement with DEFAULT_INIT_RANGE on the SmolLM2 vocabulary
MLP_EXPANSION = 2
MAX_POSITIONS = 2048
NORM_WEIGHT_VALUE = 1.0
TARGET_SUBDIR = "target"
DRAFT_SUBDIR = "draft"
_NORM_MARKER = "norm"


@dataclass(frozen=True)
class TinyPair:
    """Paths of a saved tiny target/draft pair (load them with ``local:<path>``)."""

    target_dir: Path
    draft_dir: Path


def _as_tokenizer(tokenizer_dir_or_tokenizer: Any) -> Any:
    """Return a tokenizer object, loading it from a directory path when given one."""
    if isinstance(tokenizer_dir_or_tokenizer, (str, Path)):
        from transformers import AutoTokenizer  # noqa: PLC0415

        return AutoTokenizer.from_pretrained(str(tokenizer_dir_or_tokenizer), local_files_only=True)
    return tokenizer_dir_or_tokenizer


def _tiny_config(
    arch: str, tokenizer: Any, hidden: int, layers: int, heads: int, kv_heads: int, eos_token_id: int | None
) -> Any:
    """Build a Llama/Qwen2 config sized by the arguments, with the tokenizer's vocabulary."""
    from transformers import LlamaConfig, Qwen2Config  # noqa: PLC0415

    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"arch must be one of {SUPPORTED_ARCHS}, got {arch!r}")
    eos = eos_token_id if eos_token_id is not None else tokenizer.eos_token_id
    common = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden,
        "intermediate_size": hidden * MLP_EXPANSION,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": MAX_POSITIONS,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": eos,
        "pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos,
        "tie_word_embeddings": False,
    }
    if arch == ARCH_QWEN2:
        return Qwen2Config(use_sliding_window=False, **common)
    return LlamaConfig(**common)


def _fill_parameters(model: torch.nn.Module, generator: torch.Generator, init_range: float) -> None:
    """Overwrite every parameter from ``generator``: norms = 1, the rest ~ N(0, init_range^2)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            parts = name.split(".")
            if len(parts) > 1 and _NORM_MARKER in parts[-2]:
                param.fill_(NORM_WEIGHT_VALUE)
                continue
            values = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            param.copy_(values * init_range)


def build_tiny_causal_lm(
    tokenizer_dir_or_tokenizer: Any,
    *,
    arch: str = ARCH_LLAMA,
    hidden: int = DEFAULT_HIDDEN,
    layers: int = DEFAULT_LAYERS,
    heads: int = DEFAULT_HEADS,
    kv_heads: int = DEFAULT_KV_HEADS,
    seed: int = DEFAULT_SEED,
    init_range: float = DEFAULT_INIT_RANGE,
    eos_token_id: int | None = None,
) -> Any:
    """Return a random-initialised fp32 causal LM (eval mode, CPU) with the tokenizer's vocabulary.

    Args:
        tokenizer_dir_or_tokenizer: a tokenizer object or a directory with tokenizer files.
        arch: ``llama`` or ``qwen2`` (qwen2 adds q/k/v biases).
        hidden, layers, heads, kv_heads: model size.
        seed: seeds a private ``torch.Generator``; equal seeds give equal weights.
        init_range: standard deviation of the weights (large values give peaked distributions).
        eos_token_id: EOS id for the config; None uses the tokenizer's.
    """
    from transformers import AutoModelForCausalLM, GenerationConfig  # noqa: PLC0415

    tokenizer = _as_tokenizer(tokenizer_dir_or_tokenizer)
    config = _tiny_config(arch, tokenizer, hidden, layers, heads, kv_heads, eos_token_id)
    with torch.random.fork_rng(devices=[]):  # default init draws from the global RNG; keep it untouched
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _fill_parameters(model, torch.Generator().manual_seed(seed), init_range)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    return model.eval()


def perturbed_copy(model: Any, noise: float = DEFAULT_NOISE, seed: int = DEFAULT_SEED) -> Any:
    """Return a deep copy of ``model`` with N(0, noise^2) added to every parameter.

    ``noise`` is absolute (compare with the ``init_range`` the model was built with), so
    the copy agrees with the original on most but not all greedy tokens.
    """
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in draft.named_parameters():
            delta = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            param.add_(delta.to(param.dtype) * noise)
    return draft.eval()


def save_tiny_pair(
    directory: str | Path,
    tokenizer_dir_or_tokenizer: Any,
    *,
    noise: float = DEFAULT_NOISE,
    seed: int = DEFAULT_SEED,
    **build_kwargs: Any,
) -> TinyPair:
    """Build a tiny target and a perturbed draft and save both, with tokenizer files.

    Writes ``<directory>/target`` and ``<directory>/draft`` (each loadable as
    ``local:<dir>``). ``build_kwargs`` go to :func:`build_tiny_causal_lm`; the draft
    noise uses ``seed + 1`` so it differs from the target's init stream.
    """
    tokenizer = _as_tokenizer(tokenizer_dir_or_tokenizer)
    target = build_tiny_causal_lm(tokenizer, seed=seed, **build_kwargs)
    draft = perturbed_copy(target, noise=noise, seed=seed + 1)
    root = Path(directory)
    pair = TinyPair(target_dir=root / TARGET_SUBDIR, draft_dir=root / DRAFT_SUBDIR)
    for model, out in ((target, pair.target_dir), (draft, pair.draft_dir)):
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))
    return pair
