"""Statistical proof that speculative sampling preserves the target distribution p exactly.

Setup: a tiny bigram "language model" for the target (p) and a different one for the draft
(q), both processed by ``logits_to_probs`` with the same config (temperature, top-k, top-p,
so p has exact zeros). The draft samples from its sparse top-N distribution q'. Rounds of
draft -> accept are simulated for NUM_SAMPLES independent sequences until each has at least
OUTPUT_LEN tokens; the first output token, the second (often produced by a later round) and
their joint are compared with the exact target probabilities by a chi-square test at
significance ALPHA. Deliberately broken accept rules must be REJECTED by the same test.
All randomness comes from explicit generators.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from scipy import stats

from specdec.core.accept import PADDING_ID, accept, accept_batch
from specdec.core.sampling import (
    SamplingConfig,
    logits_to_probs,
    round_generators,
    sparse_to_dense,
    truncate_top_n,
)

VOCAB = 16
K = 3
DRAFT_TOP_N = 6
NUM_SAMPLES = 40_000
SCALAR_SAMPLES = 20_000
OUTPUT_LEN = 2
PROMPT_TOKEN = 0
PROMPT_LEN = 1
ALPHA = 1e-3
MIN_EXPECTED = 5.0
LOGIT_SCALE = 1.0
NARROW_DRAFT_WIDTH = VOCAB - 3
TARGET_SEED, DRAFT_SEED, SIM_SEED = 11, 22, 33
CFG = SamplingConfig(temperature=0.9, top_k=12, top_p=0.95, draft_top_n=DRAFT_TOP_N).validate()

AcceptFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


@pytest.fixture(scope="module", autouse=True)
def _single_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _bigram(seed: int, width: int = VOCAB) -> torch.Tensor:  # -> [VOCAB, width]
    """Row a = processed next-token distribution after token a."""
    gen = torch.Generator().manual_seed(seed)
    logits = LOGIT_SCALE * torch.randn(VOCAB, width, generator=gen)
    return logits_to_probs(logits, CFG)


@pytest.fixture(scope="module")
def target() -> torch.Tensor:  # [V, V] p
    return _bigram(TARGET_SEED)


def _draft_qprime(width: int = VOCAB) -> torch.Tensor:  # [V, width] dense q'
    ids, probs = truncate_top_n(_bigram(DRAFT_SEED, width), DRAFT_TOP_N)
    return sparse_to_dense(ids, probs, width)


# ----------------------------------------------------------------------------- simulation


def _draft_round(last, qprime, point_map, gen):  # last: [B] -> ([B, K], [B, K] previous ids)
    """The draft proposes K tokens: sampled from q' (rows by previous token) or a point map."""
    prev, drafted = last, []
    for _ in range(K):
        prev = torch.multinomial(qprime[prev], 1, generator=gen).squeeze(-1) if point_map is None else point_map[prev]
        drafted.append(prev)
    draft_ids = torch.stack(drafted, dim=1)
    return draft_ids, torch.cat([last.unsqueeze(1), draft_ids[:, :-1]], dim=1)


def simulate(accept_fn: AcceptFn, target, qprime=None, point_map=None, n=NUM_SAMPLES, accept_q=None):
    """Run speculative rounds until every sequence has OUTPUT_LEN tokens; returns [n, OUTPUT_LEN].

    The draft samples from ``qprime`` (or follows ``point_map``); the accept rule is shown
    ``accept_q`` (default: the same ``qprime``, as it must be).
    """
    accept_q = qprime if accept_q is None else accept_q
    gen = torch.Generator().manual_seed(SIM_SEED)
    rows = torch.arange(n)
    buf = torch.full((n, OUTPUT_LEN + K + 1), PADDING_ID, dtype=torch.int64)
    lengths = torch.zeros(n, dtype=torch.int64)
    last = torch.full((n,), PROMPT_TOKEN, dtype=torch.int64)
    while int(lengths.min()) < OUTPUT_LEN:
        draft_ids, prevs = _draft_round(last, qprime, point_map, gen)
        draft_probs = None if point_map is not None else accept_q[prevs]  # [n, K, Vq]
        target_probs = target[torch.cat([last.unsqueeze(1), draft_ids], dim=1)]  # [n, K+1, V]
        m, out = accept_fn(draft_ids, target_probs, draft_probs, gen, lengths=lengths)
        cols = lengths.unsqueeze(1) + torch.arange(K + 1)
        valid = (torch.arange(K + 1) <= m.unsqueeze(1)) & (cols < buf.shape[1])
        buf[rows.unsqueeze(1).expand_as(cols)[valid], cols[valid]] = out[valid]
        last = out[rows, m]
        lengths = lengths + m + 1
    return buf[:, :OUTPUT_LEN]


def batched(draft_ids, target_probs, draft_probs, gen, lengths):
    return accept_batch(draft_ids, target_probs, draft_probs, gen)


def scalar_reference(draft_ids, target_probs, draft_probs, gen, lengths):
    """The scalar ``accept`` per sequence with production position-keyed generators."""
    ms, outs = [], []
    for b in range(draft_ids.shape[0]):
        q = None if draft_probs is None else draft_probs[b]
        gens = round_generators(seed=b, first_position=PROMPT_LEN + int(lengths[b]))
        res = accept(draft_ids[b], target_probs[b], q, gens)
        out = draft_ids[b, : res.num_accepted].tolist() + [res.next_token]
        outs.append(out + [PADDING_ID] * (K + 1 - len(out)))
        ms.append(res.num_accepted)
    return torch.tensor(ms), torch.tensor(outs)


def broken_always_accept(draft_ids, target_probs, draft_probs, gen, lengths):
    """BROKEN: keeps every draft token, then a bonus from p."""
    bonus = torch.multinomial(target_probs[:, K], 1, generator=gen)
    return torch.full((draft_ids.shape[0],), K), torch.cat([draft_ids, bonus], dim=1)


def broken_resample_from_p(draft_ids, target_probs, draft_probs, gen, lengths):
    """BROKEN: correct accept test, but the recovered token is drawn from p, not the residual."""
    m, out = accept_batch(draft_ids, target_probs, draft_probs, gen)
    rejected = m < K
    rows = torch.arange(draft_ids.shape[0])
    resampled = torch.multinomial(target_probs[rows, m], 1, generator=gen).squeeze(-1)
    out[rows[rejected], m[rejected]] = resampled[rejected]
    return m, out


# ----------------------------------------------------------------------------- chi-square


def _merge_small_bins(observed: np.ndarray, expected: np.ndarray):
    """Pool bins with expected < MIN_EXPECTED (and the smallest kept bin if still too small)."""
    small = expected < MIN_EXPECTED
    obs, exp = list(observed[~small]), list(expected[~small])
    if small.any():
        pooled_obs, pooled_exp = observed[small].sum(), expected[small].sum()
        if pooled_exp < MIN_EXPECTED and exp:
            i = int(np.argmin(exp))
            pooled_obs, pooled_exp = pooled_obs + obs.pop(i), pooled_exp + exp.pop(i)
        obs.append(pooled_obs)
        exp.append(pooled_exp)
    return np.asarray(obs, dtype=np.float64), np.asarray(exp, dtype=np.float64)


def chi_square_pvalue(tokens: np.ndarray, probs: np.ndarray) -> float:
    """p-value of 'tokens (flat bin indices) ~ probs'; 0.0 if a probability-0 bin is hit."""
    observed = np.bincount(tokens, minlength=probs.size).astype(np.float64)
    if observed[probs == 0].sum() > 0:
        return 0.0  # a token the target can never produce: certainly not p
    expected = probs[probs > 0] * tokens.size
    obs, exp = _merge_small_bins(observed[probs > 0], expected)
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def exact_distributions(target: torch.Tensor) -> dict[str, np.ndarray]:
    """Exact target-alone probabilities of token 1, token 2 and the pair (flattened)."""
    p = target.to(torch.float64).numpy()
    first = p[PROMPT_TOKEN]
    joint = first[:, None] * p
    return {"first": first, "second": joint.sum(axis=0), "joint": joint.reshape(-1)}


def pvalues(tokens: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """Chi-square p-values for the first token, the second token and their joint."""
    assert int(tokens.min()) >= 0, "every sequence must have OUTPUT_LEN tokens"
    t = tokens.numpy()
    exact = exact_distributions(target)
    observed = {"first": t[:, 0], "second": t[:, 1], "joint": t[:, 0] * VOCAB + t[:, 1]}
    return {name: chi_square_pvalue(observed[name], exact[name]) for name in exact}


# ----------------------------------------------------------------------------- tests


def test_target_alone_passes_sanity(target):
    """The chi-square machinery accepts genuine samples of the target (control)."""
    gen = torch.Generator().manual_seed(SIM_SEED)
    first = torch.multinomial(target[PROMPT_TOKEN].expand(NUM_SAMPLES, -1), 1, generator=gen)
    second = torch.multinomial(target[first.squeeze(-1)], 1, generator=gen)
    result = pvalues(torch.cat([first, second], dim=1), target)
    assert min(result.values()) > ALPHA, result


def test_sampled_sparse_draft_preserves_target(target):
    """Draft samples from sparse top-N q'; the output follows p exactly."""
    tokens = simulate(batched, target, qprime=_draft_qprime())
    result = pvalues(tokens, target)
    assert min(result.values()) > ALPHA, result


def test_narrower_draft_vocabulary_preserves_target(target):
    """Draft width < target width: p beyond the draft's vocabulary is still reachable."""
    tokens = simulate(batched, target, qprime=_draft_qprime(NARROW_DRAFT_WIDTH))
    result = pvalues(tokens, target)
    assert min(result.values()) > ALPHA, result
    assert int((tokens >= NARROW_DRAFT_WIDTH).sum()) > 0


def test_point_mass_draft_preserves_target(target):
    """n-gram / greedy drafts (draft_probs=None, q = delta_d) also preserve p."""
    point_map = torch.argmax(_bigram(DRAFT_SEED), dim=-1)  # greedy draft: deterministic
    tokens = simulate(batched, target, point_map=point_map)
    result = pvalues(tokens, target)
    assert min(result.values()) > ALPHA, result


def test_scalar_reference_preserves_target(target):
    """The scalar reference ``accept`` (per-position generators) agrees in distribution."""
    tokens = simulate(scalar_reference, target, qprime=_draft_qprime(), n=SCALAR_SAMPLES)
    result = pvalues(tokens, target)
    assert min(result.values()) > ALPHA, result


def test_scalar_reference_point_mass_preserves_target(target):
    point_map = torch.argmax(_bigram(DRAFT_SEED), dim=-1)
    tokens = simulate(scalar_reference, target, point_map=point_map, n=SCALAR_SAMPLES)
    result = pvalues(tokens, target)
    assert min(result.values()) > ALPHA, result


@pytest.mark.parametrize("broken", [broken_always_accept, broken_resample_from_p])
def test_broken_accept_rules_are_rejected(target, broken):
    """The test has power: wrong rules give p-values far below ALPHA."""
    tokens = simulate(broken, target, qprime=_draft_qprime())
    assert min(pvalues(tokens, target).values()) < ALPHA


def test_accept_shown_full_q_instead_of_qprime_is_rejected(target):
    """BROKEN wiring: the draft sampled from top-N q' but the accept rule saw the full q."""
    tokens = simulate(batched, target, qprime=_draft_qprime(), accept_q=_bigram(DRAFT_SEED))
    assert min(pvalues(tokens, target).values()) < ALPHA


def test_broken_point_mass_residual_is_rejected(target):
    """Point mass: recovering from p (d not removed) is detected too."""
    point_map = torch.argmax(_bigram(DRAFT_SEED), dim=-1)
    tokens = simulate(broken_resample_from_p, target, point_map=point_map)
    assert min(pvalues(tokens, target).values()) < ALPHA
