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
    DraftDemand,
    best_k,
    choose_k,
    draft_budget,
    draft_delay,
    latency_cap,
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


def cpu_pass_costs(batch: float) -> CostModel:
    """v(n) = 23 + 2 n ms per pass, 5 ms a round outside the forwards, `batch` sessions per pass."""
    costs = CostModel()
    for n in (1, 2, 5, 9, 20, 36):
        costs.observe(k=0, pass_tokens=n, draft_ms=0.0, target_ms=23.0 + 2.0 * n, overhead_ms=5.0)
    costs.batch = batch
    return costs


def test_the_latency_cap_keeps_the_others_rounds_within_the_slack():
    """With B sessions a pass each drafting k, the others' drafts lengthen a session's pass by
    (B-1)/B · (v(B(k+1)) - v(B)) = (B-1) · 2k ms here; a round without drafts takes v(B) + 5 ms."""
    alone, pair, four = cpu_pass_costs(1.0), cpu_pass_costs(2.0), cpu_pass_costs(4.0)
    assert latency_cap(alone, 8, 0.05) == 8  # nobody else waits for the pass
    assert latency_cap(pair, 8, 0.05) == 0  # 2 ms a token > 5 % of 32 ms
    assert latency_cap(pair, 8, 0.25) == 4  # 2k <= 8 ms
    assert latency_cap(four, 8, 0.25) == 1  # 6k <= 9 ms
    assert latency_cap(four, 8, -1.0) == 8  # off: throughput first
    for costs in (pair, four):
        for slack in (0.05, 0.1, 0.25, 0.5):
            k = latency_cap(costs, 8, slack)
            share = (costs.batch - 1) / costs.batch
            grow = share * (costs.pass_ms(k + 1) - costs.pass_ms(1))
            assert grow <= slack * costs.round_ms(0)
            if k < 8:  # the largest such k
                assert share * (costs.pass_ms(k + 2) - costs.pass_ms(1)) > slack * costs.round_ms(0)


def test_under_shared_passes_a_strong_draft_is_held_to_the_cap_and_free_again_alone():
    """Throughput first, a draft accepted ~85 % per position keeps k >= 2 at 4 sessions a pass
    (test above); latency first it drafts only what the cap allows, and when the load goes the
    cap lifts and its acceptance data is still there."""
    strong = AcceptanceTracker(k_max=8)
    for i in range(60):
        strong.observe(proposed=8, accepted=8 if i % 20 < 17 else 1)
    shared = cpu_pass_costs(4.0)
    assert choose_k(shared, strong, 8) >= 2
    assert choose_k(shared, strong, latency_cap(shared, 8, 0.05)) == 0
    assert choose_k(shared, strong, latency_cap(shared, 8, 0.5)) <= latency_cap(shared, 8, 0.5) < 8
    for _ in range(40):
        shared.observe_batch(1)
    assert latency_cap(shared, 8, 0.05) == 8 and choose_k(shared, strong, 8) >= 6


def test_the_cap_follows_the_sessions_waiting_now_not_the_orchestrator_average():
    """At a low request rate a session is often alone while the orchestrator's average still counts
    the passes it shared a moment ago: the sessions waiting for the target now decide."""
    lagging = cpu_pass_costs(4.0)
    assert latency_cap(lagging, 8, 0.25) == 1
    assert latency_cap(lagging, 8, 0.25, sessions=1) == 8  # alone now
    assert latency_cap(cpu_pass_costs(1.0), 8, 0.25, sessions=4) == 1  # shared now, the average lags
    assert latency_cap(cpu_pass_costs(1.0), 8, 0.25, sessions=2) == 4


def test_the_sessions_that_want_drafts_share_the_passes_draft_budget():
    """v(n) = 23 + 2n ms, 4 sessions a pass, slack 0.25: a round without drafts takes v(4) + 5 = 36 ms, so
    the passes may grow by 9 ms: 4 draft tokens in all. A lone drafter beside three sessions that would
    not draft keeps all 4; two split them; when all four want drafts each sees the other three's, as
    in the alike rule. Whatever the split, a session that does not draft waits at most 9 ms longer."""
    four = cpu_pass_costs(4.0)
    allowed = 0.25 * four.round_ms(0)
    assert draft_budget(four, allowed, 4.0, 32) == 4
    assert [latency_cap(four, 8, 0.25, drafters=d) for d in (1, 2, 3, 4)] == [4, 2, 1, 1]
    assert latency_cap(four, 8, 0.25, drafters=4) == latency_cap(four, 8, 0.25)  # all draft: the alike rule
    assert latency_cap(four, 8, 0.25, sessions=1, drafters=1) == 8  # alone: nothing to delay
    assert latency_cap(four, 8, -1.0, drafters=1) == 8  # off
    for slack in (0.05, 0.1, 0.25, 0.5):
        for sessions in (2.0, 4.0, 8.0):
            for d in range(1, int(sessions) + 1):
                k = latency_cap(four, 8, slack, sessions=sessions, drafters=d)
                seen = d * k if d <= sessions - 1 else (d - 1) * k  # the drafts a session waits for
                assert (
                    four.verify(sessions + seen) - four.verify(sessions)
                    <= slack * (four.round_ms(0) - four.pass_ms(1) + four.pass_ms(1, sessions)) + 1e-9
                )


def test_draft_demand_counts_the_generations_that_want_drafts_and_best_k_changes_nothing():
    demand = DraftDemand()
    demand.set(("s1", "r1"), True)
    demand.set(("s2", "r2"), False)
    demand.set(("s1", "r1"), True)
    assert demand.drafters() == 1
    demand.drop(("s1", "r1"))
    demand.drop(("nobody", "r"))
    assert demand.drafters() == 0 and list(demand.wants) == [("s2", "r2")]
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


def flat_pass_costs(batch: float) -> CostModel:
    """A target whose passes cost the same for 1 to 36 tokens (bf16 on AMX: v(n) = 65 ms), 2 ms a round outside
    the forwards; a model draft at 5 ms a token plus a 3 ms hop, the n-gram lookup at 0.02 ms a token."""
    costs = CostModel()
    for n in (1, 4, 8, 20, 36):
        costs.observe(k=0, pass_tokens=n, draft_ms=0.0, target_ms=65.0, overhead_ms=2.0)
    costs.observe(k=4, pass_tokens=5, draft_ms=20.0, target_ms=65.0, overhead_ms=5.0, proposer="model")
    costs.observe(k=4, pass_tokens=5, draft_ms=0.08, target_ms=65.0, overhead_ms=2.0, proposer="ngram")
    for _ in range(40):  # the EMAs settle on these figures
        costs.observe(k=4, pass_tokens=5, draft_ms=20.0, target_ms=65.0, overhead_ms=5.0, proposer="model")
        costs.observe(k=4, pass_tokens=5, draft_ms=0.08, target_ms=65.0, overhead_ms=2.0, proposer="ngram")
    costs.batch = batch
    return costs


def test_the_cap_counts_the_draft_time_the_others_wait_for():
    """The target holds a pass for the last pass's sessions, so a session's draft time before its verify delays
    every session of it (bench-load, bf16 on AMX, capped adaptive k at 4 streams: open prompts' ITL 1.12-1.23x
    k = 0's at a mean k of 0.14-0.19, where the passes themselves barely grow). With passes that cost the same
    for any token count, only that time limits k: a model draft (5 ms a token + a 3 ms hop) fits no 5 % slack of
    a 67 ms round, the in-process lookup keeps its tokens, no draft to wait for (proposer None) costs nothing."""
    four = flat_pass_costs(4.0)
    assert draft_delay(four, 2, "model") == 13.0 and draft_delay(four, 2, None) == 0.0
    assert latency_cap(four, 8, 0.05, sessions=4, drafters=1, proposer="model") == 0
    assert latency_cap(four, 8, 0.05, sessions=4, drafters=1, proposer="ngram") == 8
    assert latency_cap(four, 8, 0.05, sessions=4, drafters=1, proposer=None) == 8
    assert latency_cap(four, 8, 0.25, sessions=4, drafters=1, proposer="model") == 2  # 5k + 3 <= 16.75 ms
    assert latency_cap(four, 8, 0.05, sessions=1, proposer="model") == 8  # alone: nobody waits
    for slack in (0.05, 0.1, 0.25, 0.5):
        for drafters in (0, 1, 4):
            k = latency_cap(four, 8, slack, sessions=4, drafters=drafters, proposer="model")
            assert draft_delay(four, k, "model") <= slack * four.round_ms(0)
            if k < 8:
                assert draft_delay(four, k + 1, "model") > slack * four.round_ms(0)
