"""Prometheus metrics: collected in the services, exported on /metrics, never mixed with logging.

Names follow vLLM's spec-decode metrics where one exists
(`specdec_spec_decode_num_drafts_total`, `..._num_draft_tokens_total`,
`..._num_accepted_tokens_total`, per-position accepted tokens).

* Model services export their engine's counters (KV-cache hits, misses,
  rollbacks, evictions, computed tokens, bytes in use) through a collector that
  reads them at scrape time: nothing on the hot path.
* The orchestrator observes each round and each generation (`OrchestratorMetrics`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

PREFIX = "specdec"
# Seconds: from 1 ms to ~30 s, for rounds and latencies on CPUs and GPUs alike.
LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
MAX_POSITIONS = 16
# Sessions per target forward pass, and k per round (draft tokens asked): small integers.
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
K_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16)
MS_PER_S = 1000.0


def serve_metrics(port: int, registry: CollectorRegistry, host: str = "0.0.0.0") -> None:
    """Export `registry` on http://host:port/metrics (no-op when port is 0)."""
    if port:
        start_http_server(port, addr=host, registry=registry)


class ModelServiceCollector:
    """Reads a model service's worker state and KV-cache pool at scrape time."""

    def __init__(
        self, role: str, state: Callable[[], Any], pool: Callable[[], Any], kernels: Callable[[], Any] | None = None
    ) -> None:
        self.role, self._state, self._pool = role, state, pool
        self._kernels = kernels or (lambda: None)

    def collect(self) -> Iterable[Any]:
        labels = {"role": self.role}
        state, pool = self._state(), self._pool()
        yield _counter("calls", "Propose/Verify calls served", state.calls, labels)
        yield _counter("call_failures", "calls that failed inside the model", state.failures, labels)
        yield _gauge("queue_depth", "calls waiting for or running on the model", state.in_flight, labels)
        yield _counter("forward_batches", "batched forward passes (target)", state.batches, labels)
        yield _counter(
            "batched_calls",
            "calls carried by batched passes (mean batch = this / forward_batches)",
            state.batched_calls,
            labels,
        )
        yield _counter(
            "inline_calls",
            "calls run on the event loop's thread (small ones while the model thread is "
            "idle, or every call with forwards on the loop)",
            state.inline_calls,
            labels,
        )
        yield _gauge(
            "forwards_on_loop",
            "1: every forward runs on the event loop, no model thread (SPECDEC_LOOP_FORWARDS)",
            int(state.forwards_on_loop),
            labels,
        )
        yield _counter(
            "prefill_chunks",
            "passes that prefilled one chunk of a long prompt (target, chunked prefill)",
            state.prefill_chunks,
            labels,
        )
        for name, ms, doc in (
            ("model_busy_seconds", state.busy_ms, "time the model ran calls"),
            ("prefill_pass_seconds", state.prefill_ms, "model time in passes that prefilled (target)"),
            (
                "batch_wait_seconds",
                state.batch_wait_ms,
                "time a batch waited for the previous batch's sessions to come back (target)",
            ),
        ):
            yield _counter(name, doc, ms / 1000.0, labels)
        yield _counter(
            "shed_calls",
            "prefills refused (RESOURCE_EXHAUSTED) because the queued work would outlast their deadline (target)",
            state.shed_calls,
            labels,
        )
        if state.max_batch:
            yield _gauge("max_batch", "sessions one forward pass may carry (target)", state.max_batch, labels)
            yield _gauge(
                "batch_fill",
                "recent sessions per forward pass / max_batch, exponentially weighted",
                state.recent_fill,
                labels,
            )
            yield _histogram(
                "batch_size",
                "sessions per batched forward pass (target)",
                state.batch_sizes,
                BATCH_SIZE_BUCKETS,
                labels,
            )
        yield from kernel_families(self._kernels(), labels)
        if pool is None:
            return
        c = pool.counters
        for name, value, doc in (
            ("cache_hits", c.hits, "calls that reused cached tokens"),
            ("cache_misses", c.misses, "calls that reused nothing"),
            ("cache_rollbacks", c.rollbacks, "calls that dropped rejected tokens"),
            ("cache_rolled_back_tokens", c.rolled_back_tokens, "tokens dropped"),
            ("cache_evictions", c.evictions, "sessions evicted to stay in budget"),
            ("cache_evicted_tokens", c.evicted_tokens, "positions those evictions dropped"),
            ("cache_reprefills", c.reprefills, "calls of an evicted session, which prefill it again"),
            ("cache_reprefill_tokens", c.reprefill_tokens, "positions those sessions held when evicted (recomputed)"),
            ("computed_tokens", c.computed_tokens, "tokens run through the model"),
            ("reused_tokens", c.reused_tokens, "tokens served from the KV cache"),
            (
                "cache_prefix_hits",
                c.prefix_hits,
                "new sessions started from another session's cached prefix (prefix sharing)",
            ),
            (
                "cache_prefix_shared_tokens",
                c.prefix_shared_tokens,
                "positions copied from another session's cache instead of computed",
            ),
        ):
            yield _counter(name, doc, value, labels)
        yield _gauge("cache_used_bytes", "KV-cache bytes in use", pool.used_bytes(), labels)
        yield _gauge("cache_budget_bytes", "KV-cache byte budget", pool.budget_bytes, labels)
        yield _gauge("cache_sessions", "sessions with a KV cache", pool.session_count(), labels)


def kernel_families(plan: Any, labels: dict[str, str]) -> Iterable[Any]:
    """The CPU linear kernels chosen at load (specdec/models/kernels.py KernelPlan): an info-style
    gauge of 1 per row-count band naming its kernel and how it was chosen, and the timings behind it
    (estimated linear ms of one forward per band and candidate)."""
    if plan is None:
        return
    names = [*labels, "band", "kernel", "source"]
    info = GaugeMetricFamily(
        f"{PREFIX}_linear_kernel_info", "CPU linear kernel chosen per row-count band", labels=names
    )
    timing = GaugeMetricFamily(
        f"{PREFIX}_linear_kernel_probe_ms",
        "estimated linear time of one forward per band and candidate kernel, timed at load",
        labels=[*labels, "band", "kernel"],
    )
    for band, kernel in plan.by_band().items():
        info.add_metric([*labels.values(), band, kernel, plan.source], 1.0)
        for candidate, ms in plan.timings_ms.get(band, {}).items():
            timing.add_metric([*labels.values(), band, candidate], ms)
    yield info
    yield timing


def _counter(name: str, doc: str, value: float, labels: dict[str, str]) -> CounterMetricFamily:
    family = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def _gauge(name: str, doc: str, value: float, labels: dict[str, str]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def _histogram(
    name: str, doc: str, counts: dict[int, int], buckets: tuple[int, ...], labels: dict[str, str]
) -> HistogramMetricFamily:
    """A histogram from {value: times seen}, built at scrape time (cumulative buckets, +Inf, sum)."""
    family = HistogramMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))
    seen = dict(counts)  # a snapshot: the model thread may add a batch meanwhile
    cumulative = [(str(float(b)), sum(n for v, n in seen.items() if v <= b)) for b in buckets]
    family.add_metric(
        list(labels.values()),
        cumulative + [("+Inf", sum(seen.values()))],
        sum_value=sum(v * n for v, n in seen.items()),
    )
    return family


def model_service_registry(
    role: str, state: Callable[[], Any], pool: Callable[[], Any], kernels: Callable[[], Any] | None = None
) -> CollectorRegistry:
    """A registry exporting one model service's counters (and its kernel plan, when given)."""
    registry = CollectorRegistry()
    registry.register(ModelServiceCollector(role, state, pool, kernels))
    return registry


class OrchestratorMetrics:
    """Counters and histograms the orchestrator updates per round and per generation."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r, p = self.registry, f"{PREFIX}_spec_decode"
        self.drafts = Counter(f"{p}_num_drafts", "rounds with a draft", registry=r)
        self.draft_tokens = Counter(f"{p}_num_draft_tokens", "draft tokens proposed", registry=r)
        self.accepted_tokens = Counter(f"{p}_num_accepted_tokens", "draft tokens accepted", registry=r)
        self.emitted_tokens = Counter(
            f"{p}_num_emitted_tokens",
            "tokens the rounds emitted (recovered/bonus included, nothing after a cut)",
            registry=r,
        )
        self.accepted_per_pos = Counter(
            f"{p}_num_accepted_tokens_per_pos", "accepted at position", ["position"], registry=r
        )
        self.degraded_rounds = Counter(f"{PREFIX}_degraded_rounds", "rounds run target-only: no draft", registry=r)
        self.generations = Counter(f"{PREFIX}_generations", "finished generations", ["finish_reason"], registry=r)
        self.round_seconds = Histogram(
            f"{PREFIX}_round_seconds", "time per round by part", ["part"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.ttft = Histogram(
            f"{PREFIX}_time_to_first_token_seconds", "time to first token", buckets=LATENCY_BUCKETS, registry=r
        )
        self.itl = Histogram(
            f"{PREFIX}_inter_token_latency_seconds",
            "round time / tokens it yielded",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(f"{PREFIX}_generations_in_flight", "admitted generations running", registry=r)
        self.rejected = Counter(f"{PREFIX}_admission_rejected", "requests refused at admission", registry=r)
        self.k_per_round = Histogram(
            f"{p}_k", "draft tokens asked per round (adaptive: the k it chose)", ["mode"], buckets=K_BUCKETS, registry=r
        )
        self.context_resends = Counter(
            f"{PREFIX}_context_resends",
            "calls resent with the whole context after a replica's context miss "
            "(delta rounds: evicted, restarted or another replica)",
            ["role"],
            registry=r,
        )
        self.routes = Counter(
            f"{PREFIX}_generation_routes",
            "generations by what routed them to replicas: their "
            "session id, their conversation's opening, or one of its further routes (more than "
            "SPECDEC_AFFINITY_MAX_LIVE in flight; orchestrator/affinity.py)",
            ["by"],
            registry=r,
        )
        self.target_batch = Histogram(
            f"{PREFIX}_round_target_batch_size",
            "sessions the target verified in the same forward pass as this round",
            buckets=BATCH_SIZE_BUCKETS,
            registry=r,
        )

    def observe_round(
        self,
        draft_ids: list[int],
        num_accepted: int,
        kept: int,
        draft_ms: float,
        target_ms: float,
        overhead_ms: float,
        wall_ms: float,
        degraded: bool,
    ) -> None:
        """Account for one round: `draft_ids` and `num_accepted` as counted up to the cut, `kept` tokens emitted."""
        if draft_ids:
            self.drafts.inc()
            self.draft_tokens.inc(len(draft_ids))
            self.accepted_tokens.inc(num_accepted)
            for i in range(min(num_accepted, MAX_POSITIONS)):
                self.accepted_per_pos.labels(position=str(i)).inc()
        self.emitted_tokens.inc(kept)
        self.degraded_rounds.inc(degraded)
        for part, ms in (("draft", draft_ms), ("verify", target_ms), ("overhead", overhead_ms)):
            self.round_seconds.labels(part=part).observe(ms / MS_PER_S)
        if kept:
            self.itl.observe(wall_ms / MS_PER_S / kept)

    def observe_context_resend(self, role: str) -> None:
        """One call of the `role` pool resent with the whole context (ReplicaPool.on_context_resend)."""
        self.context_resends.labels(role=role).inc()

    def observe_load(self, k: int, target_batch: int, adaptive: bool) -> None:
        """The k a round asked for and the target batch it rode in (0: not reported, e.g. a degraded round)."""
        self.k_per_round.labels(mode="adaptive" if adaptive else "fixed").observe(k)
        if target_batch > 0:
            self.target_batch.observe(target_batch)

    def observe_generation(self, finish_reason: str, ttft_ms: float) -> None:
        """Account for a finished generation."""
        self.generations.labels(finish_reason=finish_reason).inc()
        if ttft_ms:
            self.ttft.observe(ttft_ms / MS_PER_S)
