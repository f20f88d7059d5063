"""Model-free prompt-lookup proposer (cf. vLLM ``ngram`` proposer, HF ``prompt_lookup_num_tokens``).

It plays the **draft** role without a model: it proposes the tokens that followed the most
recent earlier occurrence of the context's suffix. Its proposals are deterministic, so the
accept rule treats them as a point-mass draft distribution q (``draft_probs=None``);
the **target** distribution p is preserved exactly as with a model draft.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

DEFAULT_MIN_N = 1
DEFAULT_MAX_N = 4


def _most_recent_match(context: np.ndarray, n: int) -> int | None:  # context: [L] int64
    """Start of the most recent earlier occurrence of the last n tokens, or None."""
    length = context.shape[0]
    if n >= length:
        return None
    suffix = context[length - n:]
    # windows start at 0 .. length-n-1: every earlier occurrence, never the suffix itself
    windows = sliding_window_view(context[: length - 1], n)  # [length-n, n]
    hits = np.flatnonzero((windows == suffix).all(axis=1))
    return int(hits[-1]) if hits.size else None


def propose_ngram(
    context_ids: Sequence[int],
    k: int,
    min_n: int = DEFAULT_MIN_N,
    max_n: int = DEFAULT_MAX_N,
) -> list[int]:
    """Propose up to k draft tokens by prompt lookup.

    For n from max_n down to min_n, find the most recent earlier occurrence of the last n
    tokens (the suffix itself excluded) and return up to k tokens that followed it (fewer
    when the continuation runs into the end of the context). Longer n-grams win over
    shorter ones. Returns [] when nothing matches or k == 0. O(len * n) per n.
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if not 1 <= min_n <= max_n:
        raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
    context = np.asarray(context_ids, dtype=np.int64).reshape(-1)
    if k == 0:
        return []
    for n in range(max_n, min_n - 1, -1):
        start = _most_recent_match(context, n)
        if start is not None:
            follow = start + n
            return context[follow: follow + k].tolist()
    return []
