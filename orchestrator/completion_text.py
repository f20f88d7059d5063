"""The text of a completion, as its client sees it: one path for the live stream and for a replay.

Completion ids become text through an :class:`~orchestrator.detokenize.IncrementalDetokenizer`
(a trailing incomplete UTF-8 character is held) and then a :class:`~orchestrator.stops.StopMatcher`
(a possible stop-string prefix is held). When the generation ends other than at a stop string, its
last ids release what both hold: the detokenizer's flush (an incomplete character as U+FFFD) and the
held stop prefix. A replay of a stored completion (a retried or resumed request) runs the same steps,
with the same release at the end, over the stored ids, so it gives the live stream's text character for
character (a trailing U+FFFD included).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.detokenize import IncrementalDetokenizer
from orchestrator.stops import StopMatcher, StopResult


class CompletionText:
    """Completion ids -> text deltas for one generation (or one replay of it).

    Args:
        tokenizer: a Hugging Face tokenizer.
        prompt_ids: the context before the completion (left context for the detokenizer).
        stop: the request's stop strings.
    """

    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int], stop: Sequence[str]) -> None:
        self._detok = IncrementalDetokenizer(tokenizer, prompt_ids)
        self._stops = StopMatcher(stop)

    def push(self, ids: Sequence[int], last: bool = False) -> StopResult:
        """The text the next ``ids`` let through. ``last``: the generation ends with them (other than at a stop
        string), so what is still held is released too; a stop string completing here still ends the text."""
        delta = self._stops.push(self._detok.push(ids))
        if not last or delta.stopped:
            return delta
        rest = self._stops.push(self._detok.flush()).emit + self._stops.flush()
        return StopResult(delta.emit + rest, False, None)

    def replay(self, ids: Sequence[int], offset: int, ended: bool, chars: int = -1) -> tuple[str, str]:
        """A stored completion's text as its live stream gave it: (the text of ``ids[:offset]``, which a
        resuming client holds already, the text of the rest).

        ``ended``: the generation finished other than at a stop string, so its last ids released what was
        held (``push(..., last=True)``, as its last round did). ``chars``: how many characters the finished
        request delivered (-1: not known). After a stop string the stored ids end with the token in which the
        stop began (stops.tokens_before_stop); with ``chars`` known, everything is released and cut there,
        exactly the live text. Without it the matcher finds the stop again or holds its beginning, which
        differs where two stop strings overlap (stops "ab" and "cad" on "xca|b": live "xc", held "ca").
        """
        if chars >= 0:
            held, rest = self._split(ids, offset, True)
            return held[:chars], rest[: max(chars - len(held), 0)]
        return self._split(ids, offset, ended)

    def _split(self, ids: Sequence[int], offset: int, ended: bool) -> tuple[str, str]:
        if offset >= len(ids):
            return self.push(ids, ended).emit, ""
        held = self.push(ids[:offset]).emit
        return held, self.push(ids[offset:], ended).emit
