"""Overlapped rounds (orchestrator/overlap.py) through the whole stack: real servicers over gRPC on
loopback, sessions in a real Redis (tests/support.InProcessStack), the tiny Llama pair whose draft is a
perturbed copy of the target (acceptance is high, so blocks drafted ahead get used, and partial).

  * greedy with overlap is the target alone (tie rule of test_greedy_identity) and, token for token,
    the sequential rounds at the same k;
  * sampling at fixed k and seed: overlapped and sequential rounds give the same tokens;
  * pre-drafts are both used and discarded (the test would prove nothing otherwise), blocks drafted behind
    the draft's runner-up (branches) as well as behind all drafts are used, the trace and stats account for
    them, and a pre-draft never costs a delta-round context miss;
  * adaptive k with overlap keeps the output; the test-only hop delay is applied to every call.
"""

from __future__ import annotations

import pytest

from specdec.config import OverlapConfig
from specdec.v1 import common_pb2
from specdec.v1 import orchestrator_pb2 as pb
from tests.prompts import IDENTITY_PROMPTS
from tests.support import TINY_NOISE, served_pair, target_greedy, tiny_pair_and_reference, top2_gap

pytestmark = pytest.mark.integration

K_VALUES = (1, 3)
TIE_EPSILON = 1e-4
SEEDS = (1, 2, 3)
# A closer draft than the other identity tests' (TINY_NOISE): at their acceptance (~0.1 a position) a
# block drafted ahead is almost never usable, and the used path would hardly run.
OVERLAP_NOISE = TINY_NOISE / 5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_pair_and_reference(tmp_path_factory.mktemp("tiny_overlap"), IDENTITY_PROMPTS, noise=OVERLAP_NOISE)


@pytest.fixture(scope="module")
def stack(tiny, redis_server):
    with served_pair(tiny[0], tiny[1], redis_server.url) as s:
        yield s


@pytest.fixture(autouse=True)
def always_worth_it(monkeypatch):
    """Every eligible round drafts ahead: these tests are about what a pre-draft may change (nothing),
    not about when it pays (overlap.worth_overlapping, measured contention: unit-tested)."""
    monkeypatch.setattr("orchestrator.overlap.worth_overlapping", lambda hit, k_ahead, costs: k_ahead > 0)


BRANCHES = 2  # overlapped requests draft ahead behind runner-ups too (GenerateRequest.overlap_branches; off by default)


def generate(stub, prompt, k, max_new, **extra):
    if extra.get("overlap"):
        extra.setdefault("overlap_branches", BRANCHES)
    req = pb.GenerateRequest(prompt=prompt, k=k, max_new_tokens=max_new, trace=True, **extra)
    return stub.Generate(req, timeout=120)


def check_trace(resp) -> None:
    """The trace and stats agree on the pre-drafts; used blocks hid draft time; no context was resent."""
    used = [r for r in resp.trace if r.predrafted]
    assert resp.stats.predrafts_used == len(used) <= resp.stats.predrafts <= resp.stats.predraft_branches
    assert resp.stats.predrafts_used_runner_up == sum(r.predraft_runner_up_at > 0 for r in used)
    assert all(r.predraft_runner_up_at <= prev.k for prev, r in zip(resp.trace, resp.trace[1:]) if r.predrafted)
    assert all(r.draft_kind == "model" and r.draft_ids for r in used)
    assert all(r.draft_hidden_ms >= 0 for r in used)  # 0: a branch queued behind others started after the verify
    assert resp.stats.draft_hidden_ms == pytest.approx(sum(r.draft_hidden_ms for r in used))
    assert resp.stats.context_resends == 0
    for r in resp.trace:  # the services report how long they held each call (ComputeStats.service_ms)
        assert r.target_service_ms >= r.target_ms > 0
        if r.draft_ids and not r.predrafted:
            assert r.draft_service_ms >= r.draft_ms > 0


def test_greedy_overlap_is_the_target_alone_and_the_sequential_rounds(stack, tiny):
    _, _, model = tiny
    channel, stub = stack.stub()
    totals = {"predrafts": 0, "used": 0, "runner_up": 0, "hid": 0}
    try:
        for pi, prompt in enumerate(IDENTITY_PROMPTS[::3]):
            ids = stack.tokenizer.encode(prompt)
            for k in K_VALUES:
                max_new = 16 + (pi * 5 + k) % 17
                overlapped = generate(stub, prompt, k, max_new, overlap=True)
                sequential = generate(stub, prompt, k, max_new, overlap=False)
                assert list(overlapped.token_ids) == list(sequential.token_ids), f"{prompt!r} k={k}"
                assert sequential.stats.predrafts == 0
                want = target_greedy(model, ids, max_new, sorted(stack.deps.eos_ids))
                got = list(overlapped.token_ids)
                j = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
                assert j is None or top2_gap(model, ids + want[:j]) < TIE_EPSILON, f"{prompt!r} k={k} at {j}"
                check_trace(overlapped)
                totals["predrafts"] += overlapped.stats.predrafts
                totals["used"] += overlapped.stats.predrafts_used
                totals["runner_up"] += overlapped.stats.predrafts_used_runner_up
                totals["hid"] += sum(r.predrafted and r.draft_hidden_ms > 0 for r in overlapped.trace)
    finally:
        channel.close()
    print(f"\npre-drafts: {totals}")
    assert 0 < totals["used"] < totals["predrafts"], totals  # some used, some discarded
    assert 0 < totals["runner_up"] < totals["used"], totals  # blocks behind a runner-up and behind all drafts
    assert totals["hid"] > totals["used"] / 2, totals  # most used blocks were drafted during the verify


def test_sampled_overlap_equals_sequential_rounds_at_fixed_k_and_seed(stack):
    channel, stub = stack.stub()
    used = 0
    try:
        for seed in SEEDS:
            for k, temperature in ((2, 0.7), (4, 1.0)):
                sampling = common_pb2.SamplingParams(temperature=temperature, top_p=0.95, seed=seed)
                prompt = IDENTITY_PROMPTS[seed % len(IDENTITY_PROMPTS)]
                a = generate(stub, prompt, k, 24, sampling=sampling, overlap=True)
                b = generate(stub, prompt, k, 24, sampling=sampling, overlap=False)
                assert list(a.token_ids) == list(b.token_ids), f"seed={seed} k={k}"
                assert [len(r.draft_ids) for r in a.trace] == [len(r.draft_ids) for r in b.trace]
                check_trace(a)
                used += a.stats.predrafts_used
    finally:
        channel.close()
    assert used > 0


def test_adaptive_k_with_overlap_keeps_the_output(stack):
    channel, stub = stack.stub()
    try:
        prompt = IDENTITY_PROMPTS[1]
        a = generate(stub, prompt, 6, 40, adaptive_k=True, overlap=True)
        b = generate(stub, prompt, 0, 40)
        post_only = generate(stub, prompt, 6, 40, adaptive_k=True, overlap=True, overlap_branches=0)
    finally:
        channel.close()
    assert list(a.token_ids) == list(b.token_ids) == list(post_only.token_ids)
    check_trace(a)
    check_trace(post_only)  # no branches: one block per pre-draft, none behind a runner-up
    assert post_only.stats.predraft_branches == post_only.stats.predrafts > 0
    assert post_only.stats.predrafts_used_runner_up == 0


def test_adaptive_k_drafts_with_the_model_only_after_the_prompts_round(stack):
    """The first round prefills the prompt at the target; with a model draft it would wait for the draft to prefill
    the prompt too, so adaptive k's first round drafts nothing with it (generation._round_k) and the rounds after
    it do (an optimistic prior makes them try); fixed k drafts from the first round on, as asked."""
    channel, stub = stack.stub()
    try:
        prompt = IDENTITY_PROMPTS[2]
        adaptive = generate(stub, prompt, 6, 24, adaptive_k=True, draft_kind="model")
        fixed = generate(stub, prompt, 3, 24, draft_kind="model")
        plain = generate(stub, prompt, 0, 24)
    finally:
        channel.close()
    assert list(adaptive.token_ids) == list(fixed.token_ids) == list(plain.token_ids)
    assert adaptive.trace[0].k == 0 and not adaptive.trace[0].draft_ids
    assert any(r.draft_ids for r in adaptive.trace[1:])
    assert fixed.trace[0].k == 3 and len(fixed.trace[0].draft_ids) == 3


def test_the_server_default_and_the_hop_delay(stack):
    """OverlapConfig.enabled is the default of an unset GenerateRequest.overlap; hop_delay_ms (test and
    bench only) delays both hops of every draft and target call."""
    runner, cfg = stack.deps.runner, stack.deps.cfg
    saved_runner, saved_cfg = runner.overlap, cfg.overlap
    channel, stub = stack.stub()
    try:
        cfg.overlap = OverlapConfig(enabled=True)
        on = generate(stub, IDENTITY_PROMPTS[0], 3, 24)
        runner.overlap = OverlapConfig(hop_delay_ms=20.0)
        cfg.overlap = OverlapConfig(enabled=False)
        delayed = generate(stub, IDENTITY_PROMPTS[0], 3, 24)
    finally:
        runner.overlap, cfg.overlap = saved_runner, saved_cfg
        channel.close()
    assert on.stats.predrafts > 0 and delayed.stats.predrafts == 0
    assert list(on.token_ids) == list(delayed.token_ids)
    calls = sum(1 + bool(r.draft_ids) for r in delayed.trace)  # a Verify per round, a Propose per draft
    assert delayed.stats.overhead_ms >= calls * 2 * 20.0 * 0.99
