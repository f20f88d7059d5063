"""Run a causal LM over a session's tokens, reusing and rolling back its KV cache."""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from specdec.engine.kvcache import KVCachePool, common_prefix_len

MS_PER_S = 1000.0


@dataclass
class ForwardResult:
    """Logits for the requested positions and what it cost.

    logits: [n, V] float32; row j predicts the token after position `first + j`.
    """

    logits: torch.Tensor
    cached_tokens: int
    computed_tokens: int
    rolled_back: int
    forward_ms: float


class CausalLMRunner:
    """Computes logits for a session's token sequence with its KV cache.

    Args:
        model: a transformers causal LM in eval mode.
        pool: the per-session KV caches of this service.
    """

    def __init__(self, model: Any, pool: KVCachePool) -> None:
        self.model = model
        self.pool = pool
        self.device = next(model.parameters()).device
        # transformers >= 5.2x names the argument `cache`; earlier releases `past_key_values`.
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    @torch.inference_mode()
    def extend(self, session_id: str, ids: Sequence[int], first: int) -> ForwardResult:
        """Make the session's cache cover `ids`; return logits of positions first..len(ids)-1.

        The longest common prefix with the cached tokens is reused, but never past
        `first` (its logits must be computed); the rest is truncated (rollback).
        On any error the session's cache is dropped, so it can never be left half-updated.
        """
        if not 0 <= first < len(ids):
            raise ValueError(f"first={first} outside the {len(ids)} tokens")
        kv = self.pool.acquire(session_id, len(ids))
        reuse = min(common_prefix_len(kv.tokens, ids), first)
        try:
            rolled_back = kv.truncate(reuse)
            new_ids = list(ids[reuse:])
            start = time.perf_counter()
            logits = self._forward(kv.cache, new_ids, reuse, len(ids) - first)
            elapsed = (time.perf_counter() - start) * MS_PER_S
        except BaseException:
            self.pool.release(session_id)
            raise
        kv.tokens = list(ids)
        self._count(reuse, len(new_ids), rolled_back)
        return ForwardResult(logits, reuse, len(new_ids), rolled_back, elapsed)

    def _forward(self, cache: Any, new_ids: list[int], past: int, keep: int) -> torch.Tensor:
        input_ids = torch.tensor([new_ids], dtype=torch.long, device=self.device)  # [1, t]
        positions = torch.arange(past, past + len(new_ids), device=self.device).unsqueeze(0)  # [1, t]
        out = self.model(input_ids=input_ids, position_ids=positions, use_cache=True, logits_to_keep=keep,
                         **{self._cache_arg: cache})
        return out.logits[0, -keep:].float().cpu()  # [keep, V]

    def _count(self, reused: int, computed: int, rolled_back: int) -> None:
        c = self.pool.counters
        c.hits += reused > 0
        c.misses += reused == 0
        c.rollbacks += rolled_back > 0
        c.rolled_back_tokens += rolled_back
        c.reused_tokens += reused
        c.computed_tokens += computed
