"""CUDA graphs for the torch runner: decode and verify passes of one session replayed, not launched.

A small model on a large GPU spends a decode step launching kernels and running host code, not computing:
vLLM and gpt-fast capture the step once as a CUDA graph and replay it. A graph fixes the addresses and
shapes of everything it touches, so here:

* each session lives in a **slot**: a transformers StaticCache of `max_tokens` positions allocated once, whose
  layers' lengths are views of one device tensor (a rollback is one `fill_`, the positions past it are
  overwritten by later passes and masked until then);
* a pass of n new rows (a decode step n = 1, a verify pass n = k + 1) in a slot replays the graph captured for
  (slot, n) the first time the slot saw n rows: the ids and positions are copied into the graph's static input
  buffers, the logits read from its static output;
* a pass the graphs do not cover (a prefill longer than `max_rows`) runs eagerly on the same static cache.

Slots are reused after their session is dropped, graphs and all, so captures happen once per (slot, n). A
capture that fails (an operation the graph cannot hold) leaves that (slot, n) eager for good, logged once:
the guard that keeps a model whose forward syncs with the host correct, only slower.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers import StaticCache
from transformers.cache_utils import StaticLayer

from specdec.errors import ResourceExhausted, UnsupportedCacheError

log = logging.getLogger("specdec.engine")

GRAPH_WARMUP_PASSES = 2  # eager passes on a side stream before a capture (cuBLAS/allocator workspaces)


class Graph(Protocol):
    """What a slot needs from a captured graph: capture `fn` once, then replay it."""

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor: ...

    def replay(self) -> None: ...


class CudaGraph:
    """A torch.cuda.CUDAGraph captured on a side stream after warm-up passes, sharing one memory pool."""

    def __init__(self, pool: Any, before_each: Callable[[], None]) -> None:
        self._graph = torch.cuda.CUDAGraph()
        self._pool = pool
        self._before_each = before_each  # restores the cache length a warm-up pass advanced

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(GRAPH_WARMUP_PASSES):
                self._before_each()
                fn()
        torch.cuda.current_stream().wait_stream(side)
        self._before_each()
        with torch.cuda.graph(self._graph, pool=self._pool):
            out = fn()
        return out

    def replay(self) -> None:
        self._graph.replay()


class EagerGraph:
    """The CPU stand-in of a graph: `replay` runs the captured function again on the same static buffers.

    It is what a CUDA graph replays, so it tests the static-buffer discipline (inputs copied in before each
    replay, outputs read from the buffer the capture returned) where no GPU is at hand."""

    def __init__(self, pool: Any, before_each: Callable[[], None]) -> None:
        self._fn: Callable[[], torch.Tensor] | None = None
        self._out: torch.Tensor | None = None

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        self._fn = fn
        self._out = fn()  # a capture runs nothing on a GPU: the first replay computes; here it is harmless
        return self._out

    def replay(self) -> None:
        assert self._fn is not None and self._out is not None, "replay before capture"
        self._out.copy_(self._fn())


@dataclass
class _Captured:
    """One (slot, n rows) graph: its static inputs and the logits tensor it writes."""

    ids: torch.Tensor  # [1, n] long
    positions: torch.Tensor  # [1, n] long
    logits: torch.Tensor | None
    graph: Graph | None  # None: the capture failed; this shape runs eagerly


class GraphSlot:
    """One session's static KV cache and the graphs captured over it (see the module docstring)."""

    def __init__(self, owner: GraphCacheOps) -> None:
        self.owner = owner
        self.cache = StaticCache(config=owner.model.config, max_cache_len=owner.max_tokens)
        self.layers = _full_attention_layers(self.cache)
        self.lengths = torch.zeros(len(self.layers), dtype=torch.long, device=owner.device)
        for i, layer in enumerate(self.layers):
            layer.cumulative_length = self.lengths[i]  # one fill_ rolls back every layer
        self._graphs: dict[int, _Captured] = {}

    def set_length(self, n: int) -> None:
        self.lengths.fill_(n)

    def forward(self, new_ids: Sequence[int], past: int, keep: int) -> torch.Tensor:
        """Logits [keep, V] (float32, CPU) of the last `keep` of `new_ids` appended at position `past`."""
        rows = len(new_ids)
        if past + rows > self.owner.max_tokens:
            raise ResourceExhausted(
                f"a session holds at most {self.owner.max_tokens} positions with CUDA graphs "
                f"(SPECDEC_CUDA_GRAPH_TOKENS); {past + rows} asked"
            )
        self.set_length(past)
        if rows > self.owner.max_rows:
            return self._eager(new_ids, past)[-keep:].float().cpu()
        captured = self._graphs.get(rows) or self._capture(rows, past)
        captured.ids.copy_(torch.tensor([list(new_ids)], dtype=torch.long), non_blocking=True)
        captured.positions.copy_(torch.arange(past, past + rows).unsqueeze(0), non_blocking=True)
        if captured.graph is None:
            return self._run(captured)[-keep:].float().cpu()
        captured.graph.replay()
        assert captured.logits is not None
        return captured.logits[-keep:].float().cpu()

    def _capture(self, rows: int, past: int) -> _Captured:
        device = self.owner.device
        captured = _Captured(
            torch.zeros(1, rows, dtype=torch.long, device=device),
            torch.zeros(1, rows, dtype=torch.long, device=device),
            None,
            None,
        )
        graph = self.owner.graph_factory(self.owner.graph_pool, lambda: self.set_length(past))
        try:
            captured.logits = graph.capture(lambda: self._run(captured))
            captured.graph = graph
        except RuntimeError as error:  # what the graph cannot hold (a host sync, a CPU op) stays eager
            log.warning("CUDA graph capture of %d rows failed, running them eagerly: %s", rows, error)
        self.set_length(past)  # whatever the capture ran (warm-up, the CPU stand-in) is written over
        self._graphs[rows] = captured
        self.owner.captures += 1
        return captured

    def _run(self, captured: _Captured) -> torch.Tensor:
        return self._forward(captured.ids, captured.positions)

    def _eager(self, new_ids: Sequence[int], past: int) -> torch.Tensor:
        device = self.owner.device
        ids = torch.tensor([list(new_ids)], dtype=torch.long, device=device)
        return self._forward(ids, torch.arange(past, past + len(new_ids), device=device).unsqueeze(0))

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The model over `ids` [1, n] at `positions` [1, n], writing into this slot's cache: logits [n, V]."""
        out = self.owner.model(
            input_ids=ids, position_ids=positions, use_cache=True, **{self.owner.cache_arg: self.cache}
        )
        return out.logits[0]


def _full_attention_layers(cache: StaticCache) -> list[StaticLayer]:
    """The cache's layers, all plain full attention (a sliding window's ring buffer or a linear-attention state
    cannot roll back by moving a length)."""
    layers = list(cache.layers)
    odd = sorted({type(layer).__name__ for layer in layers if type(layer) is not StaticLayer})
    if odd:
        raise UnsupportedCacheError(f"CUDA graphs need full-attention layers only; this model has {odd}")
    return [layer for layer in layers if isinstance(layer, StaticLayer)]


class GraphCacheOps:
    """Cache handles that are graph slots (the pool's CacheOps): at most `slots` sessions held at once.

    Args:
        model: the torch runner's model (on the GPU for CudaGraph).
        cache_arg: the name of the model's cache argument (specdec.models.compat.cache_argument).
        slots: sessions held at once, each with `max_tokens` positions of KV allocated when first used.
        max_tokens: positions one session may hold (prompt and generated tokens).
        max_rows: the most new rows a pass may have to replay a graph (k + 1 for verify passes); longer
            passes (prefills) run eagerly.
        graph_factory: CudaGraph on a GPU; EagerGraph where there is none (tests).
    """

    def __init__(
        self,
        model: Any,
        cache_arg: str,
        slots: int,
        max_tokens: int,
        max_rows: int,
        graph_factory: Callable[[Any, Callable[[], None]], Graph] = CudaGraph,
    ) -> None:
        self.model = model
        self.cache_arg = cache_arg
        self.capacity = slots
        self.max_tokens = max_tokens
        self.max_rows = max_rows
        self.device = next(model.parameters()).device
        self.graph_factory = graph_factory
        self.graph_pool = torch.cuda.graph_pool_handle() if graph_factory is CudaGraph else None
        self.captures = 0
        self._slots: list[GraphSlot] = []
        self._free: list[GraphSlot] = []

    def new(self) -> GraphSlot:
        if self._free:
            slot = self._free.pop()
        elif len(self._slots) < self.capacity:
            slot = GraphSlot(self)
            self._slots.append(slot)
        else:
            raise ResourceExhausted(f"all {self.capacity} CUDA graph slots hold sessions (SPECDEC_CUDA_GRAPH_SLOTS)")
        slot.set_length(0)
        return slot

    def truncate(self, cache: GraphSlot, n: int) -> None:
        cache.set_length(n)

    def copy_prefix(self, cache: GraphSlot, donor: GraphSlot, n: int) -> None:
        """Fill the fresh slot `cache` with `donor`'s first n positions (the donor's layers hold KV: it ran)."""
        for mine, theirs in zip(cache.layers, donor.layers, strict=True):
            keys, values = theirs.keys, theirs.values
            if keys is None or values is None:  # the donor never ran this layer: nothing to share
                continue
            if not mine.is_initialized:  # allocates the slot's KV like the donor's (keeps the length view)
                mine.lazy_initialization(keys[..., :1, :], values[..., :1, :])
            assert mine.keys is not None and mine.values is not None
            mine.keys[..., :n, :].copy_(keys[..., :n, :])
            mine.values[..., :n, :].copy_(values[..., :n, :])
        cache.set_length(n)

    def drop(self, cache: GraphSlot) -> None:
        """The slot (its KV memory and its graphs) waits for the next session."""
        self._free.append(cache)
