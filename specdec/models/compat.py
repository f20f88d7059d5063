"""What differs between transformers releases, decided once per model."""

from __future__ import annotations

import inspect
from typing import Any


def cache_argument(model: Any) -> str:
    """The name under which `model.forward` takes its KV cache: `cache` (transformers >= 5.2x) or
    `past_key_values` (earlier releases). Custom forwards (specdec's trained drafts) declare only the
    new name, so passing the old one would reach no cache at all."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
