"""Plain dataclasses the engines take and return (servicers convert proto <-> these)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from specdec.core.accept import AcceptResult
from specdec.core.prefix_hash import PrefixHashes
from specdec.core.sampling import SamplingConfig


@dataclass
class SparseDist:
    """q' at one draft position: the support the draft sampled from and its probabilities."""

    token_ids: list[int]
    probs: list[float]


@dataclass
class HiddenRows:
    """The target's final (normed) hidden states of consecutive positions (feature drafts' input)."""

    first_position: int
    rows: Any  # torch.Tensor [n, H]


@dataclass
class ComputeStatsData:
    cached_tokens: int = 0
    computed_tokens: int = 0
    rolled_back: int = 0
    forward_ms: float = 0.0
    queue_ms: float = 0.0
    batch_size: int = 1  # sessions scored in the same forward pass
    batch_tokens: int = 0  # tokens that pass computed over all its sessions (0 = not known)

    def add(self, other: ComputeStatsData) -> None:
        """Accumulate another call's stats into this one."""
        self.computed_tokens += other.computed_tokens
        self.rolled_back += other.rolled_back
        self.forward_ms += other.forward_ms
        self.cached_tokens = max(self.cached_tokens, other.cached_tokens)

    def follow(self, earlier: ComputeStatsData) -> ComputeStatsData:
        """This pass's stats after `earlier` passes of the same call (chunked prefill): their work added,
        what was cached before them kept. Returns self."""
        self.add(earlier)
        self.cached_tokens = earlier.cached_tokens
        return self


def prefilled_after(earlier: ComputeStatsData | None, fwd: Any) -> ComputeStatsData:
    """A call's chunked-prefill stats: the passes before (`earlier`, None: none) and one more, `fwd` (a runner
    ForwardResult)."""
    done = ComputeStatsData(fwd.cached_tokens, fwd.computed_tokens, fwd.rolled_back, fwd.forward_ms)
    return done if earlier is None else done.follow(earlier)


@dataclass
class ProposeInput:
    session_id: str
    context_ids: list[int]
    k: int
    sampling: SamplingConfig
    draft_kind: str = ""  # "" = the service's configured kind
    ngram_min_n: int | None = None
    ngram_max_n: int | None = None
    position_base: int = 0
    target_hidden: HiddenRows | None = None  # feature drafts: the target's new hidden states
    checked_ids: int = 0  # leading context ids already checked against the vocabulary (ContextStore)
    prefix_hashes: PrefixHashes | None = None  # covering context_ids (ContextStore): no whole-context compares
    prefilled: ComputeStatsData | None = None  # chunks already run for this call (ModelDraft.prefill_chunk)


@dataclass
class ProposeOutput:
    draft_ids: list[int]
    draft_probs: list[SparseDist]  # empty = point mass (greedy or n-gram)
    draft_kind: str
    stats: ComputeStatsData = field(default_factory=ComputeStatsData)
    target_hidden_from: int = -1  # feature drafts: first position whose hidden state it needs next


@dataclass
class VerifyInput:
    session_id: str
    context_ids: list[int]
    draft_ids: list[int]
    sampling: SamplingConfig
    draft_probs: list[SparseDist] = field(default_factory=list)
    logprobs: int = -1  # -1 none; 0 chosen token only; n top-n alternatives
    position_base: int = 0
    hidden_from: int = -1  # >= 0: return hidden states from this position (feature drafts)
    checked_ids: int = 0  # leading context ids already checked against the vocabulary (ContextStore)
    prefix_hashes: PrefixHashes | None = None  # covering context_ids + draft_ids (ContextStore)
    prefilled: ComputeStatsData | None = None  # chunks already run for this call (TargetEngine.prefill_chunk)
    verdict_only: bool = False  # the accept rule's reads only (VerifyRequest.verdict_only; accept(all_rows=))
    _ids: JoinedIds | None = field(default=None, repr=False, compare=False)

    @property
    def ids(self) -> JoinedIds:
        """context_ids + draft_ids, never copied (sizing, chunking and the pass each read it)."""
        if self._ids is None:
            self._ids = JoinedIds(self.context_ids, self.draft_ids)
        return self._ids


class JoinedIds(Sequence[int]):
    """`head + tail` as a read-only sequence that does not copy `head`: a whole context is ≈ 30 µs to copy at
    5,000 tokens right after a forward (each int object touched cache-cold), once per Verify. Slices are
    lists; both parts must stay unchanged while it is in use."""

    __slots__ = ("head", "tail")

    def __init__(self, head: list[int], tail: list[int]) -> None:
        self.head, self.tail = head, tail

    def __len__(self) -> int:
        return len(self.head) + len(self.tail)

    def __getitem__(self, index: Any) -> Any:
        split = len(self.head)
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return list(self)[index]
            return self.head[start : min(stop, split)] + self.tail[max(start - split, 0) : max(stop - split, 0)]
        position = index + len(self) if index < 0 else index
        if not 0 <= position < len(self):
            raise IndexError("JoinedIds index out of range")
        return self.head[position] if position < split else self.tail[position - split]

    def __iter__(self) -> Iterator[int]:
        return itertools.chain(self.head, self.tail)


@dataclass
class TokenLogprobData:
    token_id: int
    logprob: float
    top_token_ids: list[int] = field(default_factory=list)
    top_logprobs: list[float] = field(default_factory=list)


@dataclass
class VerifyOutput:
    result: AcceptResult
    logprobs: list[TokenLogprobData]
    stats: ComputeStatsData
    hidden: HiddenRows | None = None
