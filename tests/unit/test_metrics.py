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
    state.inline_calls, state.forwards_on_loop = 6, True
    text = generate_latest(registry).decode()
    assert 'specdec_inline_calls_total{role="target"} 6.0' in text
    assert 'specdec_forwards_on_loop{role="target"} 1.0' in text
    assert 'specdec_prefill_chunks_total{role="target"} 4.0' in text
    assert 'specdec_forward_batches_total{role="target"} 3.0' in text
    assert 'specdec_batched_calls_total{role="target"} 9.0' in text
    assert 'specdec_calls_total{role="target"} 7.0' in text
    assert 'specdec_cache_hits_total{role="target"} 5.0' in text
    assert 'specdec_cache_evictions_total{role="target"} 2.0' in text
    assert 'specdec_cache_budget_bytes{role="target"} 1000.0' in text


def test_orchestrator_metrics_count_rounds_like_vllm():
    m = OrchestratorMetrics()
    m.observe_round(
        [5, 6, 7], num_accepted=2, kept=3, draft_ms=1, target_ms=2, overhead_ms=0.5, wall_ms=4, degraded=False
    )
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


def test_target_batch_fill_is_exported_from_the_batch_queue_counts():
    state = WorkerState(max_batch=8)
    registry = model_service_registry("target", lambda: state, lambda: None)
    assert (
        "specdec_batch_size" not in generate_latest(model_service_registry("draft", WorkerState, lambda: None)).decode()
    )
    for size in (1, 8, 8, 3):
        state.observe_batch(size, weight=0.5)
    text = generate_latest(registry).decode()
    assert 'specdec_max_batch{role="target"} 8.0' in text
    assert 'specdec_batch_size_bucket{le="1.0",role="target"} 1.0' in text
    assert 'specdec_batch_size_bucket{le="4.0",role="target"} 2.0' in text
    assert 'specdec_batch_size_bucket{le="8.0",role="target"} 4.0' in text
    assert 'specdec_batch_size_count{role="target"} 4.0' in text
    assert 'specdec_batch_size_sum{role="target"} 20.0' in text
    assert 'specdec_forward_batches_total{role="target"} 4.0' in text
    # recent fill, weight 0.5: 0 -> 1/16 -> 17/32 -> 49/64 -> 49/128 + 3/16
    assert state.recent_fill == 49 / 128 + 3 / 16
    assert f'specdec_batch_fill{{role="target"}} {49 / 128 + 3 / 16}' in text


def test_orchestrator_metrics_histogram_of_k_per_round_and_target_batch():
    m = OrchestratorMetrics()
    m.observe_load(k=4, target_batch=3, adaptive=False)
    m.observe_load(k=0, target_batch=0, adaptive=True)
    m.observe_load(k=2, target_batch=8, adaptive=True)
    text = generate_latest(m.registry).decode()
    assert 'specdec_spec_decode_k_count{mode="fixed"} 1.0' in text
    assert 'specdec_spec_decode_k_sum{mode="adaptive"} 2.0' in text
    assert 'specdec_spec_decode_k_bucket{le="0.0",mode="adaptive"} 1.0' in text
    assert "specdec_round_target_batch_size_count 2.0" in text  # batch 0 (not reported) left out
    assert "specdec_round_target_batch_size_sum 11.0" in text
