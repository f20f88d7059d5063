"""The settings refuse values they cannot use, by variable name and with what is allowed; flags win over the
environment; the gateway reads the settings the orchestrator shares; `specdec serve` says one line and exits 2."""

from __future__ import annotations

import os

import pytest

from specdec import cli
from specdec.config import ModelServiceConfig, OrchestratorConfig, ServerConfig, TLSConfig
from specdec.healthcheck import main as healthcheck_main


@pytest.fixture(autouse=True)
def bare_env(monkeypatch):
    """No SPECDEC_* or REDIS_* variable set but the ones a test sets."""
    for name in list(os.environ):
        if name.startswith(("SPECDEC_", "REDIS_")):
            monkeypatch.delenv(name)


def test_a_value_that_is_not_a_number_names_its_variable(monkeypatch):
    monkeypatch.setenv("SPECDEC_MAX_BATCH", "eight")
    with pytest.raises(ValueError, match=r"SPECDEC_MAX_BATCH='eight': Input should be a valid integer.*integer >= 1"):
        ModelServiceConfig(role="target")
    monkeypatch.setenv("SPECDEC_MAX_BATCH", "8")
    monkeypatch.setenv("SPECDEC_DRAIN_SECONDS", "nan")
    with pytest.raises(ValueError, match=r"SPECDEC_DRAIN_SECONDS='nan': .*finite number"):
        ServerConfig()


@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [
        ("SPECDEC_METRICS_PORT", "70000", "integer from 0 to 65535"),
        ("SPECDEC_THREADS", "-1", "integer >= 0"),
        ("SPECDEC_LOOP_FORWARDS", "2", "integer from -1 to 1"),
        ("SPECDEC_LEASE_SECONDS", "0", "number > 0"),
        ("SPECDEC_MAX_CONCURRENT", "0", "integer >= 1"),
        ("SPECDEC_DECODE_STEPS_MS", "-1", "number >= 0"),
    ],
)
def test_a_value_out_of_range_is_refused_with_the_range(monkeypatch, name, value, allowed):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=rf"{name}='{value}': .*\(allowed: {allowed}\)"):
        orchestrator = ("SPECDEC_LEASE_SECONDS", "SPECDEC_MAX_CONCURRENT", "SPECDEC_DECODE_STEPS_MS")
        OrchestratorConfig() if name in orchestrator else ModelServiceConfig()


@pytest.mark.parametrize(
    ("name", "value", "choices"),
    [
        ("SPECDEC_NGRAM_PREFER", "middle", "earliest, recent"),
        ("SPECDEC_DRAFT_KIND", "bigram", "model, ngram, combined"),
        ("SPECDEC_ENGINE", "tensorrt", "auto, torch, llamacpp"),
        ("SPECDEC_ROW_INVARIANT", "sometimes", "auto, on, off"),
        ("SPECDEC_OFFLINE", "maybe", r"boolean \(1/0, true/false, yes/no, on/off\)"),
    ],
)
def test_an_unknown_choice_is_refused_listing_the_choices(monkeypatch, name, value, choices):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=rf"{name}='{value}': .*\(allowed: (one of )?{choices}\)"):
        ModelServiceConfig(role="draft")


def test_choices_and_booleans_are_read_as_people_write_them(monkeypatch):
    monkeypatch.setenv("SPECDEC_ENGINE", " LlamaCpp ")
    monkeypatch.setenv("SPECDEC_KEEP_HIDDEN", "off")
    monkeypatch.setenv("SPECDEC_OFFLINE", "YES")
    monkeypatch.setenv("SPECDEC_MAX_BATCH", "")  # empty: the default
    cfg = ModelServiceConfig(role="target")
    assert (cfg.engine, cfg.keep_hidden, cfg.offline, cfg.max_batch) == ("llamacpp", False, True, 8)


def test_rules_over_several_settings_name_them(monkeypatch):
    monkeypatch.setenv("SPECDEC_NGRAM_MIN_N", "5")
    with pytest.raises(ValueError, match=r"SPECDEC_NGRAM_MIN_N \(5\) must not exceed SPECDEC_NGRAM_MAX_N \(4\)"):
        OrchestratorConfig()
    monkeypatch.delenv("SPECDEC_NGRAM_MIN_N")
    monkeypatch.setenv("SPECDEC_TLS_CERT", "/pki/cert.pem")
    with pytest.raises(ValueError, match="SPECDEC_TLS_CERT and SPECDEC_TLS_KEY .* together"):
        TLSConfig()


def test_keyword_arguments_win_over_the_environment_and_assignments_are_checked(monkeypatch):
    monkeypatch.setenv("SPECDEC_MODEL", "hf:org/from-env")
    monkeypatch.setenv("SPECDEC_THREADS", "2")
    assert ModelServiceConfig(role="target").threads == 2
    cfg = ModelServiceConfig(role="target", model="hf:org/from-code", threads=3)
    assert (cfg.model, cfg.threads) == ("hf:org/from-code", 3)
    with pytest.raises(ValueError, match=r"port=70000: .*\(allowed: integer from 0 to 65535\)"):
        cfg.server.port = 70000


def test_secrets_stay_out_of_reprs_and_errors(monkeypatch):
    monkeypatch.setenv("SPECDEC_SERVICE_TOKEN", "svc-secret")
    monkeypatch.setenv("REDIS_URL", "redis://redis:6379/0")
    monkeypatch.setenv("REDIS_PASSWORD", "pw-secret")
    monkeypatch.setenv("SPECDEC_AUTH_TOKENS", "client-secret")
    cfg = OrchestratorConfig()
    assert cfg.redis_url == "redis://:pw-secret@redis:6379/0" and cfg.auth_tokens == ("client-secret",)
    assert "secret" not in repr(cfg)


def serve_args(monkeypatch, role: str) -> list:
    """Run `specdec serve ROLE` without serving: the configuration its serve() was given is appended here."""
    import orchestrator.main
    import target_service.main

    seen = []

    async def fake_serve(cfg):
        seen.append(cfg)

    monkeypatch.setattr(target_service.main if role == "target" else orchestrator.main, "serve", fake_serve)
    return seen


def test_serve_flags_override_the_environment(monkeypatch):
    seen = serve_args(monkeypatch, "target")
    assert cli.main(["serve", "target"]) == 0
    assert (seen[-1].server.port, seen[-1].threads) == (cli.DEFAULT_TARGET_PORT, 0)  # the role's port
    monkeypatch.setenv("SPECDEC_PORT", "6001")
    monkeypatch.setenv("SPECDEC_THREADS", "2")
    monkeypatch.setenv("SPECDEC_METRICS_PORT", "9001")
    assert cli.main(["serve", "target"]) == 0
    assert (seen[-1].server.port, seen[-1].threads, seen[-1].server.metrics_port) == (6001, 2, 9001)
    assert cli.main(["serve", "target", "--port", "7001", "--threads", "3", "--metrics-port", "0"]) == 0
    assert (seen[-1].server.port, seen[-1].threads, seen[-1].server.metrics_port) == (7001, 3, 0)
    monkeypatch.setenv("SPECDEC_PORT", "0")  # 0: any free port, as before
    assert cli.main(["serve", "target"]) == 0 and seen[-1].server.port == 0


def test_serve_says_one_line_and_exits_2_on_a_bad_setting(monkeypatch, capsys):
    seen = serve_args(monkeypatch, "orchestrator")
    monkeypatch.setenv("SPECDEC_SESSION_TTL", "1h")
    assert cli.main(["serve", "orchestrator"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert err.startswith("specdec serve orchestrator: invalid configuration: SPECDEC_SESSION_TTL='1h': ")
    assert len(err.splitlines()) == 1 and "Traceback" not in err and not seen
    monkeypatch.delenv("SPECDEC_SESSION_TTL")
    assert cli.main(["serve", "orchestrator", "--max-concurrent", "0"]) == cli.EXIT_USAGE
    assert "max_concurrent=0: " in capsys.readouterr().err


def test_the_gateway_reads_the_shared_settings(monkeypatch, tmp_path):
    from http_gateway.main import config_from_env
    from specdec.config import GatewaySettings
    from specdec.settings.shared import ClientAuth, MessageSize

    assert issubclass(GatewaySettings, ClientAuth) and issubclass(GatewaySettings, MessageSize)
    (tmp_path / "tokens").write_text("a,b\n", encoding="utf-8")
    monkeypatch.setenv("SPECDEC_AUTH_TOKENS_FILE", str(tmp_path / "tokens"))
    monkeypatch.setenv("SPECDEC_MAX_MESSAGE_BYTES", str(8 << 20))
    monkeypatch.setenv("SPECDEC_TLS_CA", "/pki/ca.pem")
    monkeypatch.setenv("SPECDEC_HTTP_PORT", "8100")
    gateway, orchestrator = config_from_env(), OrchestratorConfig()
    assert gateway.auth_tokens == orchestrator.auth_tokens == ("a", "b")
    assert gateway.max_message_bytes == orchestrator.server.max_message_bytes == 8 << 20
    assert gateway.tls_ca == orchestrator.server.tls.ca == "/pki/ca.pem"
    assert (gateway.port, config_from_env(port=9100, host=None).port) == (8100, 9100)  # a flag wins, None = unset
    monkeypatch.setenv("SPECDEC_HTTP_MAX_N", "0")
    with pytest.raises(ValueError, match=r"SPECDEC_HTTP_MAX_N='0': .*\(allowed: integer >= 1\)"):
        config_from_env()


def test_the_healthcheck_names_a_bad_port_variable(monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_PORT", "fifty")
    with pytest.raises(SystemExit) as exit_info:
        healthcheck_main([])
    assert exit_info.value.code == 2
    assert "SPECDEC_PORT='fifty'" in capsys.readouterr().err
