"""v(n): the time of one forward over n new tokens after a warm KV cache, n = 1..n_max.

The measurement behind the bench's bound (specdec bench) and the prepared GPU script
(scripts/verify_cost.py). Depends on torch and transformers only, so it runs on a machine
without the rest of the stack.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

MS_PER_S = 1000.0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_verify_costs(
    model: Any, threads: int | None, n_max: int, context_tokens: int, reps: int, vocab: int
) -> dict[str, Any]:
    """Median ms of a forward over n new tokens on a warm cache of context_tokens, n = 1..n_max.

    The cache is cropped back to context_tokens after each forward (what a rejected draft costs),
    so every measurement sees the same cache length; passes over n interleave within each repeat
    so that drift affects all n alike; the first repeat warms up and is dropped. On a GPU the
    device is synchronised around each forward. `threads` sets torch's CPU threads (None: leave).
    """
    from transformers import DynamicCache

    from specdec.models.compat import cache_argument

    if threads:
        torch.set_num_threads(threads)
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(0)
    high = min(vocab, 32000)
    context = torch.randint(100, high, (1, context_tokens), generator=gen).to(device)
    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # transformers releases before the config argument
        cache = DynamicCache()
    samples: dict[int, list[float]] = {n: [] for n in range(1, n_max + 1)}
    cache_kw = {cache_argument(model): cache}
    with torch.inference_mode():
        model(input_ids=context, use_cache=True, **cache_kw)
        for rep in range(reps + 1):
            for n in range(1, n_max + 1):
                new = torch.randint(100, high, (1, n), generator=gen).to(device)
                pos = torch.arange(context_tokens, context_tokens + n, device=device).unsqueeze(0)
                _sync(device)
                start = time.perf_counter()
                model(input_ids=new, position_ids=pos, use_cache=True, **cache_kw)
                _sync(device)
                elapsed = (time.perf_counter() - start) * MS_PER_S
                cache.crop(-n)  # negative: drop the n new positions (every transformers release)
                if cache.get_seq_length() != context_tokens:
                    raise RuntimeError(
                        f"the cache holds {cache.get_seq_length()} positions after a rollback to {context_tokens}"
                    )
                if rep:
                    samples[n].append(elapsed)
    ms = {str(n): statistics.median(v) for n, v in samples.items()}
    one = ms["1"]
    kv_bytes = sum(t.numel() * t.element_size() for t in _cache_tensors(cache))
    return {
        "context_tokens": context_tokens,
        "reps": reps,
        "threads": threads,
        "ms": ms,
        "ratio": {n: v / one for n, v in ms.items()},
        "spread_ms": {str(n): [min(v), max(v)] for n, v in samples.items()},
        "kv_bytes_per_token_measured": kv_bytes / context_tokens,
    }


def _cache_tensors(cache: Any) -> list[torch.Tensor]:
    """The cache's key and value tensors (per-layer objects in transformers 5, lists before)."""
    if hasattr(cache, "layers"):
        return [t for layer in cache.layers for t in (layer.keys, layer.values) if t is not None]
    return [t for t in list(cache.key_cache) + list(cache.value_cache) if t is not None]
