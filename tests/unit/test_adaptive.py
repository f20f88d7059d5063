"""Adaptive k: backs off when drafts are rejected, goes long when they are accepted."""

from __future__ import annotations

from orchestrator.adaptive import (
    ANY_DRAFT,
    NO_DRAFT,
    PROBE_EVERY,
    PROBE_EVERY_MAX,
    PROBE_K,
    AcceptanceTracker,
    CostModel,
    best_k,
    choose_k,
)


def cpu_like_costs() -> CostModel:
    costs = CostModel()
    for n, ms in ((1, 60.0), (3, 66.0), (5, 72.0), (9, 85.0)):  # verifying more tokens costs a little more
        costs.observe(k=n - 1, pass_tokens=n, draft_ms=0.0, target_ms=ms, overhead_ms=2.0)
    return costs


def test_verify_cost_interpolates_between_measured_points():
    costs = cpu_like_costs()
    assert costs.verify(2) == 63.0 and costs.verify(5) == 72.0
    assert costs.verify(13) > costs.verify(9)


def test_high_acceptance_picks_long_drafts():
    costs, acc = cpu_like_costs(), AcceptanceTracker(k_max=8)
    for _ in range(30):
        acc.observe(proposed=8, accepted=8)
    assert choose_k(costs, acc, 8) >= 6


def test_rejections_back_off_to_target_only_and_probe_later():
    costs, acc = cpu_like_costs(), AcceptanceTracker(k_max=8)
    for _ in range(30):
        acc.observe(proposed=4, accepted=0)
    picks = [choose_k(costs, acc, 8) for _ in range(PROBE_EVERY + 1)]
    assert picks[:PROBE_EVERY] == [0] * PROBE_EVERY
    assert picks[PROBE_EVERY] == PROBE_K  # a short probing round


def rounds_until_probe(costs: CostModel, acc: AcceptanceTracker, accepted_on_probe: int) -> int:
    """Rounds at k = 0 before the next probe; the probe's outcome is then observed."""
    for n in range(10 * PROBE_EVERY_MAX):
        k = choose_k(costs, acc, 8)
        acc.observe(proposed=k, accepted=accepted_on_probe if k else 0)
        if k:
            return n
    raise AssertionError("never probed")


def test_failed_probes_back_off_exponentially_and_a_hit_resets_the_interval():
    costs, acc = cpu_like_costs(), AcceptanceTracker(k_max=8)
    for _ in range(30):
        acc.observe(proposed=4, accepted=0)
    gaps = [rounds_until_probe(costs, acc, accepted_on_probe=0) for _ in range(6)]
    assert gaps == [PROBE_EVERY * 2**i for i in range(5)] + [PROBE_EVERY_MAX]
    acc.rounds_at_zero = acc.probe_every  # the next round probes, and this probe hits
    assert choose_k(costs, acc, 8) == PROBE_K
    acc.observe(proposed=PROBE_K, accepted=2)
    assert acc.probe_every == PROBE_EVERY


def test_expensive_draft_steps_shorten_the_draft():
    acc = AcceptanceTracker(k_max=8)
    for accepted in [0, 1, 2, 3, 5, 8] * 5:  # each further position is less likely to be accepted
        acc.observe(proposed=8, accepted=accepted)
    cheap, dear = cpu_like_costs(), cpu_like_costs()
    dear.observe(k=4, pass_tokens=5, draft_ms=4 * 40.0, target_ms=72.0, overhead_ms=2.0)
    assert choose_k(dear, acc, 8) < choose_k(cheap, acc, 8)


def test_expected_tokens_counts_the_bonus():
    acc = AcceptanceTracker(k_max=3)
    acc.accepts, acc.tries = [1e9] * 3, [1e9] * 3  # certain acceptance at every position
    assert abs(acc.expected_tokens(3) - 4.0) < 1e-6 and acc.expected_tokens(0) == 1.0


def measured_fp32_costs() -> CostModel:
    """v(n) of SmolLM2 in fp32 on the 2-core CPU (input-major, 1 thread): a 2-token verify costs 1.7 steps."""
    costs = CostModel()
    for n, ms in ((1, 30.0), (2, 51.0), (3, 62.0), (5, 63.0), (9, 74.0), (13, 85.0)):
        costs.observe(k=n - 1, pass_tokens=n, draft_ms=0.0, target_ms=ms, overhead_ms=2.5)
    return costs


def test_a_rejection_at_position_1_is_not_outweighed_by_the_prior_of_deeper_positions():
    costs, acc = measured_fp32_costs(), AcceptanceTracker(k_max=8)
    assert choose_k(costs, acc, 8) > 0  # a fresh session tries speculation
    acc.observe(proposed=8, accepted=0)  # one long draft, rejected at once
    rates = acc.rates()
    assert all(abs(r - rates[0]) < 1e-9 for r in rates)  # positions 2..8 know only what position 1 knows
    assert choose_k(costs, acc, 8) == 0


def test_deeper_positions_follow_their_own_data_once_they_have_it():
    acc = AcceptanceTracker(k_max=4)
    for _ in range(30):
        acc.observe(proposed=4, accepted=4)  # copying: every position accepted
    assert all(r > 0.9 for r in acc.rates())
    for _ in range(30):
        acc.observe(proposed=4, accepted=1)  # the first token right, the second wrong
    rates = acc.rates()
    assert rates[0] > 0.85 and rates[1] < 0.25


def test_costs_are_kept_per_proposer_and_pick_each_its_own_k():
    """A combined draft: prompt lookup (cheap, no hop) on some rounds, the model (dear, a hop) on others."""
    costs = measured_fp32_costs()
    for _ in range(5):
        costs.observe(k=4, pass_tokens=5, draft_ms=4 * 0.02, target_ms=63.0, overhead_ms=2.5, proposer="ngram")
        costs.observe(k=2, pass_tokens=3, draft_ms=2 * 6.0, target_ms=62.0, overhead_ms=4.0, proposer="model")
    assert costs.draft_step_ms["ngram"] < 0.1 and abs(costs.draft_step_ms["model"] - 6.0) < 1e-6
    assert costs.overhead_ms["model"] > costs.overhead_ms["ngram"] and costs.overhead_ms[NO_DRAFT] == 2.5
    assert costs.round_ms(4, "model") - costs.round_ms(4, "ngram") > 4 * 5.9
    assert costs.round_ms(0, "model") == costs.round_ms(0, "ngram")  # no draft: no draft cost either way
    acc = AcceptanceTracker(k_max=8)
    for accepted in [0, 1, 2, 3, 5, 8] * 5:
        acc.observe(proposed=8, accepted=accepted)
    assert choose_k(costs, acc, 8, "model") < choose_k(costs, acc, 8, "ngram")


def test_a_proposer_not_measured_yet_is_tried():
    costs, acc = measured_fp32_costs(), AcceptanceTracker(k_max=8)
    assert costs.round_ms(4, "model") == costs.round_ms(4, ANY_DRAFT)  # falls back to what is measured
    assert choose_k(costs, acc, 8, "model") > 0


def compute_bound_costs() -> CostModel:
    """v(n) = 10 + 8 n ms: most of a pass is per-token work, the part batching cannot share."""
    costs = CostModel()
    for n in (1, 2, 3, 5):
        costs.observe(k=n - 1, pass_tokens=n, draft_ms=0.0, target_ms=10.0 + 8.0 * n, overhead_ms=2.0)
    return costs


def accepting(rate_accepts: int, of: int, k_max: int = 4) -> AcceptanceTracker:
    acc = AcceptanceTracker(k_max=k_max)
    for i in range(40):
        acc.observe(proposed=k_max, accepted=k_max if i % of < rate_accepts else 0)
    return acc


def test_alone_a_round_waits_for_the_measured_verify_cost():
    costs = compute_bound_costs()
    assert costs.batch == 1.0
    assert [costs.pass_ms(n) for n in (1, 3, 5)] == [costs.verify(n) for n in (1, 3, 5)]
    costs.observe_batch(0)  # a round without a reported batch changes nothing
    assert costs.batch == 1.0


def test_full_batches_back_speculation_off_when_verify_work_is_per_token():
    costs, acc = compute_bound_costs(), accepting(3, 5)  # ~60% of drafts fully accepted
    assert choose_k(costs, acc, 4) >= 1  # alone: speculation pays
    for _ in range(30):
        costs.observe_batch(8)
    assert 7.5 < costs.batch <= 8.0
    # a round waits for a pass of every session's tokens: t0 + B * n * m (t0 = 10, m = 8)
    assert abs(costs.pass_ms(1) - (10.0 + 8.0 * costs.batch)) < 1e-9
    assert choose_k(costs, acc, 4) == 0  # batches full: plain decoding
    for _ in range(30):
        costs.observe_batch(1)
    assert choose_k(costs, acc, 4) >= 1  # load gone: speculation comes back


def test_full_batches_keep_speculating_when_scoring_more_tokens_is_nearly_free():
    costs, acc = CostModel(), accepting(3, 5)
    for n in (1, 2, 3, 5):  # memory-bound: v(n) flat
        costs.observe(k=n - 1, pass_tokens=n, draft_ms=0.0, target_ms=30.0, overhead_ms=2.0)
    for _ in range(30):
        costs.observe_batch(16)
    assert choose_k(costs, acc, 4) >= 2


def test_under_load_a_weak_draft_backs_off_because_its_tokens_slow_every_session_of_the_pass():
    """v(n) = 23 + 2 n ms per pass (a CPU target), 5 ms outside the forwards. Four sessions share each pass:
    a draft accepted ~30 % per position pays alone but not in the batch, where each round waits for the
    pass of all four sessions' drafts; one accepted ~85 % keeps paying."""
    costs = CostModel()
    for n in (1, 2, 5, 9, 20):
        costs.observe(k=0, pass_tokens=n, draft_ms=0.0, target_ms=23.0 + 2.0 * n, overhead_ms=5.0)
    weak, strong = AcceptanceTracker(k_max=4), AcceptanceTracker(k_max=4)
    for i in range(60):
        weak.observe(proposed=4, accepted=1 if i % 10 < 3 else 0)
        strong.observe(proposed=4, accepted=4 if i % 20 < 17 else 1)
    assert choose_k(costs, weak, 4) >= 1 and choose_k(costs, strong, 4) >= 1  # alone both pay
    for _ in range(40):
        costs.observe_batch(4)
    assert choose_k(costs, weak, 4) == 0
    assert choose_k(costs, strong, 4) >= 2


def test_a_round_learns_its_pass_and_leaves_queueing_out_of_its_overhead():
    from orchestrator.rounds import RoundCost, RoundOutcome

    out = RoundOutcome(
        k=4,
        draft_ids=[1, 2, 3, 4],
        matches=[],
        target_ids=[],
        num_accepted=0,
        next_token=5,
        next_kind=0,
        emitted=[5],
        cost=RoundCost(
            draft_ms=4.0, target_ms=60.0, wall_ms=130.0, target_computed=5, target_batch=4, target_queue_ms=50.0
        ),
    )
    assert out.cost.overhead_ms == 66.0 and out.cost.fixed_overhead_ms == 16.0
    assert out.cost.pass_tokens == 20  # not reported: 4 sessions of 5 tokens
    out.cost.target_batch_tokens = 11  # reported by the target: the others computed 6
    assert out.cost.pass_tokens == 11


def test_best_k_changes_no_probing_state():
    costs, acc = cpu_like_costs(), AcceptanceTracker(k_max=8)
    for _ in range(30):
        acc.observe(proposed=8, accepted=0)
    before = (acc.rounds_at_zero, acc.probe_every, acc.probing)
    assert [best_k(costs, acc, 8) for _ in range(3 * PROBE_EVERY)] == [0] * (3 * PROBE_EVERY)
    assert (acc.rounds_at_zero, acc.probe_every, acc.probing) == before  # no probing state moved


def _verify_by_scan(points: dict[int, float], n: float) -> float:
    """v(n) as the first version computed it: a scan of every measured point per call (the reference)."""
    if n in points:
        return points[n]
    known = sorted(points)
    if not known:
        return 1.0
    if len(known) == 1:
        return points[known[0]]
    lo = max([x for x in known if x < n], default=known[0])
    hi = min([x for x in known if x > n], default=known[-1])
    if lo == hi:
        lo, hi = known[-2], known[-1]
    return max(points[lo] + (points[hi] - points[lo]) / (hi - lo) * (n - lo), 0.0)


def test_verify_by_bisection_equals_the_scan_as_points_are_added():
    """CostModel.verify runs several times a round: it bisects a sorted copy of the measured sizes, re-sorted
    only when a size is added. Between, below and beyond the points, as observe adds them, it must answer as
    the scan did."""
    import random

    rng = random.Random(3)
    costs = CostModel()
    for _ in range(60):
        costs.observe(0, rng.randrange(1, 80), 0.0, rng.uniform(20, 120), 1.0)
        for n in [0.5, 1, 2.5, 7, 33.3, 79, 80, 95, 200] + [rng.uniform(0, 100) for _ in range(5)]:
            assert costs.verify(n) == _verify_by_scan(costs.verify_ms, n), n
    costs.verify_ms = {4: 30.0, 9: 45.0}  # a replaced table is re-read, not the cached sizes
    assert costs.verify(6.5) == _verify_by_scan(costs.verify_ms, 6.5) == 37.5


def test_expected_tokens_upto_lists_expected_tokens():
    tracker = AcceptanceTracker(k_max=5)
    for accepted in (5, 2, 0, 3, 1, 4):
        tracker.observe(5, accepted)
    listed = tracker.expected_tokens_upto(8)
    assert len(listed) == 9
    assert listed == [tracker.expected_tokens(k) for k in range(9)]
    assert listed[5] == listed[8]  # positions beyond k_max add nothing
