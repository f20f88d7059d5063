"""Unit tests of logits -> probabilities (the same processing for draft q and target p)."""

from __future__ import annotations

import math

import pytest
import torch

from specdec.core.sampling import (
    PURPOSES,
    SEED_BITS,
    SamplingConfig,
    apply_penalties,
    argmax_ids,
    argmax_rows,
    derive_seed,
    draw_generator,
    greedy_one_hot,
    logits_to_probs,
    position_counts,
    round_generators,
    sample,
    sparse_to_dense,
    token_counts,
    truncate_top_n,
)

# Golden value: resumed sessions on other machines depend on this hash never changing.
GOLDEN_SEED, GOLDEN_POSITION, GOLDEN_PURPOSE = 1234, 56, "accept"
GOLDEN_DERIVED = 1623419186736905204
LADDER = [2.0, 1.0, 0.0, -1.0]  # softmax: .644 .237 .087 .032
VOCAB = 10
NUM_DRAWS = 8
K = 4


def ladder() -> torch.Tensor:  # [1, 4]
    return torch.tensor([LADDER])


def support(probs: torch.Tensor) -> list[int]:  # probs: [1, V]
    return torch.nonzero(probs[0] > 0).flatten().tolist()


# ----------------------------------------------------------------------------- config


def test_default_config_is_valid_and_greedy():
    cfg = SamplingConfig().validate()
    assert cfg.greedy and cfg.draft_top_n == 16 and not cfg.has_penalties


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -0.1}, "temperature must be >= 0"),
        ({"top_p": 0.0}, "top_p must be in \\(0, 1\\]"),
        ({"top_p": 1.5}, "top_p must be in \\(0, 1\\]"),
        ({"top_k": -1}, "top_k must be >= 0"),
        ({"draft_top_n": 0}, "draft_top_n must be >= 1"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be in \\[0.01, 100.0\\]"),
        ({"repetition_penalty": 1e-45}, "repetition_penalty must be in"),
        ({"repetition_penalty": 1e3}, "repetition_penalty must be in"),
        ({"frequency_penalty": -2.5}, "frequency_penalty must be in \\[-2.0, 2.0\\]"),
        ({"presence_penalty": 3e38}, "presence_penalty must be in"),
        ({"temperature": math.nan}, "temperature must be a finite number"),
        ({"top_p": math.inf}, "top_p must be a finite number"),
        ({"frequency_penalty": -math.inf}, "frequency_penalty must be a finite number"),
        ({"presence_penalty": math.nan}, "presence_penalty must be a finite number"),
        ({"seed": "7"}, "seed must be an integer"),
    ],
)
def test_validate_messages(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingConfig(**kwargs).validate()


@pytest.mark.parametrize("temperature", [1.4e-45, 1e-38, 1e-30, 3e38])
def test_extreme_temperatures_give_a_distribution_not_nan(temperature):
    """A denormal temperature overflowed logits / temperature to inf (softmax: nan, a 500 in the target);
    the shifted softmax is the same distribution: for a tiny temperature the argmax one-hot."""
    logits = torch.tensor([[1.0, 3.0, -2.0, 2.5], [0.0, -1.0, 4.0, 4.0]])
    probs = logits_to_probs(logits, SamplingConfig(temperature=temperature, seed=1).validate(), [[1], [0, 3]])
    assert torch.isfinite(probs).all() and torch.allclose(probs.sum(-1), torch.ones(2))
    if temperature < 1:
        assert probs[0].tolist() == [0.0, 1.0, 0.0, 0.0] and probs[1].tolist() == [0.0, 0.0, 0.5, 0.5]


def test_greedy_property():
    assert SamplingConfig(temperature=0.0).greedy
    assert SamplingConfig(temperature=0.8, top_k=1).greedy
    assert not SamplingConfig(temperature=0.8).greedy


# ----------------------------------------------------------------------------- warpers


def test_plain_softmax_with_temperature():
    probs = logits_to_probs(ladder(), SamplingConfig(temperature=0.5))
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs, torch.softmax(ladder() / 0.5, -1))


def test_temperature_is_applied_before_top_p():
    """At T=1 top_p=0.8 keeps {0,1}; at T=0.5 the first token alone has mass .865 >= .8."""
    assert support(logits_to_probs(ladder(), SamplingConfig(temperature=1.0, top_p=0.8))) == [0, 1]
    assert support(logits_to_probs(ladder(), SamplingConfig(temperature=0.5, top_p=0.8))) == [0]


def test_top_k_is_applied_before_top_p():
    """top_k=3 then top_p=0.9 keeps {0,1} (.665+.245 >= .9); the reverse order would keep 3."""
    probs = logits_to_probs(ladder(), SamplingConfig(temperature=1.0, top_k=3, top_p=0.9))
    assert support(probs) == [0, 1]
    torch.testing.assert_close(probs[0, :2], torch.softmax(ladder()[0, :2], -1))


def test_top_k_keeps_k_tokens_and_is_noop_when_large():
    assert support(logits_to_probs(ladder(), SamplingConfig(temperature=1.0, top_k=2))) == [0, 1]
    full = logits_to_probs(ladder(), SamplingConfig(temperature=1.0, top_k=len(LADDER) + 1))
    torch.testing.assert_close(full, torch.softmax(ladder(), -1))


def test_top_p_keeps_at_least_one_token():
    probs = logits_to_probs(ladder(), SamplingConfig(temperature=1.0, top_p=1e-9))
    assert probs.tolist() == [[1.0, 0.0, 0.0, 0.0]]


def test_top_k_one_equals_greedy_and_ties_pick_lowest_id():
    logits = torch.tensor([[0.5, 3.0, 3.0, 1.0], [2.0, -1.0, 2.0, 2.0]])
    greedy = logits_to_probs(logits, SamplingConfig(temperature=0.0))
    top1 = logits_to_probs(logits, SamplingConfig(temperature=0.7, top_k=1))
    assert torch.equal(greedy, top1)
    assert torch.argmax(greedy, -1).tolist() == [1, 0]
    assert greedy.sum(-1).tolist() == [1.0, 1.0]


def test_logits_to_probs_rejects_wrong_rank():
    with pytest.raises(ValueError, match="\\[n, V\\]"):
        logits_to_probs(torch.zeros(VOCAB), SamplingConfig())


# ----------------------------------------------------------------------------- penalties


def test_repetition_penalty_divides_positive_multiplies_negative():
    cfg = SamplingConfig(repetition_penalty=2.0)
    out = apply_penalties(torch.tensor([[2.0, -2.0, 1.0]]), [[0, 1, 1]], cfg)
    assert out.tolist() == [[1.0, -4.0, 1.0]]


def test_frequency_and_presence_penalties():
    cfg = SamplingConfig(frequency_penalty=0.5, presence_penalty=1.0)
    out = apply_penalties(torch.zeros(1, 3), [[0, 0, 2]], cfg)
    assert out.tolist() == [[-2.0, 0.0, -1.5]]


def test_no_penalties_returns_float32_copy():
    logits = torch.ones(1, 3, dtype=torch.float16)
    out = apply_penalties(logits, [[0]], SamplingConfig())
    assert out.dtype == torch.float32 and out.tolist() == [[1.0, 1.0, 1.0]]


def test_token_counts_ignores_ids_outside_vocabulary():
    assert token_counts([0, 2, 2, VOCAB, VOCAB + 5, -1], 3).tolist() == [1.0, 0.0, 2.0]


def test_position_counts_are_context_plus_previous_drafts():
    context, drafts = [1, 1, 3], [3, 5, 1, 9]
    counts = position_counts(token_counts(context, VOCAB), torch.tensor(drafts))
    assert counts.shape == (K + 1, VOCAB)
    for i in range(K + 1):
        assert torch.equal(counts[i], token_counts(context + drafts[:i], VOCAB))


def test_penalties_per_position_consistent_between_draft_and_target():
    """Target: all k+1 rows at once; draft: one row at a time with an incremental count."""
    cfg = SamplingConfig(
        temperature=0.8, top_p=0.9, repetition_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.4
    ).validate()
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(K + 1, VOCAB, generator=gen)  # same logits stand in for both models
    context, drafts = [1, 2, 2, 7], torch.tensor([2, 4, 4, 8])
    base = token_counts(context, VOCAB)
    target_probs = logits_to_probs(logits, cfg, position_counts(base, drafts))
    running = base.clone()
    for i in range(K + 1):
        draft_row = logits_to_probs(logits[i : i + 1], cfg, running)
        assert torch.equal(draft_row[0], target_probs[i])
        list_row = logits_to_probs(logits[i : i + 1], cfg, [context + drafts[:i].tolist()])
        assert torch.equal(list_row[0], target_probs[i])
        if i < K:
            running[drafts[i]] += 1


# ----------------------------------------------------------------------------- sparse q'


def test_truncate_top_n_renormalises_sorted_support():
    probs = torch.tensor([[0.1, 0.4, 0.2, 0.3]])
    ids, kept = truncate_top_n(probs, 2)
    assert ids.dtype == torch.int64 and kept.dtype == torch.float32
    assert ids.tolist() == [[1, 3]]
    torch.testing.assert_close(kept, torch.tensor([[4 / 7, 3 / 7]]))
    dense = sparse_to_dense(ids, kept, 4)
    torch.testing.assert_close(dense, torch.tensor([[0.0, 4 / 7, 0.0, 3 / 7]]))


def test_truncate_top_n_clamps_to_vocabulary_and_validates():
    ids, kept = truncate_top_n(torch.tensor([[0.5, 0.5]]), 16)
    assert ids.shape == (1, 2) and float(kept.sum()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="n_keep"):
        truncate_top_n(torch.tensor([[1.0]]), 0)
    with pytest.raises(ValueError, match="sparse ids"):
        sparse_to_dense(torch.tensor([[5]]), torch.tensor([[1.0]]), 3)


# ----------------------------------------------------------------------------- randomness


def test_draw_generator_is_deterministic_and_keyed():
    def draws(seed, position, purpose):
        return torch.rand(NUM_DRAWS, generator=draw_generator(seed, position, purpose))

    same = draws(GOLDEN_SEED, GOLDEN_POSITION, GOLDEN_PURPOSE)
    assert torch.equal(same, draws(GOLDEN_SEED, GOLDEN_POSITION, GOLDEN_PURPOSE))
    assert not torch.equal(same, draws(GOLDEN_SEED + 1, GOLDEN_POSITION, GOLDEN_PURPOSE))
    assert not torch.equal(same, draws(GOLDEN_SEED, GOLDEN_POSITION + 1, GOLDEN_PURPOSE))
    assert not torch.equal(same, draws(GOLDEN_SEED, GOLDEN_POSITION, "recover"))
    factory = round_generators(GOLDEN_SEED, GOLDEN_POSITION - 1)
    assert torch.equal(same, torch.rand(NUM_DRAWS, generator=factory(1, GOLDEN_PURPOSE)))


def test_derive_seed_is_stable_63_bit():
    assert derive_seed(GOLDEN_SEED, GOLDEN_POSITION, GOLDEN_PURPOSE) == GOLDEN_DERIVED
    assert all(0 <= derive_seed(GOLDEN_SEED, GOLDEN_POSITION, p) < 2**SEED_BITS for p in PURPOSES)
    with pytest.raises(ValueError, match="purpose"):
        draw_generator(GOLDEN_SEED, GOLDEN_POSITION, "other")


def test_sample_follows_generator():
    probs = torch.softmax(torch.arange(VOCAB, dtype=torch.float32), -1)
    first = [sample(probs, draw_generator(1, pos, "draft")) for pos in range(NUM_DRAWS)]
    again = [sample(probs, draw_generator(1, pos, "draft")) for pos in range(NUM_DRAWS)]
    assert first == again
    assert sample(torch.nn.functional.one_hot(torch.tensor(3), VOCAB).float(), draw_generator(1, 0, "draft")) == 3


@pytest.mark.parametrize("shape", [(49152,), (1, 64), (9, 49152), (3, 4, 17)])
def test_argmax_rows_equals_torch_argmax_with_ties_to_the_lowest_id(shape):
    gen = torch.Generator().manual_seed(7)
    scores = torch.randint(-3, 4, shape, generator=gen).float()  # few values: many tied maxima
    assert torch.equal(argmax_rows(scores), torch.argmax(scores, dim=-1))
    assert torch.equal(argmax_rows(scores.double()), torch.argmax(scores, dim=-1))
    strided = scores.transpose(0, -1) if scores.dim() > 1 else scores
    assert torch.equal(argmax_rows(strided), torch.argmax(strided, dim=-1))
    if scores.dim() == 2:
        assert argmax_ids(scores) == argmax_ids(scores.requires_grad_()) == torch.argmax(scores, dim=-1).tolist()


def test_argmax_rows_of_other_dtypes_uses_torch():
    scores = torch.tensor([[1, 5, 5, 2]], dtype=torch.bfloat16)
    assert argmax_rows(scores).tolist() == [1]
    assert argmax_rows(torch.tensor([[0, 9, 9]])).tolist() == [1]


def test_greedy_one_hot_marks_the_first_maximum():
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0], [5.0, -1.0, 0.0, 5.0]])
    assert greedy_one_hot(logits).tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]]
    assert greedy_one_hot(logits).dtype == torch.float32


def test_sampling_from_proto_keeps_seeded_settings_and_draws_a_seed_when_unset():
    from specdec.errors import InvalidArgument
    from specdec.protocol import sampling_from_proto, sampling_to_proto
    from specdec.v1 import common_pb2

    cfg = SamplingConfig(temperature=0.5, top_p=0.75, seed=42)  # exact in float32
    msg = sampling_to_proto(cfg)
    assert sampling_from_proto(msg) == cfg and sampling_from_proto(sampling_to_proto(cfg)) is sampling_from_proto(msg)
    bad = common_pb2.SamplingParams(temperature=-1.0, seed=1)
    for _ in range(2):  # refused every time (a refusal is never kept)
        with pytest.raises(InvalidArgument):
            sampling_from_proto(bad)
    unseeded = common_pb2.SamplingParams(temperature=0.7)
    assert len({sampling_from_proto(unseeded).seed for _ in range(4)}) > 1


def test_sampling_bytes_is_the_serialised_message_kept_per_config():
    from specdec.protocol import sampling_bytes, sampling_to_proto
    from specdec.v1 import common_pb2

    cfg = SamplingConfig(temperature=0.5, top_k=7, seed=3)
    assert sampling_bytes(cfg) is sampling_bytes(SamplingConfig(temperature=0.5, top_k=7, seed=3))
    assert common_pb2.SamplingParams.FromString(sampling_bytes(cfg)) == sampling_to_proto(cfg)
