"""The one seam between the model services and an engine: the `Runner` protocol and what it takes and returns.

A runner computes logits for sessions' token sequences, each with a KV cache it reuses, rolls back and shares
(prefix sharing) through the token bookkeeping of specdec/engine/kvcache.py (`pool`). The engines above it
(target verify, model draft) and the services speak token ids and these dataclasses only; they never import
an engine's model classes. Implementations: the torch runner (specdec/engine/torch_runner.py, transformers
models on CPU or GPU) and the llama.cpp runner (specdec/engine/llamacpp_runner.py, GGUF files through
llama.cpp's kernels).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from specdec.core.prefix_hash import PrefixHashes
from specdec.engine.kvcache import CacheCounters, KVCachePool, SessionKV

ENGINES = ("torch", "llamacpp")


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
    batch_size: int = 1  # sessions in the same forward pass
    batch_tokens: int = 0  # tokens that pass computed over all its sessions
    hidden: Any = None  # [len(ids), H] the session's final hidden states (keep_hidden only)


@dataclass
class ExtendItem:
    """One session's part of a (batched) extend: cover `ids`, return logits from position `first` on."""

    session_id: str
    ids: Sequence[int]
    first: int
    hashes: PrefixHashes | None = None  # prefix hashes covering at least `ids`: no whole-context compare
    # keep the session's hidden rows (a runner with keep_hidden): a session keeps them from the first call
    # that asks on (a feature draft's generation); the others skip the copy (~0.1 ms a round on CPU)
    hidden: bool = True


@dataclass
class ExtendPlan:
    """One session's part of a pass: its cache, the prefix reused, what was rolled back, the tokens to compute."""

    item: ExtendItem
    kv: SessionKV
    reuse: int
    rolled_back: int
    new_ids: list[int]

    @property
    def keep(self) -> int:
        """How many logits rows this session needs (positions first..len(ids)-1)."""
        return len(self.item.ids) - self.item.first


def keeps_hidden(item: ExtendItem, kv: SessionKV) -> bool:
    """Whether a pass keeps the session's hidden rows: its call asks, or the session has been keeping them."""
    return item.hidden or kv.hidden is not None


def plan_extend(pool: KVCachePool, item: ExtendItem, keep_hidden: bool = False) -> ExtendPlan:
    """Acquire the session's cache (an empty one starts from another session's shared prefix,
    KVCachePool.share_prefix), keep the longest common prefix (never past `first`), roll back the rest.
    `keep_hidden`: the runner keeps hidden rows, so a session keeping them reuses only the prefix they cover."""
    ids, first = item.ids, item.first
    if not 0 <= first < len(ids):
        raise ValueError(f"first={first} outside the {len(ids)} tokens")
    kv = pool.acquire(item.session_id, len(ids))
    if not len(kv):  # a new (or evicted) session: start from another's prefix where one shares it
        pool.share_prefix(item.session_id, kv, ids, first, keep_hidden and item.hidden, item.hashes)
    reuse = min(kv.common_prefix(ids, item.hashes), first)
    if keep_hidden and keeps_hidden(item, kv):  # rows for the whole reused prefix, or recompute it
        reuse = min(reuse, 0 if kv.hidden is None else kv.hidden.shape[0])
    try:
        rolled_back = kv.truncate(reuse)
    except BaseException:
        pool.release(item.session_id)
        raise
    return ExtendPlan(item, kv, reuse, rolled_back, list(ids[reuse:]))


def count_extend(counters: CacheCounters, plan: ExtendPlan) -> None:
    """A session's pass in the pool's counters (hits, rollbacks, reused and computed tokens)."""
    counters.hits += plan.reuse > 0
    counters.misses += plan.reuse == 0
    counters.rollbacks += plan.rolled_back > 0
    counters.rolled_back_tokens += plan.rolled_back
    counters.reused_tokens += plan.reuse
    counters.computed_tokens += len(plan.new_ids)


class Runner(Protocol):
    """What the engines and services use of a model runner.

    engine: "torch" or "llamacpp" (Info metadata, metrics); engine_detail: what else Info metadata says of it.
    pool: the sessions' token bookkeeping (uncached, release, counters).
    vocab_width: rows of the output layer (the logits' width).
    keep_hidden: whether it can return each session's final hidden states (feature drafts).
    batching: whether `extend_batch` takes several sessions in one pass.
    device: where the logits are computed ("cpu", "cuda:0").
    """

    engine: str
    engine_detail: str
    pool: KVCachePool
    vocab_width: int
    keep_hidden: bool
    batching: bool
    device: Any

    def extend(
        self, session_id: str, ids: Sequence[int], first: int, hashes: PrefixHashes | None = None, hidden: bool = True
    ) -> ForwardResult:
        """Make the session's cache cover `ids`; return logits of positions first..len(ids)-1."""
        ...

    def extend_batch(self, items: Sequence[ExtendItem]) -> list[ForwardResult]:
        """`extend` for several distinct sessions in ONE forward pass (continuous batching)."""
        ...
