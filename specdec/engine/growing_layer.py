"""A session's full-attention KV cache layer that grows in place and truncates by moving its length.

transformers' DynamicLayer appends by `torch.cat`, a copy of the layer's whole cache at every step (at 8,000
tokens that is most of a decode step's memory traffic); a GrowingLayer writes new positions into spare
capacity, and a truncate (a rollback of rejected draft tokens) touches no tensor. Used by
specdec.engine.kvcache's SessionKV, whose caches are built by `new_session_cache`.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

KV_MIN_SPARE = 256  # positions a GrowingLayer allocates beyond what it holds, at least ...
KV_SPARE_SHARE = 0.25  # ... or this share of what it holds, whichever is more (amortised O(1) appends)


class _LengthView:
    """A GrowingLayer's `keys` or `values`: the view of its buffer up to its length, remade when read after
    a truncate moved the length (a rollback touches no tensor)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = f"_{name}_view"

    def __get__(self, layer: Any, owner: type | None = None) -> Any:
        if layer is None:
            return self
        if layer._stale:
            layer._refresh()
        return getattr(layer, self.slot)

    def __set__(self, layer: Any, value: torch.Tensor | None) -> None:
        setattr(layer, self.slot, value)


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer whose keys/values are views of buffers with spare capacity.

    `update` writes the new positions in place and returns `[..., :length, :]` views: no copy of the
    cached positions per step (DynamicLayer's `torch.cat`), one reallocation every KV_SPARE_SHARE of
    growth. `truncate(n)` moves the length; the positions past it are overwritten by later updates.
    Views handed out earlier see such later writes: callers use them within one forward, as
    attention does. Memory: up to KV_SPARE_SHARE (or KV_MIN_SPARE positions) more than held.
    """

    _stale = False  # truncate moved the length: the views are made when next read (_LengthView)
    keys = _LengthView()
    values = _LengthView()

    def _refresh(self) -> None:
        self._stale = False
        self._keys_view = self._keys.narrow(-2, 0, self.length)
        self._values_view = self._values.narrow(-2, 0, self.length)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self._keys = key_states.new_empty(*key_states.shape[:-2], 0, key_states.shape[-1])
        self._values = value_states.new_empty(*value_states.shape[:-2], 0, value_states.shape[-1])
        self.length = 0
        self.keys, self.values = self._keys, self._values
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """key_states/value_states: [batch, kv_heads, new, head_dim]. Returns the layer's [.., length, ..] views."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self._keys.shape[-2]:
            self._grow(end)
        self._keys[..., start:end, :] = key_states
        self._values[..., start:end, :] = value_states
        self.length = end
        self._stale = False
        self.keys, self.values = self._keys[..., :end, :], self._values[..., :end, :]
        return self._keys_view, self._values_view

    def _grow(self, need: int) -> None:
        capacity = need + max(KV_MIN_SPARE, int(need * KV_SPARE_SHARE))
        for name in ("_keys", "_values"):
            old = getattr(self, name)
            new = old.new_empty(*old.shape[:-2], capacity, old.shape[-1])
            new[..., : self.length, :] = old[..., : self.length, :]
            setattr(self, name, new)

    def truncate(self, n: int) -> None:
        """Keep the first n positions (the views follow when next read: a rollback between two rounds touches
        no tensor, ≈ 150 µs less per rejected draft at 30 layers, cold after a forward)."""
        if self.is_initialized and n < self.length:
            self.length = n
            self._stale = True

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        """transformers' crop (a negative count of positions to drop) as a truncate."""
        if tokens_to_remove < 0:
            self.truncate(max(0, self.get_seq_length() + tokens_to_remove))
        elif tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of positions to remove")

    def reset(self) -> None:
        self.length = 0
        self._stale = False
        self.keys = self.values = None
        self.is_initialized = False


def new_session_cache(model_config: Any = None) -> DynamicCache:
    """A DynamicCache whose full-attention layers are GrowingLayers (other layer kinds stay what the config
    makes them: SessionKV.truncate refuses those)."""
    cache = DynamicCache(config=model_config) if model_config is not None else DynamicCache()
    if cache.layer_class_to_replicate is DynamicLayer:
        cache.layer_class_to_replicate = GrowingLayer
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
