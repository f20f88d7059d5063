"""Unit tests of the accept rule (draft / target, accepted / recovered / bonus).

p is the target distribution, q the draft distribution. EOS is an ordinary token for the
accept rule: the caller truncates the output after it.
"""

from __future__ import annotations

import pytest
import torch

from specdec.core.accept import BONUS, PADDING_ID, RECOVERED, _residual, accept, accept_batch
from specdec.core.sampling import (
    SamplingConfig,
    draw_generator,
    logits_to_probs,
    round_generators,
    sample,
)

VOCAB = 12
EOS_ID = 2
SEED = 1234
FIRST_POSITION = 40
TINY_TEMPERATURE = 1e-3
NUM_RANDOM_CASES = 200
NUM_TRIALS = 200
MAX_K = 5
NOISE = 0.7


def one_hot_rows(ids: list[int], width: int = VOCAB) -> torch.Tensor:  # -> [len(ids), width]
    """Greedy target probabilities whose argmax at row i is ids[i]."""
    return torch.nn.functional.one_hot(torch.tensor(ids), width).to(torch.float32)


def gens(seed: int = SEED):
    return round_generators(seed, FIRST_POSITION)


# ----------------------------------------------------------------------------- greedy


def test_greedy_perfect_match_gives_bonus():
    res = accept(torch.tensor([3, 4, 5]), one_hot_rows([3, 4, 5, 6]), greedy=True)
    assert (res.num_accepted, res.next_token, res.next_kind) == (3, 6, BONUS)
    assert res.matches == [True, True, True]
    assert res.target_ids == [3, 4, 5, 6]
    assert res.emitted([3, 4, 5]) == [3, 4, 5, 6]  # every draft + the bonus


def test_draft_ids_as_a_list_or_a_tensor_give_the_same_round():
    gen = torch.Generator().manual_seed(11)
    p = torch.softmax(torch.randn(4, 9, generator=gen), dim=-1)
    draft = p[:3].argmax(dim=-1).tolist()[:2] + [0]
    for greedy in (True, False):
        make = (lambda: None) if greedy else (lambda: torch.Generator().manual_seed(5))
        assert accept(draft, p, None, make(), greedy=greedy) == accept(
            torch.tensor(draft), p, None, make(), greedy=greedy
        )


def test_greedy_early_mismatch_gives_recovered():
    res = accept(torch.tensor([3, 9, 5]), one_hot_rows([3, 4, 5, 6]), greedy=True)
    assert (res.num_accepted, res.next_token, res.next_kind) == (1, 4, RECOVERED)
    # position 3 was never tested: matches reports the greedy comparison (5 == 5)
    assert res.matches == [True, False, True]
    assert res.emitted([3, 9, 5]) == [3, 4] and res.emitted((3, 9, 5)) == [3, 4]  # accepted drafts + recovered


def test_greedy_all_rejected():
    res = accept(torch.tensor([1, 1, 1]), one_hot_rows([3, 4, 5, 6]), greedy=True)
    assert (res.num_accepted, res.next_token, res.next_kind) == (0, 3, RECOVERED)
    assert res.matches == [False, False, False]


def test_greedy_empty_draft_gives_bonus_from_first_row():
    res = accept(torch.tensor([], dtype=torch.int64), one_hot_rows([7]), greedy=True)
    assert (res.num_accepted, res.next_token, res.next_kind) == (0, 7, BONUS)
    assert res.matches == [] and res.target_ids == [7]


def test_eos_inside_draft_is_an_ordinary_token():
    """The accept rule does not stop at EOS; the caller truncates after it."""
    res = accept(torch.tensor([5, EOS_ID, 7]), one_hot_rows([5, EOS_ID, 7, 8]), greedy=True)
    assert (res.num_accepted, res.next_token) == (3, 8)


def test_greedy_draft_id_beyond_target_width_is_rejected():
    res = accept(torch.tensor([VOCAB + 1]), one_hot_rows([3, 4]), greedy=True)
    assert (res.num_accepted, res.next_token) == (0, 3)


# ----------------------------------------------------------------------------- sampling


def test_sampling_empty_draft_samples_bonus_with_bonus_generator():
    p = torch.softmax(torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(0)), -1)
    res = accept(torch.tensor([], dtype=torch.int64), p, None, gens())
    expected = sample(p[0], draw_generator(SEED, FIRST_POSITION, "bonus"))
    assert (res.num_accepted, res.next_token, res.next_kind) == (0, expected, BONUS)


def test_sampling_requires_generators():
    with pytest.raises(ValueError, match="generators"):
        accept(torch.tensor([1]), one_hot_rows([1, 2]), None, None, greedy=False)


def test_shape_errors_are_clear():
    with pytest.raises(ValueError, match="k\\+1"):
        accept(torch.tensor([1, 2]), one_hot_rows([1, 2]), greedy=True)
    with pytest.raises(ValueError, match="draft_probs"):
        accept(torch.tensor([1]), one_hot_rows([1, 2]), one_hot_rows([1, 2]), gens())


def test_draft_token_with_zero_draft_probability_is_an_error():
    with pytest.raises(ValueError, match="draft probability 0"):
        accept(torch.tensor([1]), one_hot_rows([1, 2]), one_hot_rows([3]), gens())


def test_recovered_uses_recover_generator_and_residual():
    """p(d) = 0 forces a rejection at row 0; the recovered draw is reproducible."""
    p = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25] * 4])
    q = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    res = accept(torch.tensor([0]), p, q, gens())
    residual = torch.tensor([0.0, 0.0, 0.5, 0.0])  # max(0, p - q)
    expected = sample(residual, draw_generator(SEED, FIRST_POSITION, "recover"))
    assert (res.num_accepted, res.next_token, res.next_kind) == (0, expected, RECOVERED)
    assert res.next_token == 2


def test_same_generators_same_result_different_seed_can_differ():
    gen = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(4, VOCAB, generator=gen), -1)
    q = torch.softmax(torch.randn(3, VOCAB, generator=gen), -1)
    d = torch.tensor([0, 1, 2])
    assert accept(d, p, q, gens(SEED)) == accept(d, p, q, gens(SEED))
    outcomes = {(r.num_accepted, r.next_token) for r in (accept(d, p, q, gens(seed)) for seed in range(NUM_TRIALS))}
    assert len(outcomes) > 1


def test_point_mass_accepts_with_probability_p_of_d():
    """draft_probs=None: p(d)=1 always accepted, p(d)=0 never; residual removes d."""
    certain = accept(torch.tensor([4, 5]), one_hot_rows([4, 5, 6]), None, gens())
    assert (certain.num_accepted, certain.next_token) == (2, 6)
    half = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25] * 4])
    outcomes = [accept(torch.tensor([1]), half, None, gens(seed)) for seed in range(NUM_TRIALS)]
    rejected = [r for r in outcomes if r.num_accepted == 0]
    assert 0 < len(rejected) < NUM_TRIALS
    assert all(r.next_token == 2 for r in rejected)  # d=1 removed from the residual
    never = accept(torch.tensor([0]), half, None, gens())
    assert never.num_accepted == 0 and never.next_token in (1, 2)


def test_residual_all_zero_falls_back_to_p():
    p = torch.tensor([0.5, 0.5, 0.0])
    assert torch.equal(_residual(p, p.clone(), 0), p)
    assert torch.equal(_residual(torch.tensor([1.0, 0.0]), None, 0), torch.tensor([1.0, 0.0]))


def test_differing_widths_target_wider_than_draft():
    """q is 0 beyond its width; p's mass there is reachable only through the residual."""
    wide, narrow = VOCAB, VOCAB - 2
    p = torch.zeros(2, wide)
    p[0, 1], p[0, wide - 1] = 0.5, 0.5
    p[1, 0] = 1.0
    q = torch.zeros(1, narrow)
    q[0, 1] = 1.0
    outcomes = [accept(torch.tensor([1]), p, q, gens(seed)) for seed in range(NUM_TRIALS)]
    rejected = [r for r in outcomes if r.num_accepted == 0]
    assert 0 < len(rejected) < NUM_TRIALS
    assert all(r.next_token == wide - 1 for r in rejected)


def test_differing_widths_draft_wider_than_target():
    """A draft id beyond the target's width has p = 0: always rejected, residual = p."""
    p = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    q = torch.zeros(1, VOCAB)
    q[0, VOCAB - 1] = 1.0
    res = accept(torch.tensor([VOCAB - 1]), p, q, gens())
    assert (res.num_accepted, res.next_token) == (0, 1)
    m, out = accept_batch(torch.tensor([[VOCAB - 1]]), p.unsqueeze(0), q.unsqueeze(0), torch.Generator().manual_seed(0))
    assert m.tolist() == [0] and out.tolist() == [[1, PADDING_ID]]


def _random_round(gen: torch.Generator, k: int, temperature: float):
    """Target and draft processed with the same config; the draft's own greedy picks."""
    cfg = SamplingConfig(temperature=temperature)
    target_logits = torch.randn(k + 1, VOCAB, generator=gen)
    draft_logits = target_logits[:k] + NOISE * torch.randn(k, VOCAB, generator=gen)
    q = logits_to_probs(draft_logits, cfg)
    return torch.argmax(q, dim=-1), logits_to_probs(target_logits, cfg), q


def test_sampling_with_tiny_temperature_equals_greedy():
    gen = torch.Generator().manual_seed(2)
    seen_rejection = False
    for case in range(NUM_RANDOM_CASES):
        k = case % (MAX_K + 1)
        d, p, q = _random_round(gen, k, TINY_TEMPERATURE)
        sampled = accept(d, p, q, gens(case))
        greedy = accept(d, p, greedy=True)
        assert sampled.num_accepted == greedy.num_accepted
        assert sampled.next_token == greedy.next_token
        seen_rejection |= greedy.num_accepted < k
    assert seen_rejection


def test_batched_greedy_equals_scalar_exactly():
    gen = torch.Generator().manual_seed(3)
    for k in range(MAX_K + 1):
        batch = [_random_round(gen, k, 0.0) for _ in range(NUM_RANDOM_CASES // MAX_K)]
        d = torch.stack([b[0] for b in batch]).reshape(len(batch), k)
        p = torch.stack([b[1] for b in batch])
        m, out = accept_batch(d, p, None, None, greedy=True)
        for row, (d_row, p_row, _) in enumerate(batch):
            res = accept(d_row, p_row, greedy=True)
            expected = d_row[: res.num_accepted].tolist() + [res.next_token]
            assert int(m[row]) == res.num_accepted
            assert out[row].tolist() == expected + [PADDING_ID] * (k + 1 - len(expected))


def test_batched_sampling_requires_generator():
    with pytest.raises(ValueError, match="Generator"):
        accept_batch(torch.tensor([[1]]), one_hot_rows([1, 2]).unsqueeze(0), None, None)


def test_greedy_accept_over_the_penalised_scores_equals_it_over_the_one_hot_p():
    """The target passes greedy rounds their (penalised) logits, not one-hots: same verdict, ties included."""
    from specdec.core.sampling import SamplingConfig, logits_to_probs, penalised_scores, position_counts, token_counts

    g = torch.Generator().manual_seed(9)
    for cfg in (SamplingConfig(), SamplingConfig(temperature=0.0, repetition_penalty=1.5, presence_penalty=0.7)):
        for _ in range(20):
            logits = torch.randint(0, 4, (5, 12), generator=g).float()  # small integers: many ties
            draft = torch.randint(0, 12, (4,), generator=g)
            history = None
            if cfg.has_penalties:
                history = position_counts(token_counts(torch.randint(0, 12, (6,), generator=g).tolist(), 12), draft)
            one_hot = accept(draft, logits_to_probs(logits, cfg, history), greedy=True)
            scores = accept(draft, penalised_scores(logits, cfg, history), greedy=True)
            assert one_hot == scores


# ----------------------------------------------------------------------------- verdict only


def _agreeing_prefix_round(gen: torch.Generator, greedy: bool):
    """A draft of 0..MAX_K tokens that agrees with p's argmax for a random prefix, then a random tail."""
    k = int(torch.randint(0, MAX_K + 1, (), generator=gen))
    p = torch.softmax(torch.randn(k + 1, VOCAB, generator=gen) / NOISE, dim=-1)
    agree = int(torch.randint(0, k + 1, (), generator=gen))
    tail = torch.randint(0, VOCAB, (k - agree,), generator=gen).tolist()
    draft = p[:agree].argmax(dim=-1).tolist() + tail
    q = None if greedy or k == 0 else torch.softmax(torch.randn(k, VOCAB, generator=gen), dim=-1)
    if q is not None:
        q[torch.arange(k), torch.tensor(draft)] += 0.1  # the draft sampled its own tokens: q(d) > 0
        q = q / q.sum(dim=-1, keepdim=True)
    return draft, p, q


@pytest.mark.parametrize("greedy", [True, False])
def test_a_verdict_only_round_has_the_full_rounds_verdict_and_its_lists_stop_at_the_rejection(greedy):
    gen = torch.Generator().manual_seed(7)
    for case in range(NUM_RANDOM_CASES):
        draft, p, q = _agreeing_prefix_round(gen, greedy)
        full = accept(draft, p, q, None if greedy else gens(SEED + case), greedy=greedy)
        verdict = accept(draft, p, q, None if greedy else gens(SEED + case), greedy=greedy, all_rows=False)
        m, k = full.num_accepted, len(draft)
        assert (verdict.num_accepted, verdict.next_token, verdict.next_kind) == (m, full.next_token, full.next_kind)
        assert verdict.matches == full.matches[: m + 1] == [True] * m + [False] * (m < k)
        assert verdict.target_ids == (full.target_ids[: m + 1] if greedy else [])


def test_a_greedy_verdict_reads_no_row_after_the_first_rejection():
    """On CPU the rows are read one argmax at a time, up to the first rejection; the full round reads all at once."""
    import numpy as np

    reads = []
    real = np.argmax
    p = one_hot_rows([3, 7, 5, 6])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(np, "argmax", lambda a, *args, **kw: reads.append(np.shape(a)) or real(a, *args, **kw))
        verdict = accept([3, 4, 5], p, greedy=True, all_rows=False)
        assert reads == [(VOCAB,), (VOCAB,)]  # rows 0 and 1: d2 = 4 is rejected at row 1
        reads.clear()
        accept([3, 7, 5], p, greedy=True, all_rows=False)
        assert reads == [(VOCAB,)] * 4  # all accepted: the bonus row too
        reads.clear()
        full = accept([3, 4, 5], p, greedy=True)
        assert reads == [(4, VOCAB)]
    assert (verdict.num_accepted, verdict.next_token, verdict.target_ids, verdict.matches) == (
        1,
        7,
        [3, 7],
        [True, False],
    )
    assert full.target_ids == [3, 7, 5, 6] and full.matches == [True, False, True]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_greedy_verdict_over_rows_numpy_cannot_view_is_the_same(dtype):
    """bfloat16 and tensors that require grad take the one-call path (as a GPU's logits do): same verdict."""
    p = one_hot_rows([3, 7, 5, 6]).to(dtype)
    for scores in (p, p.float().requires_grad_()):
        verdict = accept([3, 4, 5], scores, greedy=True, all_rows=False)
        assert (verdict.num_accepted, verdict.next_token, verdict.target_ids) == (1, 7, [3, 7])
        assert accept([3, 7, 5], scores, greedy=True, all_rows=False).target_ids == [3, 7, 5, 6]
