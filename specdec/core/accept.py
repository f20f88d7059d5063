"""The accept rule of one speculative round: pure functions over tensors.

Vocabulary: the **draft** proposes k tokens d1..dk drawn from q (the draft distribution);
the **target** scores context + d1..dk in one pass, giving p (the target distribution) at
k+1 positions. The longest acceptable prefix d1..dm is **accepted**; at the first
rejection the target supplies a **recovered** token; when all k are accepted the target's
last row yields a free **bonus** token. Every round therefore produces m + 1 tokens.

* Greedy: accept while ``d_i == argmax p_i``; the next token is ``argmax p_(m+1)``.
* Sampling (Leviathan et al. 2023; Chen et al. 2023): accept d_i with probability
  ``min(1, p_i(d_i) / q_i(d_i))``; at the first rejection sample the recovered token from
  ``norm(max(0, p_i - q_i))``; if all k are accepted sample the bonus from ``p_(k+1)``.
  The output then follows p exactly, whatever q is - provided q is the distribution the
  draft really sampled from (the sparse top-N q', densified, not the full draft softmax).
* Point mass (``draft_probs=None`` while sampling: n-gram or greedy drafts): q = delta_d,
  so accept with probability p(d) and recover from p with d removed, renormalised.
* Residual of all zeros (only when p == q on the support, where a rejection has
  probability zero): fall back to p.
* Differing widths: p has width Vp, q has width Vq (e.g. 152,064 vs 151,936). Both are
  compared over the shared vocabulary ``min(Vq, Vp)``: q is taken as 0 beyond its width,
  p beyond the draft's width is kept (it only matters for the residual), and a draft id
  at or beyond Vp has p = 0 (always rejected).
* EOS is an ordinary token here; the caller truncates the output after an EOS.

Random draws come from per-position generators (see ``specdec.core.sampling``): uniform
for the accept test of d_(i+1) from ``(i, "accept")``, the recovered token at row i from
``(i, "recover")``, the bonus from ``(k, "bonus")``, where i indexes the k+1 target rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specdec.core.sampling import PROBS_DTYPE, argmax_ids, argmax_rows, argmax_until_mismatch, sample

RECOVERED = "recovered"
BONUS = "bonus"
PADDING_ID = -1
UNIFORM_DTYPE = torch.float64

Generators = Callable[[int, str], torch.Generator] | torch.Generator | None


@dataclass(frozen=True)
class AcceptResult:
    """Outcome of one round.

    num_accepted: m in 0..k. next_token / next_kind: the recovered token (m < k) or the
    bonus (m == k). target_ids: the target's argmax at each of the k+1 rows (for traces).
    matches: per draft position, was it accepted? Positions after the first rejection were
    never tested; for them the entry says what greedy comparison (d_i == target_ids[i])
    would say. A verdict-only result (``accept(..., all_rows=False)``) stops both lists where
    the rule stopped: target_ids has the argmax of rows 0..m (greedy) or none (sampling),
    matches has m trues and, when m < k, one false.
    """

    num_accepted: int
    next_token: int
    next_kind: str
    target_ids: list[int]
    matches: list[bool]

    def emitted(self, draft_ids: Sequence[int]) -> list[int]:
        """The tokens this round emits: the accepted drafts of `draft_ids`, then the recovered or bonus token."""
        return list(draft_ids[: self.num_accepted]) + [self.next_token]


def _generator(generators: Generators, index: int, purpose: str) -> torch.Generator:
    """Resolve the generator for draw ``purpose`` at target row ``index``."""
    if generators is None:
        raise ValueError("sampling (greedy=False) needs generators; pass a factory or a Generator")
    if isinstance(generators, torch.Generator):
        return generators
    return generators(index, purpose)


def _prob_at(row: torch.Tensor, token: int) -> float:  # row: [V]
    """row[token], or 0 when the token lies beyond the row's width."""
    return float(row[token]) if 0 <= token < row.shape[-1] else 0.0


def _residual(p_row: torch.Tensor, q_row: torch.Tensor | None, token: int) -> torch.Tensor:
    """max(0, p - q) over p's width (q = delta_token when None); falls back to p if all zero."""
    residual = p_row.clone()
    if q_row is None:
        if 0 <= token < residual.shape[-1]:
            residual[token] = 0.0
    else:
        shared = min(q_row.shape[-1], residual.shape[-1])
        residual[:shared] = torch.clamp(residual[:shared] - q_row[:shared], min=0.0)
    return residual if float(residual.sum()) > 0.0 else p_row


def _first_rejection(draft, target_probs, draft_probs, generators) -> int:
    """Sampling accept test; returns m, the index of the first rejected draft (k if none)."""
    for i, token in enumerate(draft):
        p_d = _prob_at(target_probs[i], token)
        q_d = 1.0 if draft_probs is None else _prob_at(draft_probs[i], token)
        if q_d <= 0.0:
            raise ValueError(
                f"draft token {token} at position {i} has draft probability 0; "
                "draft_probs must be the distribution the draft sampled from"
            )
        u = torch.rand((), generator=_generator(generators, i, "accept"), dtype=UNIFORM_DTYPE)
        if not float(u) * q_d < p_d:  # accept with probability min(1, p_d / q_d)
            return i
    return len(draft)


def accept(
    draft_ids: torch.Tensor | Sequence[int],  # [k] int64, or the k ids as a list
    target_probs: torch.Tensor,  # [k+1, Vp] float32, p processed by logits_to_probs (greedy: any scores
    # with p's row argmax, e.g. sampling.penalised_scores)
    draft_probs: torch.Tensor | None = None,  # [k, Vq] float32 dense q, None = point mass
    generators: Generators = None,  # (row index, purpose) -> Generator, or one Generator
    greedy: bool = False,
    all_rows: bool = True,
) -> AcceptResult:
    """Reference accept rule for one round (see the module docstring for the exact rule).

    ``generators`` may be a factory ``(row_index, purpose) -> torch.Generator`` (normally
    ``sampling.round_generators(seed, context_len)``) or one Generator used sequentially;
    it may be None only when ``greedy``. ``all_rows=False`` returns the verdict only (see
    AcceptResult): the same m and next token, without the argmax of rows the rule did not read.
    """
    draft = (
        [int(t) for t in draft_ids.reshape(-1).tolist()]
        if isinstance(draft_ids, torch.Tensor)
        else [int(t) for t in draft_ids]
    )
    k = len(draft)
    if target_probs.dim() != 2 or target_probs.shape[0] != k + 1:
        raise ValueError(f"target_probs must be [k+1={k + 1}, V], got {tuple(target_probs.shape)}")
    if draft_probs is not None and (draft_probs.dim() != 2 or draft_probs.shape[0] != k):
        raise ValueError(f"draft_probs must be [k={k}, V], got {tuple(draft_probs.shape)}")
    if not all_rows:
        return _verdict(draft, target_probs, draft_probs, generators, greedy)
    target_ids = argmax_ids(target_probs)
    greedy_matches = [d == t for d, t in zip(draft, target_ids)]
    if greedy:
        m = greedy_matches.index(False) if False in greedy_matches else k
        next_token = target_ids[m]
    else:
        m, next_token = _sampled_verdict(draft, target_probs, draft_probs, generators)
    matches = [True] * m + [False] * (m < k) + greedy_matches[m + 1 :]
    return AcceptResult(m, next_token, BONUS if m == k else RECOVERED, target_ids, matches)


def _sampled_verdict(draft, target_probs, draft_probs, generators) -> tuple[int, int]:
    """Sampling: (m, the recovered or bonus token)."""
    k = len(draft)
    m = _first_rejection(draft, target_probs, draft_probs, generators)
    if m < k:
        q_row = None if draft_probs is None else draft_probs[m]
        residual = _residual(target_probs[m], q_row, draft[m])
        return m, sample(residual, _generator(generators, m, "recover"))
    return m, sample(target_probs[k], _generator(generators, k, "bonus"))


def _verdict(draft, target_probs, draft_probs, generators, greedy: bool) -> AcceptResult:
    """accept(..., all_rows=False): the rule's reads only (AcceptResult's verdict-only lists)."""
    k = len(draft)
    if greedy:
        target_ids = argmax_until_mismatch(target_probs, draft)
        m, next_token = len(target_ids) - 1, target_ids[-1]
    else:
        target_ids = []
        m, next_token = _sampled_verdict(draft, target_probs, draft_probs, generators)
    return AcceptResult(m, next_token, BONUS if m == k else RECOVERED, target_ids, [True] * m + [False] * (m < k))


# ----------------------------------------------------------------------------- batched


def _gather_at(probs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """probs[b, i, ids[b, i]] with 0 where ids fall outside the width. [B,k,V],[B,k] -> [B,k]."""
    inside = (ids >= 0) & (ids < probs.shape[-1])
    safe = torch.where(inside, ids, torch.zeros_like(ids))
    picked = torch.gather(probs[:, : ids.shape[1]], -1, safe.unsqueeze(-1)).squeeze(-1)
    return torch.where(inside, picked, torch.zeros_like(picked))


def _batch_residual(p_rows, draft_probs, draft_ids, m) -> torch.Tensor:
    """Residual rows [B, Vp] at row m (all-accepted rows keep p, which is the bonus)."""
    batch, k = draft_ids.shape
    rejected = m < k
    row = torch.clamp(m, max=max(k - 1, 0))
    q_rows = torch.zeros_like(p_rows)
    if k > 0 and draft_probs is None:
        token = draft_ids[torch.arange(batch), row]
        inside = rejected & (token >= 0) & (token < p_rows.shape[-1])
        q_rows[inside, token[inside]] = 1.0
    elif k > 0:
        shared = min(draft_probs.shape[-1], p_rows.shape[-1])
        q_rows[:, :shared] = draft_probs[torch.arange(batch), row, :shared].to(PROBS_DTYPE)
        q_rows[~rejected] = 0.0
    residual = torch.clamp(p_rows - q_rows, min=0.0)
    empty = residual.sum(dim=-1, keepdim=True) <= 0.0
    return torch.where(empty, p_rows, residual)


def accept_batch(
    draft_ids: torch.Tensor,  # [B, k] int64
    target_probs: torch.Tensor,  # [B, k+1, Vp] float32
    draft_probs: torch.Tensor | None,  # [B, k, Vq] float32 dense q, None = point mass
    generator: torch.Generator | None,  # one generator for every draw; None only if greedy
    greedy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # ([B] int64, [B, k+1] int64)
    """Vectorised twin of :func:`accept` (same rule, one generator, different draw order).

    Returns ``num_accepted`` [B] and ``out_tokens`` [B, k+1]: the m accepted drafts, then
    the recovered/bonus token, then ``PADDING_ID`` (-1). Agrees with :func:`accept` exactly
    when greedy and in distribution when sampling.
    """
    batch, k = draft_ids.shape
    rows = torch.arange(batch)
    if not greedy and generator is None:
        raise ValueError("sampling (greedy=False) needs an explicit torch.Generator")
    if greedy:
        accepted = draft_ids == argmax_rows(target_probs[:, :k])
    else:
        p_d = _gather_at(target_probs, draft_ids)
        q_d = torch.ones_like(p_d) if draft_probs is None else _gather_at(draft_probs, draft_ids)
        u = torch.rand(batch, k, generator=generator, dtype=UNIFORM_DTYPE)
        accepted = u * q_d.to(UNIFORM_DTYPE) < p_d.to(UNIFORM_DTYPE)
    m = accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)
    p_rows = target_probs[rows, m].to(PROBS_DTYPE)  # [B, Vp]
    if greedy:
        next_tokens = argmax_rows(p_rows)
    else:
        residual = _batch_residual(p_rows, draft_probs, draft_ids, m)
        next_tokens = torch.multinomial(residual, 1, generator=generator).squeeze(-1)
    positions = torch.arange(k + 1).unsqueeze(0)
    padded = torch.cat([draft_ids, torch.full((batch, 1), PADDING_ID)], dim=1)
    out = torch.where(positions < m.unsqueeze(1), padded, torch.full_like(padded, PADDING_ID))
    out[rows, m] = next_tokens
    return m, out
