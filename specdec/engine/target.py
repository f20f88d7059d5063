"""The target engine: score context + all k draft tokens in ONE forward pass, return the verdict."""

from __future__ import annotations

from typing import Any

import torch

from specdec.core.accept import accept
from specdec.core.sampling import (
    SamplingConfig, logits_to_probs, position_counts, round_generators, sparse_to_dense, token_counts,
)
from specdec.engine.checks import check_lengths, check_token_ids
from specdec.engine.runner import CausalLMRunner
from specdec.engine.types import ComputeStatsData, SparseDist, TokenLogprobData, VerifyInput, VerifyOutput
from specdec.errors import InvalidArgument


class TargetEngine:
    """Verifies drafts for many sessions, each with its own KV cache.

    Args:
        runner: the model and its session caches.
        max_context: the model's context length.
        max_k: the longest draft accepted.
    """

    def __init__(self, runner: CausalLMRunner, max_context: int, max_k: int) -> None:
        self.runner = runner
        self.max_context = max_context
        self.max_k = max_k
        self.width = runner.model.get_output_embeddings().weight.shape[0]

    def verify(self, inp: VerifyInput) -> VerifyOutput:
        """Steps: 1. check, 2. one forward over context + draft, 3. p per row, 4. accept, 5. logprobs."""
        k = len(inp.draft_ids)
        self._check(inp, k)
        ids = inp.context_ids + inp.draft_ids
        fwd = self.runner.extend(inp.session_id, ids, first=len(inp.context_ids) - 1)  # logits: [k+1, V]
        history = self._history(inp) if inp.sampling.has_penalties else None
        p = logits_to_probs(fwd.logits, inp.sampling, history)  # [k+1, V]
        q = self._dense_q(inp.draft_probs, k)
        first_position = inp.position_base + len(inp.context_ids)
        result = accept(torch.tensor(inp.draft_ids, dtype=torch.long), p, q,
                        generators=None if inp.sampling.greedy else round_generators(inp.sampling.seed, first_position),
                        greedy=inp.sampling.greedy)
        emitted = inp.draft_ids[: result.num_accepted] + [result.next_token]
        logprobs = token_logprobs(fwd.logits, emitted, inp.logprobs)
        stats = ComputeStatsData(fwd.cached_tokens, fwd.computed_tokens, fwd.rolled_back, fwd.forward_ms)
        return VerifyOutput(result, logprobs, stats)

    def _check(self, inp: VerifyInput, k: int) -> None:
        if k > self.max_k:
            raise InvalidArgument(f"{k} draft tokens is more than max_k={self.max_k}")
        check_lengths(len(inp.context_ids), k + 1, self.max_context)
        check_token_ids(inp.context_ids, self.width, "context_ids")
        check_token_ids(inp.draft_ids, self.width, "draft_ids")
        if inp.draft_probs and len(inp.draft_probs) != k:
            raise InvalidArgument(f"draft_probs has {len(inp.draft_probs)} rows for {k} draft tokens")

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
