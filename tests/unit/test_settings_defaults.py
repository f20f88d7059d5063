"""Every configuration value a service starts with when its environment sets nothing (pinned values)."""

from __future__ import annotations

import os

import pytest

from specdec import config as c

MIB = 1024 * 1024

DEFAULTS = {
    c.TLSConfig: {"cert": "", "key": "", "ca": ""},
    c.ServerConfig: {
        "host": "127.0.0.1",
        "port": 0,
        "metrics_port": 0,
        "drain_seconds": 30.0,
        "max_message_bytes": 4 * MIB,
        "service_token": "",
    },
    c.HealthConfig: {"poll_s": 0.2, "wedged_s": 120.0, "fault_file": ""},
    c.KernelConfig: {
        "kernel": "auto",
        "budget_s": 2.0,
        "reps": 3,
        "probe_instances": 4,
        "check_atol": 2e-4,
        "check_atol_low": 2e-2,
        "layout_slack": 0.1,
        "allow_input_major": True,
        "band_rows": (1, 5, 17, 32),
        "busy_load_per_core": 1.0,
        "int4_max_rows": 32,
    },
    c.LlamaCppConfig: {
        "kv_tokens": 8192,
        "sessions": 64,
        "batch_tokens": 2048,
        "ubatch_tokens": 512,
        "flash_attn": True,
        "idle_tokens": 1024,
        "idle_seconds": 1.0,
    },
    c.RetryConfig: {
        "base_deadline_s": 10.0,
        "per_token_deadline_s": 0.05,
        "attempts": 3,
        "backoff_s": 0.05,
        "connect_timeout_s": 5.0,
        "min_deadline_s": 0.05,
        "reconnect_initial_s": 0.2,
        "reconnect_max_s": 2.0,
        "hop_delay_ms": 0.0,
    },
    c.LeaseConfig: {
        "seconds": 6.0,
        "renew_fraction": 3.0,
        "takeover_margin_s": 1.0,
        "poll_s": 0.1,
        "release_s": 0.001,
        "stop_wait_s": 5.0,
        "renew_s": 2.0,
        "takeover_wait_s": 7.0,
    },
    c.Limits: {
        "max_k": 16,
        "max_new_tokens": 4096,
        "max_prompt_tokens": 8192,
        "max_stop_strings": 8,
        "max_stop_chars": 256,
        "max_logprobs": 20,
        "max_message_bytes": 4 * MIB,
        "max_id_chars": 256,
    },
}

MODEL_SERVICE = {
    "draft_kind": "model",
    "device": "auto",
    "dtype": "auto",
    "engine": "auto",
    "threads": 0,
    "cache_dir": "",
    "offline": False,
    "cache_budget_bytes": 2 * 1024 * MIB,
    "prefix_share_min_tokens": 16,
    "max_k": 16,
    "max_batch": 8,
    "batch_wait_ms": 5.0,
    "inline_max_tokens": 16,
    "loop_forwards": -1,
    "prefill_chunk_tokens": 512,
    "prefill_turn_ms": 200.0,
    "context_store_tokens": 1 << 20,
    "ngram_min_n": 2,
    "ngram_max_n": 4,
    "ngram_prefer": "earliest",
    "keep_hidden": True,
    "row_invariant": "auto",
    "max_hidden_bytes": 2 * MIB,
}

ORCHESTRATOR = {
    "tokenizer": "embedded",
    "draft_addresses": "",
    "local_ngram": True,
    "context_store_tokens": 1 << 20,
    "ngram_min_n": 2,
    "ngram_max_n": 4,
    "ngram_prefer": "earliest",
    "target_addresses": "",
    "affinity_prompt_chars": 1024,
    "affinity_max_live": 4,
    "trace_rejected_rows": True,
    "decode_steps": 8,
    "decode_steps_ms": 200.0,
    "redis_url": "",
    "redis_prefix": "specdec:",
    "session_ttl_s": 86400,
    "max_concurrent": 64,
    "first_check_wait_s": 10.0,
    "health_refresh_s": 2.0,
    "redis_ping_timeout_s": 1.0,
    "auth_tokens": (),
    "cache_dir": "",
    "offline": False,
    "lease_s": 6.0,
}

GATEWAY = {
    "orchestrator": "127.0.0.1:50050",
    "host": "127.0.0.1",
    "port": 8000,
    "auth_tokens": (),
    "tls": False,
    "tls_ca": "",
    "request_timeout_s": 600.0,
    "max_message_bytes": 4 * MIB,
    "max_body_bytes": 4 * MIB,
    "max_n": 16,
}


@pytest.fixture
def bare_env(monkeypatch):
    """No SPECDEC_* or REDIS_* variable set."""
    for name in list(os.environ):
        if name.startswith(("SPECDEC_", "REDIS_")):
            monkeypatch.delenv(name)


def values(obj: object, names) -> dict:
    return {name: getattr(obj, name) for name in names}


@pytest.mark.parametrize("cls", list(DEFAULTS), ids=lambda cls: cls.__name__)
def test_each_part_starts_with_todays_defaults(bare_env, cls):
    assert values(cls(), DEFAULTS[cls]) == DEFAULTS[cls]


def test_model_services_start_with_todays_defaults(bare_env):
    target, draft = c.ModelServiceConfig(role="target"), c.ModelServiceConfig(role="draft")
    assert values(target, MODEL_SERVICE) == values(draft, MODEL_SERVICE) == MODEL_SERVICE
    assert (target.role, target.model, draft.role, draft.model) == (
        "target",
        "embedded",
        "draft",
        "embedded:smollm2-draft",
    )
    for part in ("server", "health", "kernels", "llamacpp"):
        part_cfg = getattr(target, part)
        assert values(part_cfg, DEFAULTS[type(part_cfg)]) == DEFAULTS[type(part_cfg)]


def test_the_orchestrator_starts_with_todays_defaults(bare_env):
    cfg = c.OrchestratorConfig()
    assert values(cfg, ORCHESTRATOR) == ORCHESTRATOR
    for part in ("server", "lease", "retry", "limits"):
        part_cfg = getattr(cfg, part)
        assert values(part_cfg, DEFAULTS[type(part_cfg)]) == DEFAULTS[type(part_cfg)]


def test_the_gateway_starts_with_todays_defaults(bare_env):
    from http_gateway.main import config_from_env

    assert values(config_from_env(), GATEWAY) == GATEWAY
