"""The target engine: score context + all k draft tokens in ONE forward pass, return the verdict."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from specdec.core.accept import accept
from specdec.core.sampling import (
    logits_to_probs,
    penalised_scores,
    position_counts,
    round_generators,
    sparse_to_dense,
    token_counts,
)
from specdec.engine.checks import check_lengths, check_token_ids
from specdec.engine.runner import ExtendItem, ForwardResult, Runner
from specdec.engine.types import (
    ComputeStatsData,
    HiddenRows,
    SparseDist,
    TokenLogprobData,
    VerifyInput,
    VerifyOutput,
    prefilled_after,
)
from specdec.errors import FailedPrecondition, InvalidArgument, SpecDecError


class TargetEngine:
    """Verifies drafts for many sessions, each with its own KV cache.

    Args:
        runner: the model and its session caches.
        max_context: the model's context length.
        max_k: the longest draft accepted.
        max_hidden_rows: the most hidden-state rows one Verify returns (feature drafts catch up
            over several rounds beyond that).
    """

    def __init__(self, runner: Runner, max_context: int, max_k: int, max_hidden_rows: int = 0) -> None:
        self.runner = runner
        self.max_context = max_context
        self.max_k = max_k
        self.max_hidden_rows = max_hidden_rows
        self.width = runner.vocab_width

    def work_tokens(self, inp: VerifyInput) -> int:
        """Tokens a verify of `inp` would run through the model (what its cache does not cover)."""
        return self.runner.pool.uncached(inp.session_id, inp.ids, inp.prefix_hashes)

    def inline_tokens(self, inp: VerifyInput) -> int:
        """Positions a verify of `inp` writes into its cache, computed or copied (KVCachePool.uncached, lent=False)."""
        return self.runner.pool.uncached(inp.session_id, inp.ids, inp.prefix_hashes, lent=False)

    def prefill_chunk(self, inp: VerifyInput, budget: int) -> int:
        """Chunked prefill: extend the session's cache over the next `budget` uncached context tokens
        (one pass of its own, logits discarded); returns the tokens a verify of `inp` still computes.

        Runs only while more than `budget` tokens are uncached, so the verify itself always computes
        its last rows. Its cost is added to the verify's stats (`inp.prefilled`).
        """
        item = self._turn_item(inp, budget)
        if item is None:
            return self.work_tokens(inp)
        return self._turn_done(inp, self.runner.extend_batch([item])[0])

    def verify_batch_with_turn(
        self, inputs: list[VerifyInput], turn: VerifyInput, budget: int
    ) -> tuple[list[VerifyOutput | SpecDecError], int | SpecDecError]:
        """`verify_batch(inputs)` and `prefill_chunk(turn, budget)` in ONE forward pass: a prefill's turn rides in
        the decode rounds' pass instead of a pass of its own (each pass streams the weights once). Returns (the
        verdicts, the tokens a verify of `turn` still computes, or its error: it fails alone)."""
        try:
            item = self._turn_item(turn, budget)
        except SpecDecError as exc:
            return self.verify_batch(inputs), exc
        if item is None:
            return self.verify_batch(inputs), self.work_tokens(turn)
        results, forwards = self._verify_with(inputs, [item])
        fwd = forwards[0]
        return results, fwd if isinstance(fwd, SpecDecError) else self._turn_done(turn, fwd)

    def _turn_item(self, inp: VerifyInput, budget: int) -> ExtendItem | None:
        """The extend that prefills `inp`'s next `budget` uncached tokens (None: no more than that is left, the
        verify computes it). Raises what the verify would for a bad input."""
        self._check(inp, len(inp.draft_ids))
        left = self.work_tokens(inp)
        if left <= budget:
            return None
        end = len(inp.ids) - left + budget
        return ExtendItem(inp.session_id, inp.ids[:end], end - 1, inp.prefix_hashes, inp.hidden_from >= 0)

    def _turn_done(self, inp: VerifyInput, fwd: ForwardResult) -> int:
        """Add a turn's work to the verify's stats; return the tokens it still computes."""
        inp.prefilled = prefilled_after(inp.prefilled, fwd)
        return self.work_tokens(inp)

    def verify(self, inp: VerifyInput) -> VerifyOutput:
        """Verify one session's draft (a batch of one)."""
        out = self.verify_batch([inp])[0]
        if isinstance(out, Exception):
            raise out
        return out

    def verify_batch(self, inputs: list[VerifyInput]) -> list[VerifyOutput | SpecDecError]:
        """Verify drafts of distinct sessions in ONE forward pass; an item's bad input fails that item only.

        Steps: 1. check each input, 2. one (packed) forward over every context + draft,
        3. per session: p per row, accept, logprobs. When the batched forward refuses
        (one session over the cache budget), each item is run alone so only that one fails.
        """
        return self._verify_with(inputs, [])[0]

    def _verify_with(
        self, inputs: list[VerifyInput], extra: list[ExtendItem]
    ) -> tuple[list[VerifyOutput | SpecDecError], list[ForwardResult | SpecDecError]]:
        """verify_batch, with `extra` extends (prefill turns) in the same pass: (verdicts, the extras' forwards)."""
        results: list[VerifyOutput | SpecDecError | None] = [None] * len(inputs)
        todo = []
        for i, inp in enumerate(inputs):
            try:
                self._check(inp, len(inp.draft_ids))
                todo.append(i)
            except SpecDecError as exc:
                results[i] = exc
        items = [
            ExtendItem(
                inputs[i].session_id,
                inputs[i].ids,
                len(inputs[i].context_ids) - 1,
                inputs[i].prefix_hashes,
                inputs[i].hidden_from >= 0,
            )
            for i in todo
        ] + extra
        forwards: Sequence[ForwardResult | SpecDecError]
        try:
            forwards = self.runner.extend_batch(items) if items else []
        except SpecDecError as exc:
            forwards = [exc] if len(items) == 1 else [self._extend_alone(item) for item in items]
        for i, fwd in zip(todo, forwards):
            results[i] = fwd if isinstance(fwd, SpecDecError) else self._judge(inputs[i], fwd)
        verdicts = [result for result in results if result is not None]
        assert len(verdicts) == len(inputs), "each input was refused or judged"
        return verdicts, list(forwards[len(todo) :])

    def _extend_alone(self, item: ExtendItem) -> ForwardResult | SpecDecError:
        try:
            return self.runner.extend_batch([item])[0]
        except SpecDecError as exc:
            return exc

    def _judge(self, inp: VerifyInput, fwd: ForwardResult) -> VerifyOutput:
        """p per row from the logits ([k+1, V]), the accept rule, logprobs of what was emitted."""
        k = len(inp.draft_ids)
        history = self._history(inp) if inp.sampling.has_penalties else None
        if inp.sampling.greedy:  # the accept rule needs only each row's argmax: no [k+1, V] one-hots to build
            p = penalised_scores(fwd.logits, inp.sampling, history)  # [k+1, V]
        else:
            p = logits_to_probs(fwd.logits, inp.sampling, history)  # [k+1, V]
        q = self._dense_q(inp.draft_probs, k)
        generators = None
        if not inp.sampling.greedy:
            assert inp.sampling.seed is not None, "resolve_sampling draws a seed"
            generators = round_generators(inp.sampling.seed, first_position=inp.position_base + len(inp.context_ids))
        result = accept(
            inp.draft_ids, p, q, generators=generators, greedy=inp.sampling.greedy, all_rows=not inp.verdict_only
        )
        emitted = result.emitted(inp.draft_ids)
        logprobs = token_logprobs(fwd.logits, emitted, inp.logprobs)
        stats = ComputeStatsData(
            fwd.cached_tokens,
            fwd.computed_tokens,
            fwd.rolled_back,
            fwd.forward_ms,
            batch_size=fwd.batch_size,
            batch_tokens=fwd.batch_tokens,
        )
        if inp.prefilled is not None:  # chunks run before this pass
            stats.follow(inp.prefilled)
        hidden = self._hidden(inp, fwd, len(inp.context_ids) + result.num_accepted)
        return VerifyOutput(result, logprobs, stats, hidden)

    def _hidden(self, inp: VerifyInput, fwd: ForwardResult, end: int) -> HiddenRows | None:
        """Hidden states of positions hidden_from .. end-1 (the accepted context), capped in rows."""
        if inp.hidden_from < 0 or fwd.hidden is None:
            return None
        local = min(inp.hidden_from, end)
        rows = fwd.hidden[local : min(end, local + self.max_hidden_rows)]  # [n, H], a view of the session's buffer
        return HiddenRows(inp.position_base + local, rows.clone())

    def _check(self, inp: VerifyInput, k: int) -> None:
        if k > self.max_k:
            raise InvalidArgument(f"{k} draft tokens is more than max_k={self.max_k}")
        check_lengths(len(inp.context_ids), k + 1, self.max_context)
        check_token_ids(inp.context_ids, self.width, "context_ids", inp.checked_ids)
        check_token_ids(inp.draft_ids, self.width, "draft_ids")
        if inp.draft_probs and len(inp.draft_probs) != k:
            raise InvalidArgument(f"draft_probs has {len(inp.draft_probs)} rows for {k} draft tokens")
        if inp.hidden_from >= 0 and not self.runner.keep_hidden:
            raise FailedPrecondition(
                "this target does not keep hidden states (SPECDEC_KEEP_HIDDEN=0): it cannot serve a feature draft"
            )

    def _history(self, inp: VerifyInput) -> torch.Tensor:  # [k+1, V]
        base = token_counts(inp.context_ids, self.width)
        return position_counts(base, torch.tensor(inp.draft_ids, dtype=torch.long))

    def _dense_q(self, rows: list[SparseDist], k: int) -> torch.Tensor | None:  # [k, V] or None
        if not rows:
            return None
        width = max([self.width] + [max(r.token_ids, default=0) + 1 for r in rows])
        ids = _pad([r.token_ids for r in rows], 0)
        probs = _pad([r.probs for r in rows], 0.0)
        try:
            return sparse_to_dense(torch.tensor(ids), torch.tensor(probs), width)
        except ValueError as exc:
            raise InvalidArgument(f"draft_probs: {exc}") from None


def _pad(rows: list[list[Any]], fill: Any) -> list[list[Any]]:
    n = max(len(r) for r in rows)
    return [list(r) + [fill] * (n - len(r)) for r in rows]


def token_logprobs(logits: torch.Tensor, emitted: list[int], top_n: int) -> list[TokenLogprobData]:
    """Log-probabilities of the emitted tokens under the target's raw distribution (row i -> token i).

    logits: [k+1, V]. Returns [] when top_n < 0. The raw distribution (log-softmax of the
    model's logits, before temperature/top-k/top-p) is what vLLM and OpenAI report.
    """
    if top_n < 0:
        return []
    logp = torch.log_softmax(logits[: len(emitted)].float(), dim=-1)  # [m+1, V]
    out = []
    for row, token in zip(logp, emitted):
        item = TokenLogprobData(token, float(row[token]))
        if top_n > 0:
            top = torch.topk(row, top_n)
            item.top_token_ids, item.top_logprobs = top.indices.tolist(), top.values.tolist()
        out.append(item)
    return out
