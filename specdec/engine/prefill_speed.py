"""How fast a model service prefills, as its own passes measure it, and what that buys.

Two speeds are learned (model ms per prompt token, an EWMA over passes that prefilled): of the batches, and of long
prompts' chunked-prefill turns (a turn at a long context costs several times a short prompt's token). From them:
how many prompt tokens one pass, or one long prompt's turn, may take while other sessions decode (about
`prefill_turn_ms` of work: decode first), and how long a new call would wait behind the work queued ahead of it,
which admission compares with the caller's deadline (load shedding at the door).
"""

from __future__ import annotations

from specdec.config import Limits
from specdec.engine.worker import MS_PER_S, ewma

#: a call computing more tokens than the largest verify (k = Limits.max_k, plus the bonus row) is a prefill.
PREFILL_MIN_TOKENS = Limits.max_k + 2
#: a new prefill is refused (RESOURCE_EXHAUSTED) when the work queued ahead of it, and its own, would take more
#: than this share of the time its caller still waits (its gRPC deadline): shed at the door, not time out
#: inside. 1: only calls the estimate says cannot finish in time.
ADMIT_DEADLINE_SHARE = 1.0
#: the fewest tokens a long prefill's turn computes while other sessions decode (PrefillSpeed.turn_tokens).
MIN_TURN_TOKENS = 32


class PrefillSpeed:
    """The measured prefill speeds of one model service's passes, and the budgets and waits they imply.

    Args:
        chunk_tokens: chunked prefill's chunk (0: prompts are prefilled whole, first come first served).
        prefill_turn_ms: the work a pass's prefill, or a long prompt's turn, may take while others decode.
    """

    def __init__(self, chunk_tokens: int, prefill_turn_ms: float) -> None:
        self.chunk_tokens = chunk_tokens
        self.prefill_turn_ms = prefill_turn_ms
        self.ms_per_token = 0.0  # model ms per token of recent batches that prefilled (0: not measured)
        self.chunk_ms_per_token = 0.0  # the same, of chunked-prefill turns (long contexts, small passes)

    @staticmethod
    def pass_ms_per_token(tokens: int, elapsed_s: float) -> float:
        """Model ms per token of a pass that prefilled `tokens` tokens in `elapsed_s` (0 when it prefilled
        too few to say)."""
        if tokens < PREFILL_MIN_TOKENS or elapsed_s <= 0:
            return 0.0
        return elapsed_s * MS_PER_S / tokens

    def learn(self, tokens: int, elapsed_s: float, long_context: bool) -> None:
        """Fold a pass that prefilled `tokens` in `elapsed_s` into the speed of its kind: long prefills' turns
        (long contexts) or batches."""
        now = self.pass_ms_per_token(tokens, elapsed_s)
        if now and long_context:
            self.chunk_ms_per_token = ewma(self.chunk_ms_per_token, now)
            self.ms_per_token = self.ms_per_token or now  # no batch has prefilled yet: a first figure
        elif now:
            self.ms_per_token = ewma(self.ms_per_token, now)

    def turn_tokens(self, others_decoding: bool) -> int:
        """Tokens a long prefill computes in its next turn (see prefill_turn_ms), at the long turns' speed."""
        return self._fit_turn(self.chunk_ms_per_token, others_decoding)

    def pass_prefill_tokens(self, others_decoding: bool) -> int:
        """The most prompt tokens one pass prefills (a longer prompt takes turns): a chunk alone; while other
        sessions decode, what prefill_turn_ms buys at the batches' measured speed (never below
        MIN_TURN_TOKENS). So a burst of new prompts, or one of a few hundred tokens, spreads over several
        passes with decode rounds in between, instead of holding every running session for one pass of them
        all; and each pass's activations stay small. vLLM's token budget per step."""
        return self._fit_turn(self.ms_per_token, others_decoding)

    def _fit_turn(self, ms_per_token: float, others_decoding: bool) -> int:
        """The prompt tokens that take about prefill_turn_ms at `ms_per_token`, within [MIN_TURN_TOKENS, a
        chunk]; a whole chunk when nobody else decodes, or the speed is not measured yet, or turns are off."""
        if not others_decoding or self.prefill_turn_ms <= 0 or ms_per_token <= 0:
            return self.chunk_tokens
        return min(self.chunk_tokens, max(MIN_TURN_TOKENS, int(self.prefill_turn_ms / ms_per_token)))

    def wait_ms(self, own: int, ahead: list[int]) -> float:
        """About how long a new call computing `own` tokens takes to be done (an upper estimate) behind calls
        computing `ahead` tokens each, at the measured speeds: batches at ms_per_token, long prefills' turns at
        chunk_ms_per_token. Without chunked prefill the queue runs first come: all the work queued ahead, then
        its own. With it, a call that fits a batch runs in the next batch, behind at most one turn of the oldest
        long prefill (decode first): not behind the whole of the long ones; a long prefill takes its turns after
        the long ones queued before it (first come, first served among them)."""
        batch_ms, chunk_ms = self.ms_per_token, self.chunk_ms_per_token or self.ms_per_token
        if not self.chunk_tokens:
            return (own + sum(ahead)) * batch_ms
        fits = sum(work for work in ahead if work <= self.chunk_tokens)
        longs = [work for work in ahead if work > self.chunk_tokens]
        if own > self.chunk_tokens:
            return fits * batch_ms + (own + sum(longs)) * chunk_ms
        turn = min(min(longs), self.turn_tokens(others_decoding=True)) if longs else 0
        return (own + fits) * batch_ms + turn * chunk_ms

    def refusal(self, own: int, ahead: list[int], deadline_s: float) -> str:
        """Why a call computing `own` tokens is refused at the door ("" when it is admitted): a prefill whose
        estimated wait exceeds ADMIT_DEADLINE_SHARE of the time its caller still waits. Decode rounds of running
        generations, and any call before the speed is measured, are admitted."""
        if self.ms_per_token <= 0 or own < PREFILL_MIN_TOKENS:
            return ""
        wait_s = self.wait_ms(own, ahead) / MS_PER_S
        if wait_s <= ADMIT_DEADLINE_SHARE * deadline_s:
            return ""
        return (
            f"target overloaded: about {wait_s:.1f} s of queued work for a {own}-token "
            f"prefill and the call waits at most {deadline_s:.1f} s; retry later"
        )
