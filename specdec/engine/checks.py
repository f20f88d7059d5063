"""Request checks shared by the draft and target engines (INVALID_ARGUMENT before any model work)."""

from __future__ import annotations

from collections.abc import Sequence

from specdec.errors import InvalidArgument


def check_token_ids(ids: Sequence[int], width: int, what: str, start: int = 0) -> None:
    """Every id from ids[start] on must lie in [0, width) (those before were checked already)."""
    for i in range(start, len(ids)):
        t = ids[i]
        if not 0 <= t < width:
            raise InvalidArgument(f"{what}[{i}] = {t} is outside the vocabulary [0, {width})")


def check_lengths(context_len: int, extra: int, max_context: int) -> None:
    """A non-empty context and room for `extra` more tokens within the model's context."""
    if context_len == 0:
        raise InvalidArgument("context_ids is empty: at least one token (e.g. BOS) is needed")
    if context_len + extra > max_context:
        raise InvalidArgument(
            f"context of {context_len} tokens + {extra} more exceeds the model's context of {max_context}"
        )
