"""Which models speculative decoding can serve: the KV cache must be truncatable exactly, so that
rejected draft tokens can be rolled back (:func:`check_cache_truncatable`). Works on a transformers
config object or a plain dict (config.json), nothing is loaded.
"""

from __future__ import annotations

from typing import Any

from specdec.models.spec import UnsupportedModelError

#: Architectures whose state is not a plain per-token KV cache (cannot be rolled back by truncation).
NON_TRUNCATABLE_MODEL_TYPES = frozenset(
    {
        "mamba",
        "mamba2",
        "falcon_mamba",
        "rwkv",
        "rwkv5",
        "rwkv6",
        "rwkv7",
        "recurrent_gemma",
        "jamba",
        "zamba",
        "zamba2",
        "bamba",
        "falcon_h1",
        "granitemoehybrid",
        "nemotron_h",
        "lfm2",
        "lfm2_moe",
        "qwen3_next",
        "minimax",
        "xlstm",
        "plamo2",
        "xlnet",
        "reformer",
        "mllama",
    }
)
_NON_TRUNCATABLE_ARCH_WORDS = ("mamba", "rwkv", "recurrent", "jamba", "hybrid", "xlstm")
FULL_ATTENTION_LAYER_TYPES = frozenset({"full_attention", "attention"})


def _cfg_get(config: Any, key: str, default: Any = None) -> Any:
    """Read a field from a transformers config object or a plain dict."""
    if isinstance(config, dict):
        return config.get(key, default)
    return getattr(config, key, default)


def _text_config(config: Any) -> Any:
    """Return the decoder text config of multimodal configs, else the config itself."""
    getter = getattr(config, "get_text_config", None)
    if callable(getter):
        try:
            return getter(decoder=True)
        except (TypeError, ValueError):
            return getter()
    return _cfg_get(config, "text_config") or config


def _layer_type_blocker(text: Any) -> str | None:
    """Return why per-layer attention types prevent exact truncation, or None."""
    layer_types = _cfg_get(text, "layer_types")
    if not layer_types:
        return None
    other = sorted({str(kind) for kind in layer_types} - FULL_ATTENTION_LAYER_TYPES)
    return f"it has {'/'.join(other)} layers (layer_types)" if other else None


def _sliding_window_blocker(text: Any) -> str | None:
    """Return why a sliding window (with no layer_types) prevents exact truncation, or None."""
    window = _cfg_get(text, "sliding_window")
    if not window or not _cfg_get(text, "use_sliding_window", True):
        return None
    max_positions = _cfg_get(text, "max_position_embeddings")
    if max_positions is not None and window >= max_positions:
        return None
    return f"it uses sliding-window attention (sliding_window={window})"


def _truncation_blocker(config: Any) -> str | None:
    """Return a reason the model's cache cannot be truncated exactly, or None if it can."""
    if _cfg_get(config, "is_encoder_decoder", False):
        return "it is an encoder-decoder model"
    text = _text_config(config)
    for model_type in {_cfg_get(config, "model_type"), _cfg_get(text, "model_type")}:
        if model_type in NON_TRUNCATABLE_MODEL_TYPES:
            return f"{model_type} is a hybrid, linear-attention or state-space architecture"
    for arch in _cfg_get(config, "architectures") or []:
        if any(word in arch.lower() for word in _NON_TRUNCATABLE_ARCH_WORDS):
            return f"{arch} is a hybrid, recurrent or state-space architecture"
    if _cfg_get(text, "attention_chunk_size"):
        return f"it uses chunked attention (attention_chunk_size={_cfg_get(text, 'attention_chunk_size')})"
    if _cfg_get(text, "layer_types"):
        return _layer_type_blocker(text)
    return _sliding_window_blocker(text)


def check_cache_truncatable(model_config: Any, model_name: str | None = None) -> None:
    """Refuse models whose KV cache cannot be truncated exactly to drop rejected draft tokens.

    Refused: sliding-window attention actually in use (``sliding_window`` set, smaller
    than ``max_position_embeddings`` and ``use_sliding_window`` not false, or
    ``layer_types`` with any non-full-attention layer such as sliding/linear/chunked),
    hybrid / linear-attention / state-space architectures (mamba, rwkv, recurrent_gemma,
    jamba, ...), and encoder-decoder models.

    Raises:
        UnsupportedModelError: naming the model and the reason.
    """
    reason = _truncation_blocker(model_config)
    if reason is None:
        return
    name = model_name or _cfg_get(model_config, "_name_or_path") or _cfg_get(model_config, "model_type")
    raise UnsupportedModelError(
        f"model {name} is not supported: {reason}; speculative decoding needs a KV cache "
        "that can be truncated exactly to roll back rejected draft tokens"
    )
