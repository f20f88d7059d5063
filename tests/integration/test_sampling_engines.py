"""Lossless sampling through the real engines (draft ModelDraft + TargetEngine, sparse q').

A tiny Llama pair with a 32-token vocabulary: the draft is a perturbed copy of
the target. For 10,000 seeds, one speculative round (k=2) is run through the
engines exactly as the services run it; the first two generated tokens are
compared with the target's exact distributions (computed by enumerating the
vocabulary) by chi-square tests at significance 1e-3. A broken draft report
(claiming q' is uniform over its support) must be rejected by the same test.
Also: same seed -> same tokens, different seeds differ, temperature -> 0 and
top_k = 1 reproduce greedy, bad values are refused.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from scipy import stats
from transformers import LlamaConfig, LlamaForCausalLM

from specdec.core.sampling import SamplingConfig, logits_to_probs
from specdec.engine.draft import ModelDraft, NgramDraft
from specdec.engine.kvcache import KVCachePool, kv_bytes_per_token
from specdec.engine.target import TargetEngine
from specdec.engine.torch_runner import CausalLMRunner
from specdec.engine.types import ProposeInput, SparseDist, VerifyInput
from specdec.errors import InvalidArgument
from specdec.params import resolve_sampling
from specdec.v1 import common_pb2
from tests.worker_pool import pool_map

# 10,000 rounds per test (~30 s on 2 cores): the lying draft below is still rejected with p < 1e-300
# (measured), far past ALPHA; 20,000 took 66 s, over the suite's 60 s budget for one test.
VOCAB, K, SAMPLES, ALPHA, MIN_EXPECTED = 32, 2, 10_000, 1e-3, 5.0
LIE_SAMPLES = 4_000  # a lie this size is rejected far below ALPHA with fewer samples (p printed by the test)
WEIGHT_SCALE, DRAFT_NOISE = 5.0, 0.015
CONTEXT = [3, 7, 1, 9]
CFG = dict(temperature=0.9, top_k=0, top_p=0.95, draft_top_n=8)


def tiny(seed: int, noise: float = 0.0):
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(WEIGHT_SCALE)  # peaked, not flat, distributions
                if noise:
                    p.add_(torch.randn_like(p) * noise)
    return model


def runner(model):
    per = kv_bytes_per_token(model.config, 4)
    return CausalLMRunner(model, KVCachePool(1 << 26, per, model.config))


@functools.cache
def built_engines(noise: float = DRAFT_NOISE):
    """(target engine, draft engine, target model) over tiny(0) and tiny(0, noise): built once per process, the
    same in every process (the pool's workers build their own: tests/worker_pool.py)."""
    target_model, draft_model = tiny(0), tiny(0, noise=noise)
    target = TargetEngine(runner(target_model), max_context=64, max_k=8)
    draft = ModelDraft(runner(draft_model), max_context=64, eos_ids=[])
    return target, draft, target_model


@pytest.fixture(scope="module")
def engines():
    return built_engines(DRAFT_NOISE)


def speculative_round(target, draft, cfg: SamplingConfig, session: str = "s", q_override=None):
    prop = draft.propose(ProposeInput(session, list(CONTEXT), K, cfg))
    q = q_override(prop.draft_probs) if q_override else prop.draft_probs
    out = target.verify(VerifyInput(session, list(CONTEXT), prop.draft_ids, cfg, q))
    r = out.result
    return (prop.draft_ids[: r.num_accepted] + [r.next_token])[:2]


def exact_target(model, cfg: SamplingConfig):
    """p(t1) and p(t1, t2) by enumeration."""
    with torch.inference_mode():
        p1 = logits_to_probs(model(torch.tensor([CONTEXT])).logits[0, -1:], cfg)[0]
        batch = torch.tensor([CONTEXT + [t] for t in range(VOCAB)])
        p2 = logits_to_probs(model(batch).logits[:, -1], cfg)  # [V, V]: row t1 -> p(t2 | t1)
    return p1.numpy().astype(np.float64), (p1[:, None] * p2).numpy().astype(np.float64)


def pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs.reshape(-1) * counts.sum()
    observed = counts.reshape(-1).astype(np.float64)
    if observed[expected == 0].sum() > 0:
        return 0.0
    keep = expected >= MIN_EXPECTED
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def uniform_rows(rows):
    """A lying draft report: q' uniform over each row's support instead of what the draft sampled from."""
    return [SparseDist(r.token_ids, [1.0 / len(r.token_ids)] * len(r.token_ids)) for r in rows]


def first_two(q_override, seed: int) -> tuple[int, int]:
    """The first two tokens of the seeded generation (one k = 2 round, and the next round's token if needed)."""
    target, draft, _ = built_engines(DRAFT_NOISE)
    cfg = SamplingConfig(seed=seed, **CFG)
    toks = speculative_round(target, draft, cfg, q_override=q_override)
    if len(toks) < 2:  # first token rejected: the second comes from the next round
        toks = toks + [target.verify(VerifyInput("s2", list(CONTEXT) + toks, [], cfg)).result.next_token]
    return toks[0], toks[1]


def sample_pairs(q_override=None, samples: int = SAMPLES) -> np.ndarray:
    """Counts of the first two tokens over `samples` seeds, on both cores (tests/worker_pool.py)."""
    out = np.zeros((VOCAB, VOCAB), dtype=np.int64)
    for t1, t2 in pool_map(functools.partial(first_two, q_override), range(samples)):
        out[t1, t2] += 1
    return out


def test_engines_preserve_the_target_distribution(engines):
    _, _, model = engines
    p1, joint = exact_target(model, SamplingConfig(seed=0, **CFG))
    counts = sample_pairs()
    pv = [pvalue(counts.sum(1), p1), pvalue(counts.sum(0), joint.sum(0)), pvalue(counts, joint)]
    print(f"\np-values first/second/joint: {pv}")
    assert min(pv) > ALPHA


def test_a_lying_draft_report_is_detected(engines):
    """If the draft reported a uniform q' over its support instead of what it sampled from,
    the output would no longer follow p: the same test must reject it."""
    _, _, model = engines
    p1, joint = exact_target(model, SamplingConfig(seed=0, **CFG))
    counts = sample_pairs(q_override=uniform_rows, samples=LIE_SAMPLES)
    pv = min(pvalue(counts.sum(1), p1), pvalue(counts, joint))
    print(f"\nlying draft: p-value {pv:.3g} from {LIE_SAMPLES} samples")
    assert pv < ALPHA


def test_same_seed_same_tokens_different_seeds_differ(engines):
    target, draft, _ = engines
    a = [speculative_round(target, draft, SamplingConfig(seed=s, **CFG)) for s in range(20)]
    b = [speculative_round(target, draft, SamplingConfig(seed=s, **CFG)) for s in range(20)]
    assert a == b
    assert len({tuple(x) for x in a}) > 3


def test_low_temperature_and_top_k_1_reproduce_greedy(engines):
    target, draft, _ = engines
    greedy = speculative_round(target, draft, SamplingConfig())
    assert speculative_round(target, draft, SamplingConfig(temperature=1e-6, seed=5)) == greedy
    assert speculative_round(target, draft, SamplingConfig(temperature=0.8, top_k=1, seed=5)) == greedy


NGRAM_CONTEXT = [3, 7, 1, 3, 7]  # "3 7" repeats: proposes [1, 3]


def ngram_first(seed: int) -> tuple[list[int], int]:
    """(the n-gram's block and its number of q' rows, the first token the target emits) for the seed."""
    target, _, _ = built_engines(DRAFT_NOISE)
    cfg = SamplingConfig(seed=seed, **CFG)
    prop = NgramDraft(1, 3).propose(ProposeInput("n", NGRAM_CONTEXT, K, cfg))
    r = target.verify(VerifyInput("n", NGRAM_CONTEXT, prop.draft_ids, cfg)).result
    return prop.draft_ids + [len(prop.draft_probs)], (prop.draft_ids[: r.num_accepted] + [r.next_token])[0]


def test_ngram_point_mass_through_the_target_engine(engines):
    _, _, model = engines
    cfg0 = SamplingConfig(seed=0, **CFG)
    with torch.inference_mode():
        p1 = logits_to_probs(model(torch.tensor([NGRAM_CONTEXT])).logits[0, -1:], cfg0)[0].numpy().astype(np.float64)
    counts = np.zeros(VOCAB, dtype=np.int64)
    for proposed, token in pool_map(ngram_first, range(SAMPLES)):
        assert proposed == [1, 3, 0]  # the n-gram's block, with no q' rows
        counts[token] += 1
    assert pvalue(counts, p1) > ALPHA


@pytest.mark.parametrize(
    "field,value,word",
    [
        ("temperature", -0.5, "temperature"),
        ("top_p", 0.0, "top_p"),
        ("top_p", 1.5, "top_p"),
        ("top_k", -1, "top_k"),
        ("draft_top_n", 0, "draft_top_n"),
    ],
)
def test_bad_sampling_values_are_invalid_argument(field, value, word):
    msg = common_pb2.SamplingParams(**{field: value})
    with pytest.raises(InvalidArgument, match=word):
        resolve_sampling(msg)
