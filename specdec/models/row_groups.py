"""Which rows of the forward in progress are returned rows and which are prefill, per session.

A row-invariant runner (specdec/engine/runner.py, row_invariant=True) packs each session's new tokens
into one sequence; the last `keep` rows of each session are the ones whose logits it returns (the
last context token and the draft tokens of a verify pass, or the one row of a decode step). Those
must be computed bitwise as a 1-row decode step computes them, whatever else shares the pass.
Layers whose fast kernel is not row-invariant for wide calls (the int4 linears' bfloat16 GEMM for
prefill, specdec/models/int4.py) read the split here: returned rows on the row-invariant kernel,
each session's prefill rows on their own (the same call a k = 0 prefill of that session makes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass(frozen=True)
class RowGroups:
    """Packed rows of one forward: session i's rows are [starts[i], ends[i]), the last keeps[i] of them returned."""

    starts: tuple[int, ...]
    ends: tuple[int, ...]
    keeps: tuple[int, ...]

    # Computed once per pass (every linear layer of the forward asks): cached on the instance.

    @cached_property
    def total(self) -> int:
        """Rows in the pass."""
        return self.ends[-1] if self.ends else 0

    @cached_property
    def every_row_returned(self) -> bool:
        """Whether every row of the pass is a returned row (a decode step, a verify on a warm cache)."""
        return all(end - start == keep for start, end, keep in zip(self.starts, self.ends, self.keeps))

    @cached_property
    def returned(self) -> torch.Tensor:
        """Indices [R] of the returned rows, in packed order."""
        return torch.cat([torch.arange(end - keep, end) for end, keep in zip(self.ends, self.keeps)])

    @cached_property
    def prefill_spans(self) -> list[tuple[int, int]]:
        """Each session's prefill rows [start, end - keep), where it has any."""
        return [(s, e - k) for s, e, k in zip(self.starts, self.ends, self.keeps) if e - k > s]


_CURRENT: ContextVar[RowGroups | None] = ContextVar("specdec_row_groups", default=None)


@contextlib.contextmanager
def row_groups(groups: RowGroups) -> Iterator[None]:
    """Mark the forward run inside the block with `groups`."""
    token = _CURRENT.set(groups)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current_row_groups() -> RowGroups | None:
    """The split of the forward in progress (None outside a row-invariant runner's pass)."""
    return _CURRENT.get()
