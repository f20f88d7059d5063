"""What differs between transformers releases, decided once per model."""

from __future__ import annotations

import functools
import inspect
from typing import Any

from transformers.modeling_outputs import CausalLMOutputWithPast

#: The name of the KV-cache field of transformers' model outputs: `cache` (>= 5.2x), else `past_key_values`.
OUTPUT_CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def cache_argument(model: Any) -> str:
    """The name under which `model.forward` takes its KV cache: `cache` (transformers >= 5.2x) or
    `past_key_values` (earlier releases). Custom forwards (specdec's trained drafts) declare only the
    new name, so passing the old one would reach no cache at all. Decided once per forward function
    (the trained drafts ask on every step; inspecting the signature costs ~30 µs)."""
    forward = model.forward
    return _cache_argument_of(getattr(forward, "__func__", forward))


@functools.cache
def _cache_argument_of(forward: Any) -> str:
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def returned_cache(output: Any) -> Any:
    """The KV cache a transformers model output carries, under either release's field name."""
    return getattr(output, OUTPUT_CACHE_FIELD)


def causal_lm_output(logits: Any, cache: Any) -> CausalLMOutputWithPast:
    """A CausalLMOutputWithPast of `logits` and `cache`, with the cache under this release's field name."""
    return CausalLMOutputWithPast(logits=logits, **{OUTPUT_CACHE_FIELD: cache})
