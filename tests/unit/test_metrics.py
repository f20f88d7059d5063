"""Metrics: collected separately from export, names in vLLM's style, counting what happened."""

from __future__ import annotations

from prometheus_client import generate_latest

from specdec.engine.kvcache import KVCachePool
from specdec.engine.worker import WorkerState
from specdec.metrics import OrchestratorMetrics, model_service_registry


def test_model_service_collector_reads_counters_at_scrape_time():
    state, pool = WorkerState(), KVCachePool(1000, 10)
    registry = model_service_registry("target", lambda: state, lambda: pool)
    state.calls, pool.counters.hits, pool.counters.evictions = 7, 5, 2
    state.batches, state.batched_calls, state.prefill_chunks = 3, 9, 4
    text = generate_latest(registry).decode()
    assert 'specdec_prefill_chunks_total{role="target"} 4.0' in text
    assert 'specdec_forward_batches_total{role="target"} 3.0' in text
    assert 'specdec_batched_calls_total{role="target"} 9.0' in text
    assert 'specdec_calls_total{role="target"} 7.0' in text
    assert 'specdec_cache_hits_total{role="target"} 5.0' in text
    assert 'specdec_cache_evictions_total{role="target"} 2.0' in text
    assert 'specdec_cache_budget_bytes{role="target"} 1000.0' in text


def test_orchestrator_metrics_count_rounds_like_vllm():
    m = OrchestratorMetrics()
    m.observe_round([5, 6, 7], num_accepted=2, kept=3, draft_ms=1, target_ms=2, overhead_ms=0.5, wall_ms=4,
                    degraded=False)
    m.observe_round([], num_accepted=0, kept=1, draft_ms=0, target_ms=2, overhead_ms=0.5, wall_ms=3, degraded=True)
    m.observe_generation("eos", ttft_ms=12.0)
    text = generate_latest(m.registry).decode()
    assert "specdec_spec_decode_num_drafts_total 1.0" in text
    assert "specdec_spec_decode_num_draft_tokens_total 3.0" in text
    assert "specdec_spec_decode_num_accepted_tokens_total 2.0" in text
    assert "specdec_spec_decode_num_emitted_tokens_total 4.0" in text
    assert 'specdec_spec_decode_num_accepted_tokens_per_pos_total{position="1"} 1.0' in text
    assert "specdec_degraded_rounds_total 1.0" in text
    assert 'specdec_generations_total{finish_reason="eos"} 1.0' in text
