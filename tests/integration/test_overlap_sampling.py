"""Overlapped rounds keep exactly the target's distribution: chi-square through the real engines.

The tiny 32-token Llama pair of test_sampling_engines (ModelDraft + TargetEngine, sparse q'). Rounds of
k = 1 are run as the orchestrator runs them with overlap (orchestrator/overlap.py): while a round
verifies, the draft drafts k + 1 tokens ahead from the round's context + its block (post-verify) and k tokens
behind its runner-up at position 1 (a branch); the next round uses a block only when `usable_block` says its
context is the accepted one. The engines are
synchronous here: overlapping in time does not change what is computed, only when.

The third generated token is where a block drafted ahead decides (round 1 accepted d1 and the bonus
was the draft's guess e1; round 2 verifies e2): its marginal and its joint with the second token are
compared with the exact distributions (enumerated) at significance ALPHA. Blocks drafted ahead whose
q' rows lie (uniform over their support, test_sampling_engines' lying draft, on the pre-drafted blocks
only) must be rejected by the same test: it has power on the overlapped path itself. At fixed seed the
overlapped rounds give the sequential rounds' tokens. (Not every slicing bug shows in a distribution:
rows off by one are refused by the accept rule, a drafted token outside its reported support; rows
dropped make the block a point mass, which is lossless, like an n-gram draft; the identity test
catches both.)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np
import pytest
import torch

from orchestrator.overlap import BlockBase, usable_block
from specdec.core.sampling import SamplingConfig, logits_to_probs
from specdec.engine.types import ProposeInput, SparseDist, VerifyInput
from tests.integration.test_sampling_engines import ALPHA, CFG, CONTEXT, DRAFT_NOISE, VOCAB, built_engines, pvalue
from tests.worker_pool import pool_map

pytestmark = pytest.mark.integration

K = 1
TOKENS = 3
# 3,000 sampled generations per test (each runs 2-3 rounds and a pre-draft per round: ~40 s on 2 quiet cores).
SAMPLES = 3_000
# A closer draft than test_sampling_engines' (DRAFT_NOISE): there d1 is rarely accepted at CONTEXT, so a block
# drafted ahead would hardly ever be used; at a fifth of the noise about one generation in five uses one.
NOISE = DRAFT_NOISE / 5
IDENTITY_SEEDS = 200
Slicer = Callable[[Sequence, int, int], list]


def aligned(rows: Sequence, skip: int, n: int) -> list:
    """The block's q' rows: e2..e(n+1) after a post-verify guess (skip 1: row 0 is the draft's guess of the
    bonus), the first n of a branch's block (skip 0)."""
    return list(rows[skip : skip + n])


def lying(rows: Sequence, skip: int, n: int) -> list:
    """A broken variant: the block's q' rows reported uniform over their support."""
    return [SparseDist(list(r.token_ids), [1.0 / len(r.token_ids)] * len(r.token_ids)) for r in rows[skip : skip + n]]


def drafted_ahead(draft, context: list[int], ids: list[int], runner_ups: list[int], cfg: SamplingConfig) -> list:
    """The round's candidate blocks as the orchestrator drafts them while it verifies: post-verify (behind the
    whole block) and the branch behind the draft's runner-up at position 1: (base, guess, ProposeOutput)."""
    blocks = [(BlockBase.of(context, ids), None, draft.propose(ProposeInput("s", context + ids, K + 1, cfg)))]
    if runner_ups:
        guess = runner_ups[0]
        blocks.append((BlockBase.of(context, []), guess, draft.propose(ProposeInput("s", context + [guess], K, cfg))))
    return blocks


def take_block(ahead: list, context: list[int], q_rows: Slicer, stats: dict | None) -> tuple[list, list]:
    """The block (ids, q' rows) a round from `context` uses, as overlap.take slices it, or ([], [])."""
    for base, guess, pre in ahead:
        n = usable_block(base, pre.draft_ids, context, K, guess)
        if n:
            skip = 1 if guess is None else 0
            if stats is not None:
                stats["used"] += 1
                stats["runner_up"] += guess is not None
            return list(pre.draft_ids[skip : skip + n]), q_rows(pre.draft_probs, skip, n)
    return [], []


@pytest.fixture(scope="module")
def engines():
    return built_engines(NOISE)


def generate(
    target, draft, cfg: SamplingConfig, overlap: bool, q_rows: Slicer = aligned, stats: dict | None = None
) -> list[int]:
    """TOKENS tokens by k = K rounds, sequential or overlapped (see the module docstring)."""
    context, out, ahead = list(CONTEXT), [], []
    while len(out) < TOKENS:
        ids, probs = take_block(ahead, context, q_rows, stats)
        runner_ups = []
        if not ids:
            prop = draft.propose(ProposeInput("s", list(context), K, cfg, runner_up=overlap))
            ids, probs, runner_ups = list(prop.draft_ids), list(prop.draft_probs), prop.runner_up_ids
        ahead = drafted_ahead(draft, context, ids, runner_ups, cfg) if overlap else []
        r = target.verify(VerifyInput("s", list(context), ids, cfg, probs)).result
        emitted = r.emitted(ids)
        context, out = context + emitted, out + emitted
    return out[:TOKENS]


def exact_joint(model, cfg: SamplingConfig) -> np.ndarray:
    """p(t1, t2, t3) by enumeration: [V, V, V]."""
    with torch.inference_mode():
        p1 = logits_to_probs(model(torch.tensor([CONTEXT])).logits[0, -1:], cfg)[0]
        p2 = logits_to_probs(model(torch.tensor([CONTEXT + [a] for a in range(VOCAB)])).logits[:, -1], cfg)
        pairs = torch.tensor([CONTEXT + [a, b] for a in range(VOCAB) for b in range(VOCAB)])
        p3 = logits_to_probs(model(pairs).logits[:, -1], cfg).reshape(VOCAB, VOCAB, VOCAB)
    return (p1[:, None, None] * p2[:, :, None] * p3).numpy().astype(np.float64)


def overlapped_sample(q_rows: Slicer, seed: int) -> tuple[list[int], int]:
    """(the seeded overlapped generation's tokens, blocks drafted ahead it used)."""
    target, draft, _ = built_engines(NOISE)
    used = {"used": 0, "runner_up": 0}
    return generate(target, draft, SamplingConfig(seed=seed, **CFG), True, q_rows, used), used


def both_ways(seed: int) -> tuple[list[int], list[int]]:
    """The seeded generation overlapped and sequential."""
    target, draft, _ = built_engines(NOISE)
    cfg = SamplingConfig(seed=seed, **CFG)
    return generate(target, draft, cfg, True), generate(target, draft, cfg, False)


def sample_counts(q_rows: Slicer, stats: dict) -> np.ndarray:
    """Counts of the three tokens over SAMPLES seeds, on both cores (tests/worker_pool.py); stats["used"] adds
    up the blocks drafted ahead that the generations used."""
    counts = np.zeros((VOCAB, VOCAB, VOCAB), dtype=np.int64)
    for (t1, t2, t3), used in pool_map(functools.partial(overlapped_sample, q_rows), range(SAMPLES)):
        counts[t1, t2, t3] += 1
        for key, value in used.items():
            stats[key] += value
    return counts


def test_overlapped_rounds_preserve_the_target_distribution(engines):
    _, _, model = engines
    joint = exact_joint(model, SamplingConfig(seed=0, **CFG))
    stats = {"used": 0, "runner_up": 0}
    counts = sample_counts(aligned, stats)
    pv = [pvalue(counts.sum((0, 1)), joint.sum((0, 1))), pvalue(counts.sum(0), joint.sum(0))]
    print(f"\npre-drafted blocks used: {stats} in {SAMPLES} generations; p-values third/second+third: {pv}")
    assert stats["used"] > SAMPLES // 10  # the path under test ran often
    # ... and the branch behind the runner-up (measured 57 of 827: with this close draft a recovery drawn from
    # max(0, p - q) is seldom q's runner-up; the fixed-seed identity test below checks that path token for token)
    assert stats["runner_up"] > SAMPLES // 100
    assert min(pv) > ALPHA


def test_blocks_drafted_ahead_with_lying_draft_rows_are_detected(engines):
    _, _, model = engines
    joint = exact_joint(model, SamplingConfig(seed=0, **CFG))
    counts = sample_counts(lying, {"used": 0, "runner_up": 0})
    assert min(pvalue(counts.sum((0, 1)), joint.sum((0, 1))), pvalue(counts.sum(0), joint.sum(0))) < ALPHA


def test_overlapped_rounds_give_the_sequential_tokens_at_fixed_seed():
    for seed, (overlapped, sequential) in enumerate(pool_map(both_ways, range(IDENTITY_SEEDS))):
        assert overlapped == sequential, seed
