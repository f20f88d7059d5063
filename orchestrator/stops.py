"""Stop strings for streamed text, with hold-back of possible partial matches.

Semantics (tested in tests/unit/test_stops.py):

* The *first* stop occurrence is the one that **completes earliest** in the text
  (smallest end index) — exactly what a token-by-token streamer sees first; among
  stops completing at the same index the longest (earliest start) wins. The result
  does not depend on how the text is chunked into deltas.
* Text before the stop is emitted; the stop string and everything after it are
  dropped. Text that might still be the beginning of a stop string is held back
  until it cannot be; ``flush()`` releases it when generation ends without a stop.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specdec.v1 import orchestrator_pb2 as pb

logger = logging.getLogger(__name__)

REPLACEMENT_CHAR = "\ufffd"
"""Decoders print an incomplete UTF-8 sequence as U+FFFD; such a char is not final yet."""


@dataclass(frozen=True)
class StopResult:
    """What :meth:`StopMatcher.push` lets through.

    Attributes:
        emit: text that can be streamed now.
        stopped: True once a stop string has completed (no more text will be emitted).
        matched: the stop string that completed, else None.
    """

    emit: str
    stopped: bool
    matched: str | None


class StopMatcher:
    """Detect stop strings across arbitrary text deltas.

    Args:
        stops: stop strings; duplicates are ignored, an empty list means pass-through.

    Raises:
        ValueError: if a stop string is empty.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        self._stops: tuple[str, ...] = tuple(dict.fromkeys(stops))
        self._held = ""
        self._matched: str | None = None

    @property
    def stopped(self) -> bool:
        """True once a stop string has completed."""
        return self._matched is not None

    @property
    def held(self) -> str:
        """Text currently held back as a possible stop prefix."""
        return self._held

    def push(self, delta: str) -> StopResult:
        """Feed the next text delta; return what may be emitted and whether we stopped."""
        if self._matched is not None:
            return StopResult("", True, self._matched)
        if not self._stops:
            return StopResult(delta, False, None)
        buf = self._held + delta
        match = self._earliest_match(buf, len(self._held))
        if match is not None:
            start, stop = match
            self._matched, self._held = stop, ""
            return StopResult(buf[:start], True, stop)
        keep = self._partial_suffix_len(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return StopResult(buf[: len(buf) - keep], False, None)

    def flush(self) -> str:
        """Return held text at the end of generation ('' after a stop)."""
        held, self._held = self._held, ""
        return "" if self._matched is not None else held

    def _earliest_match(self, buf: str, old_len: int) -> tuple[int, str] | None:
        """Return (start, stop) of the stop completing earliest in ``buf``, if any.

        ``buf[:old_len]`` is known to hold no complete stop, so every match ends after it.
        """
        best: tuple[int, int, str] | None = None  # (end, -length, stop)
        for stop in self._stops:
            start = buf.find(stop, max(0, old_len - len(stop) + 1))
            if start < 0:
                continue
            cand = (start + len(stop), -len(stop), stop)
            if best is None or cand[:2] < best[:2]:
                best = cand
        if best is None:
            return None
        end, neg_len, stop = best
        return end + neg_len, stop

    def _partial_suffix_len(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of some stop."""
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(buf)), best, -1):
                if buf.endswith(stop[:n]):
                    best = n
                    break
        return best


def tokens_before_stop(
    tokenizer: Any,
    completion_ids: Sequence[int],
    text_limit_chars: int,
    skip_special_tokens: bool = True,
) -> int:
    """Return how many completion tokens to keep when the text was cut at ``text_limit_chars``.

    Rule: the smallest ``n`` such that the *complete* characters of
    ``tokenizer.decode(completion_ids[:n])`` (a trailing U+FFFD, i.e. a character still
    being assembled from byte tokens, does not count) cover ``text_limit_chars`` characters.
    Consequences: a token that straddles the stop string (starts before it, ends inside
    it) is kept — as vLLM does, the text is truncated but the token stays, because the
    emitted text needs its first part; a token starting exactly where the stop starts,
    and every later one, is dropped. ``text_limit_chars == 0`` keeps nothing. If the
    ids never cover the limit, all of them are kept.

    ``text_limit_chars`` is measured on the text of the completion alone, i.e. the
    concatenated deltas of an :class:`~orchestrator.detokenize.IncrementalDetokenizer`
    (identical to a standalone decode for byte-level BPE such as SmolLM2).
    Binary search: O(log n) decodes.
    """
    ids = list(completion_ids)
    if text_limit_chars <= 0 or not ids:
        return 0
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        text = tokenizer.decode(ids[:mid], skip_special_tokens=skip_special_tokens)
        complete = len(text) - 1 if text.endswith(REPLACEMENT_CHAR) else len(text)
        if complete >= text_limit_chars:
            hi = mid
        else:
            lo = mid + 1
    return lo


def cut_at_limits(
    emitted: Sequence[int], completed: int, context_len: int, params: Any, eos_ids: Any, max_context: int
) -> tuple[list[int], pb.FinishReason]:
    """A round's tokens cut at EOS (when honoured: not with params.ignore_eos, not before params.min_tokens),
    params.max_new_tokens or the model's context end; returns (tokens kept, the finish reason they hit,
    FINISH_REASON_UNSPECIFIED = none). completed / context_len: completion and context tokens before them."""
    for i, token in enumerate(emitted):
        produced = completed + i + 1
        if token in eos_ids and not params.ignore_eos and produced > params.min_tokens:
            return list(emitted[: i + 1]), pb.FINISH_REASON_EOS
        if produced >= params.max_new_tokens:
            return list(emitted[: i + 1]), pb.FINISH_REASON_LENGTH
        if context_len + i + 1 >= max_context:
            return list(emitted[: i + 1]), pb.FINISH_REASON_CONTEXT
    return list(emitted), pb.FINISH_REASON_UNSPECIFIED
