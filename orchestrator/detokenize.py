"""Incremental detokenization for streaming (the vLLM/TGI prefix/read-offset technique).

Decoding one token at a time is wrong for two reasons:

* byte-level BPE (GPT-2 style, SmolLM2) and SentencePiece byte-fallback split one
  multi-byte UTF-8 character (a Chinese character, an emoji) over several tokens;
  decoding a prefix that ends inside such a character yields U+FFFD;
* SentencePiece decoders strip the leading space of the *first* token decoded, so
  decoding a token alone loses the space that belongs to it.

:class:`IncrementalDetokenizer` therefore decodes a small *window* of ids — a few
already-emitted tokens of left context (``[prefix_offset, read_offset)``) plus the
tokens not yet emitted — and emits the part of the window text that lies after the
context text. A trailing U+FFFD (an incomplete character) is held back until the
bytes that complete it arrive; everything before it is emitted at once. The
window is kept small (context + at most a few pending tokens) even when every chunk
ends mid-character, so each push costs O(chunk) decode work.

Known limits: a model emitting invalid UTF-8 for more than ``MAX_PENDING_TOKENS``
tokens in a row gets its U+FFFD emitted early (bounded cost over exactness); a
tokenizer with ``clean_up_tokenization_spaces=True`` may differ from a full decode
at window boundaries (SmolLM2 has it False).

Invariant (see tests/unit/test_detokenize.py): for a byte-level tokenizer, the
concatenation of all ``push`` deltas plus ``flush()`` equals
``tokenizer.decode(completion_ids, skip_special_tokens=...)`` whatever the chunking.
With a SentencePiece tokenizer and ``prompt_ids`` given, the stream keeps the
leading space of the first completion token (which a standalone decode strips):
that is the correct text to show after the prompt.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

REPLACEMENT_CHAR = "\ufffd"
"""What decoders produce for an incomplete (or invalid) UTF-8 sequence."""

CONTEXT_TOKENS = 5
"""Tokens of already-decoded left context kept in the window (vLLM uses 5 too)."""

MAX_INCOMPLETE_TAIL_TOKENS = 3
"""A valid UTF-8 character is at most 4 bytes and a byte-level token at least one byte,
so an incomplete trailing character spans at most 3 tokens; when more tokens are pending,
the window is compacted to the last token boundary where the text is complete."""

MAX_PENDING_TOKENS = 32
"""Upper bound on pending tokens when no complete boundary can be found (the model
produced invalid UTF-8): beyond it the U+FFFD is emitted as genuine garbage, which keeps
every decode bounded (no quadratic blow-up on pathological output)."""


@dataclass
class _Window:
    """Decoding state: ids kept, offsets into them and what was emitted from the window."""

    ids: list[int] = field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0
    prefix_len: int = 0
    emitted_len: int = 0


class IncrementalDetokenizer:
    """Turn a stream of token ids into a stream of text deltas.

    Args:
        tokenizer: a Hugging Face tokenizer (anything with ``decode(ids, skip_special_tokens=...)``).
        prompt_ids: ids that precede the completion; only the last ``CONTEXT_TOKENS``
            are kept, as left context for the first completion tokens.
        skip_special_tokens: passed to ``tokenizer.decode``.
    """

    def __init__(
        self,
        tokenizer: Any,
        prompt_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        context = [int(i) for i in list(prompt_ids)[-CONTEXT_TOKENS:]]
        self._w = _Window(ids=context, prefix_offset=0, read_offset=len(context))
        self._w.prefix_len = len(self._decode(context))

    def _decode(self, ids: Sequence[int]) -> str:
        """Decode ``ids`` with the configured special-token handling."""
        if not ids:
            return ""
        return self._tokenizer.decode(list(ids), skip_special_tokens=self._skip_special)

    def push(self, new_ids: Sequence[int]) -> str:
        """Add ``new_ids`` (any number, possibly none) and return the newly printable text."""
        w = self._w
        w.ids.extend(int(i) for i in new_ids)
        if len(w.ids) == w.read_offset:
            return ""
        pending = self._pending(len(w.ids))
        if pending and not pending.endswith(REPLACEMENT_CHAR):
            return self._emit_all(pending)
        if len(w.ids) - w.read_offset > MAX_PENDING_TOKENS:
            logger.debug("emitting U+FFFD after %d pending tokens", len(w.ids) - w.read_offset)
            return self._emit_all(pending)
        delta = pending[:-1][w.emitted_len :]
        w.emitted_len += len(delta)
        if len(w.ids) - w.read_offset > MAX_INCOMPLETE_TAIL_TOKENS:
            self._compact()
        return delta

    def flush(self) -> str:
        """Return whatever is still held (e.g. a trailing incomplete character, as U+FFFD)."""
        w = self._w
        if len(w.ids) == w.read_offset:
            return ""
        return self._emit_all(self._pending(len(w.ids)))

    def _pending(self, end: int) -> str:
        """Text of ``ids[read_offset:end]``, decoded with the left context."""
        w = self._w
        return self._decode(w.ids[w.prefix_offset : end])[w.prefix_len :]

    def _emit_all(self, pending: str) -> str:
        """Emit the rest of ``pending`` (text of all unread ids) and advance past them."""
        w = self._w
        delta = pending[w.emitted_len :]
        w.emitted_len = len(pending)
        if pending:
            self._advance(len(w.ids), len(pending))
        return delta

    def _compact(self) -> None:
        """Advance to the last token boundary before the incomplete tail whose text is complete."""
        w = self._w
        for end in range(len(w.ids) - 1, w.read_offset, -1):
            pending = self._pending(end)
            if pending and not pending.endswith(REPLACEMENT_CHAR) and len(pending) <= w.emitted_len:
                self._advance(end, len(pending))
                return

    def _advance(self, end: int, pending_len: int) -> None:
        """Make ``ids[read_offset:end]`` (at most ``CONTEXT_TOKENS`` of them) the left context.

        ``pending_len`` is the length of their text; emitted characters beyond it belong
        to the new window and are carried over.
        """
        w = self._w
        carried = w.emitted_len - pending_len
        cut = max(w.read_offset, end - CONTEXT_TOKENS)
        del w.ids[:cut]
        w.prefix_offset = 0
        w.read_offset = end - cut
        w.prefix_len = len(self._decode(w.ids[: w.read_offset]))
        w.emitted_len = carried
