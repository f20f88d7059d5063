"""Turning requests into token ids: plain prompts, chat messages, and continued sessions.

Multi-turn sessions store token ids, never re-tokenized text. A new turn is
the part of the chat template that the new messages add after the earlier
turns, found by rendering the template with and without them and taking the
difference (so a template's default system prompt is not inserted again).
A turn that ended without EOS (length limit, stop string) is closed first with
the template's end-of-turn text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specdec.errors import FailedPrecondition, InvalidArgument

_PROBE_USER = "\x00probe-user\x00"
_PROBE_ASSISTANT = "\x00probe-assistant\x00"


@dataclass(frozen=True)
class Message:
    role: str
    content: str


ROLES = ("system", "user", "assistant", "tool")


def check_messages(messages: Sequence[Message]) -> None:
    """Roles must be known and at least one message given."""
    if not messages:
        raise InvalidArgument("messages is empty: give at least one chat message")
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise InvalidArgument(f"messages[{i}].role must be one of {ROLES}, got {m.role!r}")


class Prompter:
    """Tokenizes prompts and chat turns with the target's tokenizer and chat template."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.has_template = bool(getattr(tokenizer, "chat_template", None))

    def encode_text(self, text: str, first_turn: bool) -> list[int]:
        """Plain text; BOS (if the tokenizer adds one) only at the start of a session."""
        return list(self.tokenizer.encode(text, add_special_tokens=first_turn))

    def _render(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        if not self.has_template:
            raise FailedPrecondition("the target's tokenizer has no chat template; send a plain prompt instead")
        return self.tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages],
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )

    def first_turn(self, messages: Sequence[Message], add_generation_prompt: bool) -> list[int]:
        """The whole templated conversation (the template adds BOS/system text itself)."""
        check_messages(messages)
        return self.encode_text(self._render(messages, add_generation_prompt), first_turn=False)

    def next_turn(self, messages: Sequence[Message], add_generation_prompt: bool) -> list[int]:
        """Only what the new messages add after an earlier user/assistant exchange."""
        check_messages(messages)
        before = [Message("user", _PROBE_USER), Message("assistant", _PROBE_ASSISTANT)]
        head = self._render(before, add_generation_prompt=False)
        full = self._render(before + list(messages), add_generation_prompt)
        if not full.startswith(head):
            raise FailedPrecondition(
                "the chat template does not render turns incrementally; start a new session with the whole conversation"
            )
        return self.encode_text(full[len(head) :], first_turn=False)

    def end_of_turn(self) -> list[int]:
        """Tokens that close an assistant turn that stopped without EOS ([] without a template)."""
        if not self.has_template:
            return []
        text = self._render([Message("user", _PROBE_USER), Message("assistant", _PROBE_ASSISTANT)], False)
        tail = text[text.index(_PROBE_ASSISTANT) + len(_PROBE_ASSISTANT) :]
        return self.encode_text(tail, first_turn=False)
