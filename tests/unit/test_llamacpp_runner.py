"""The llama.cpp runner on the real library and the real SmolLM2-135M GGUF: rows, rollback, prefix sharing,
batching, eviction, bad input; and the accept rule's sampling fed by its logits (chi-square against p).

llama.cpp computes a row differently with the number of rows in the pass (its quantized matmuls take other
paths), so "the same logits" here means close, with the same argmax, not bitwise."""

from __future__ import annotations

import collections
import threading

import numpy as np
import pytest
import torch
from scipy import stats

from specdec.core.sampling import SamplingConfig, logits_to_probs
from specdec.engine.runner import ExtendItem
from specdec.engine.target import TargetEngine
from specdec.engine.types import SparseDist, VerifyInput
from specdec.errors import InvalidArgument, ResourceExhausted

llamacpp_runner = pytest.importorskip("specdec.engine.llamacpp_runner")
pytest.importorskip("llama_cpp")

from specdec.models.resolve import embedded_gguf_path  # noqa: E402

LlamaCppRunner, LlamaCppSettings = llamacpp_runner.LlamaCppRunner, llamacpp_runner.LlamaCppSettings
CONTEXT = [(i * 37) % 40000 + 100 for i in range(120)]
# One position's logits in passes of different row counts lie up to ~1.1 apart (of ~30): compared as
# distributions, whose probabilities stay within this of each other. Measured: up to 0.03 on ggml's AVX2 kernels
# (AMD EPYC Zen 2), 0.051 on its AVX-512 ones (AMD EPYC Zen 4, a 0.47 logit shift at a top probability of 0.31); a
# wrong row or position differs by far more, and its argmax with it.
PROB_ATOL = 0.08


def make_runner(**overrides) -> LlamaCppRunner:
    settings = dict(threads=1, kv_tokens=2048, sessions=8, batch_tokens=512, share_min_tokens=16)
    return LlamaCppRunner(embedded_gguf_path("smollm2"), LlamaCppSettings(**{**settings, **overrides}))


@pytest.fixture(scope="module")
def runner():
    r = make_runner()
    yield r
    r.close()


def fresh(runner: LlamaCppRunner, ids: list[int], first: int, name: str = "fresh") -> torch.Tensor:
    """The logits of ids[first:] computed from nothing (no cache to reuse, no donor to share)."""
    runner.pool.clear()
    out = runner.extend(name, ids, first).logits
    runner.pool.release(name)
    return out


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape
    assert torch.equal(a.argmax(-1), b.argmax(-1))
    assert (torch.softmax(a, -1) - torch.softmax(b, -1)).abs().max() < PROB_ATOL


def test_rows_of_a_verify_pass_match_step_by_step_decoding(runner):
    """A pass over context + 4 tokens returns 5 rows; row j is what a 1-token step after ids[:first+j+1] gives."""
    runner.pool.clear()
    ids = list(CONTEXT)
    steps = []
    for _ in range(5):
        row = runner.extend("steps", ids, len(ids) - 1).logits
        assert row.shape == (1, runner.vocab_width) and row.dtype == torch.float32
        steps.append(row[0])
        ids.append(int(row[0].argmax()))
    drafted = ids[len(CONTEXT) : len(CONTEXT) + 4]
    rows = runner.extend("verify", CONTEXT + drafted, len(CONTEXT) - 1)
    assert rows.logits.shape == (5, runner.vocab_width)
    assert rows.cached_tokens + rows.computed_tokens == len(CONTEXT) + 4
    close(rows.logits, torch.stack(steps))


def test_the_library_names_the_tokens_that_end_a_generation(runner):
    # SmolLM2: <|endoftext|> = 0, <|im_start|> = 1, <|im_end|> = 2 (the chat turn's end)
    assert runner.lib.is_eog(runner.model, 2) and runner.lib.is_eog(runner.model, 0)
    assert not runner.lib.is_eog(runner.model, 1) and not runner.lib.is_eog(runner.model, 30)


def test_rollback_truncates_and_reuses_the_prefix(runner):
    runner.pool.clear()
    long = CONTEXT + [11, 12, 13, 14, 15]
    runner.extend("s", long, len(long) - 1)
    short = CONTEXT + [11, 99]
    out = runner.extend("s", short, len(short) - 2)  # logits from position len(CONTEXT) on: recomputed
    assert out.rolled_back == 5 and out.cached_tokens == len(CONTEXT) and out.computed_tokens == 2
    again = runner.extend("s", short + [7], len(short))  # the rolled-back cache goes on from there
    assert again.cached_tokens == len(short) and again.computed_tokens == 1
    close(out.logits, fresh(runner, short, len(short) - 2))


def test_a_new_session_shares_another_sessions_prefix(runner):
    runner.pool.clear()
    runner.extend("donor", CONTEXT, len(CONTEXT) - 1)
    hits = runner.pool.counters.prefix_hits
    ids = CONTEXT[:100] + [5, 6, 7]
    out = runner.extend("sharer", ids, len(ids) - 1)
    assert runner.pool.counters.prefix_hits == hits + 1
    assert out.cached_tokens == 100 and out.computed_tokens == 3
    donor = runner.extend("donor", CONTEXT + [42], len(CONTEXT))  # the donor's own cells are untouched
    assert donor.cached_tokens == len(CONTEXT)
    close(out.logits, fresh(runner, ids, len(ids) - 1))
    close(donor.logits, fresh(runner, CONTEXT + [42], len(CONTEXT)))


def test_one_pass_over_several_sessions_equals_each_alone(runner):
    runner.pool.clear()
    a, b, c = CONTEXT[:40], CONTEXT[40:100], [3] + CONTEXT[:20]
    runner.extend("a", a, len(a) - 1)
    items = [ExtendItem("a", a + [7, 8, 9], len(a) - 1), ExtendItem("b", b, len(b) - 3), ExtendItem("c", c, 10)]
    outs = runner.extend_batch(items)
    assert [o.batch_size for o in outs] == [3, 3, 3]
    assert outs[0].cached_tokens == len(a) - 1 and outs[0].batch_tokens == 4 + len(b) + len(c)
    for item, out in zip(items, outs):
        close(out.logits, fresh(runner, list(item.ids), item.first))


def test_a_pass_longer_than_one_decode_is_split():
    small = make_runner(batch_tokens=32)
    try:
        out = small.extend("long", CONTEXT, len(CONTEXT) - 3)
        assert out.logits.shape == (3, small.vocab_width)
    finally:
        small.close()
    runner = make_runner()
    try:
        close(out.logits, runner.extend("long", CONTEXT, len(CONTEXT) - 3).logits)
    finally:
        runner.close()


def test_sessions_beyond_the_sequence_count_evict_the_least_recent():
    two = make_runner(sessions=2, share_min_tokens=0)
    try:
        for name in ("a", "b", "c"):
            two.extend(name, [1, 2, 3, ord(name)], 3)
        assert two.pool.session_count() == 2 and two.pool.counters.evictions == 1
        again = two.extend("a", [1, 2, 3, ord("a"), 5], 4)  # "a" was evicted: computed again, correctly
        assert again.cached_tokens == 0
        close(again.logits, fresh(two, [1, 2, 3, ord("a"), 5], 4))
    finally:
        two.close()


def test_a_pass_whose_sessions_cannot_all_fit_is_refused_and_each_fits_alone():
    """Making room for a later session of the pass would evict an earlier one: refused (the target engine then
    runs each alone), never two sessions on one sequence."""
    tight = make_runner(kv_tokens=256, budget_bytes=0, share_min_tokens=0)
    try:
        a, b = CONTEXT[:100] + CONTEXT[:40], CONTEXT[:120]
        tight.extend("a", a, len(a) - 1)
        with pytest.raises(ResourceExhausted):
            tight.extend_batch([ExtendItem("a", a + [5], len(a)), ExtendItem("b", b, len(b) - 1)])
        engine = TargetEngine(tight, tight.max_context, 8)
        outs = engine.verify_batch(
            [VerifyInput("a", a, [5], SamplingConfig()), VerifyInput("b", b, [], SamplingConfig())]
        )
        assert all(not isinstance(o, Exception) for o in outs)
    finally:
        tight.close()


def test_releases_from_another_thread_are_applied_before_the_next_decode(runner):
    runner.pool.clear()
    runner.extend("x", CONTEXT, len(CONTEXT) - 1)
    worker = threading.Thread(target=runner.pool.release, args=("x",))
    worker.start()
    worker.join()
    assert runner.ops.pending() >= 1
    out = runner.extend("y", CONTEXT[:50], 49)  # may take x's sequence id: x's cells are gone first
    assert runner.ops.pending() == 0
    close(out.logits, fresh(runner, CONTEXT[:50], 49))


def test_bad_input_is_refused_and_leaves_no_half_updated_cache(runner):
    runner.pool.clear()
    with pytest.raises(InvalidArgument, match="token ids"):
        runner.extend("bad", [1, 2, runner.vocab_width], 2)
    assert runner.pool.session_count() == 0
    with pytest.raises(ValueError, match="first"):
        runner.extend("bad", [1, 2], 2)
    with pytest.raises(ValueError, match="could not load"):
        LlamaCppRunner(__file__, LlamaCppSettings(threads=1))


# ------------------------------------------------------------------- sampling through the accept rule
SAMPLES, ALPHA, MIN_EXPECTED = 3000, 1e-3, 5.0
CFG = dict(temperature=1.0, top_k=0, top_p=1.0)
CHAT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 7018, 28, 7018, 411, 407, 19712, 8182, 2]


class CachedRunner:
    """The llama.cpp runner with each distinct pass run once: the accept rule then runs thousands of times on
    the same logits the runner gave (a pass per seed would take minutes)."""

    def __init__(self, inner: LlamaCppRunner) -> None:
        self.inner, self.memo = inner, {}
        self.engine, self.pool, self.vocab_width = inner.engine, inner.pool, inner.vocab_width
        self.keep_hidden, self.batching, self.device = False, True, "cpu"

    def extend_batch(self, items):
        key = tuple((tuple(i.ids), i.first) for i in items)
        if key not in self.memo:
            self.memo[key] = self.inner.extend_batch(items)
        return self.memo[key]


def first_tokens(runner: LlamaCppRunner, lie: bool) -> tuple[np.ndarray, np.ndarray]:
    """Counts of the first generated token over SAMPLES seeds, drafting one token from q (the target's own
    distribution at a higher temperature), verified by the target engine; and p, the target's distribution."""
    engine = TargetEngine(CachedRunner(runner), runner.max_context, 4)
    p = logits_to_probs(runner.extend("p", CHAT, len(CHAT) - 1).logits, SamplingConfig(**CFG))[0].double()
    q = torch.softmax(runner.extend("p", CHAT, len(CHAT) - 1).logits[0] / 2.0, -1).double()
    support = torch.topk(q, 64).indices
    q_sparse = q[support] / q[support].sum()
    rng = np.random.default_rng(0)
    counts = collections.Counter()
    for seed in range(SAMPLES):
        draft = int(support[rng.choice(len(support), p=q_sparse.numpy())])
        reported = [1.0 / len(support)] * len(support) if lie else q_sparse.tolist()
        out = engine.verify(
            VerifyInput("s", CHAT, [draft], SamplingConfig(seed=seed, **CFG), [SparseDist(support.tolist(), reported)])
        )
        counts[(out.result.emitted([draft]))[0]] += 1
    observed = np.zeros(runner.vocab_width)
    for token, n in counts.items():
        observed[token] = n
    return observed, p.numpy()


def chi_square_pvalue(observed: np.ndarray, p: np.ndarray) -> float:
    expected = p * observed.sum()
    keep = expected >= MIN_EXPECTED
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def test_sampled_tokens_follow_the_targets_distribution_on_llamacpp_logits(runner):
    observed, p = first_tokens(runner, lie=False)
    assert chi_square_pvalue(observed, p) > ALPHA


def test_a_lying_draft_report_is_caught_on_llamacpp_logits(runner):
    observed, p = first_tokens(runner, lie=True)
    assert chi_square_pvalue(observed, p) < ALPHA
