"""The torch runner's per-session cache handle: a transformers DynamicCache of GrowingLayers.

`TorchCacheOps` is what the shared token bookkeeping (specdec/engine/kvcache.py) calls to make, truncate,
copy and drop one session's cache; the llama.cpp runner has its own (specdec/engine/llamacpp_cache.py).
"""

from __future__ import annotations

from typing import Any

from transformers import DynamicCache
from transformers.cache_utils import CacheLayerMixin, DynamicLayer

from specdec.engine.growing_layer import GrowingLayer, new_session_cache
from specdec.errors import UnsupportedCacheError


class TorchCacheOps:
    """Cache handles for the torch runner: one DynamicCache per session, truncated and copied tensor-wise."""

    def __init__(self, model_config: Any = None) -> None:
        self._config = model_config

    capacity = 0  # no limit on the number of sessions (only the token budget)

    def new(self) -> DynamicCache:
        return new_session_cache(self._config)

    def truncate(self, cache: DynamicCache, n: int) -> None:
        """Keep the first n positions of every layer (only plain full-attention layers roll back exactly)."""
        for layer in cache.layers:
            if isinstance(layer, GrowingLayer):
                layer.truncate(n)
            elif type(layer) is DynamicLayer:
                if layer.is_initialized:
                    assert layer.keys is not None and layer.values is not None, "an initialized layer holds K/V"
                    layer.keys = layer.keys[..., :n, :]
                    layer.values = layer.values[..., :n, :]
            else:
                raise UnsupportedCacheError(f"cannot truncate cache layer {type(layer).__name__}")

    def copy_prefix(self, cache: DynamicCache, donor: DynamicCache, n: int) -> None:
        """Fill the empty `cache` with a copy of `donor`'s first n positions (its own storage)."""
        for index, layer in enumerate(donor.layers):
            if (
                not isinstance(layer, CacheLayerMixin)
                or layer.keys is None
                or layer.values is None
                or not getattr(layer, "is_initialized", True)
            ):
                raise UnsupportedCacheError(f"layer {index} of the donor holds nothing")
            cache.update(layer.keys[..., :n, :], layer.values[..., :n, :], index)

    def drop(self, cache: DynamicCache) -> None:
        """Nothing to free: the tensors go with the last reference."""
