"""Secrets from files (NAME_FILE, as Kubernetes and compose mount them) and the Redis password."""

from __future__ import annotations

import pytest

from specdec.config import OrchestratorConfig, ServerConfig, env_secret, redis_url_from_env
from specdec.healthcheck import main as healthcheck_main


def test_variable_wins_then_file_then_default(tmp_path, monkeypatch):
    secret = tmp_path / "token"
    secret.write_text("from-file\n", encoding="utf-8")
    monkeypatch.setenv("X_TOKEN_FILE", str(secret))
    assert env_secret("X_TOKEN") == "from-file"
    monkeypatch.setenv("X_TOKEN", "from-env")
    assert env_secret("X_TOKEN") == "from-env"
    monkeypatch.delenv("X_TOKEN")
    monkeypatch.delenv("X_TOKEN_FILE")
    assert env_secret("X_TOKEN", "default") == "default"


def test_unreadable_secret_file_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("X_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="X_TOKEN_FILE=.*missing"):
        env_secret("X_TOKEN")


def test_service_and_client_tokens_read_files(tmp_path, monkeypatch):
    (tmp_path / "service").write_text("svc", encoding="utf-8")
    (tmp_path / "clients").write_text("a,b", encoding="utf-8")
    monkeypatch.delenv("SPECDEC_SERVICE_TOKEN", raising=False)
    monkeypatch.delenv("SPECDEC_AUTH_TOKENS", raising=False)
    monkeypatch.setenv("SPECDEC_SERVICE_TOKEN_FILE", str(tmp_path / "service"))
    monkeypatch.setenv("SPECDEC_AUTH_TOKENS_FILE", str(tmp_path / "clients"))
    assert ServerConfig().service_token == "svc"
    assert OrchestratorConfig().auth_tokens == ("a", "b")


def test_redis_password_fills_a_url_without_one(tmp_path, monkeypatch):
    (tmp_path / "pw").write_text("p@ss/word", encoding="utf-8")
    monkeypatch.delenv("REDIS_PASSWORD", raising=False)
    monkeypatch.setenv("REDIS_URL", "redis://redis:6379/0")
    monkeypatch.setenv("REDIS_PASSWORD_FILE", str(tmp_path / "pw"))
    assert redis_url_from_env() == "redis://:p%40ss%2Fword@redis:6379/0"
    monkeypatch.setenv("REDIS_URL", "redis://:own@redis:6379/0")
    assert redis_url_from_env() == "redis://:own@redis:6379/0"  # a URL's own password is kept
    monkeypatch.delenv("REDIS_PASSWORD_FILE")
    monkeypatch.setenv("REDIS_URL", "redis://redis:6379/0")
    assert redis_url_from_env() == "redis://redis:6379/0"


def test_healthcheck_port_comes_from_the_environment(monkeypatch, capsys):
    monkeypatch.delenv("SPECDEC_PORT", raising=False)
    with pytest.raises(SystemExit):
        healthcheck_main([])
    monkeypatch.setenv("SPECDEC_PORT", "1")  # nothing listens on port 1
    assert healthcheck_main(["--timeout", "1"]) == 1
    assert "UNAVAILABLE" in capsys.readouterr().out
    monkeypatch.setenv("SPECDEC_HTTP_PORT", "1")
    assert healthcheck_main(["--http", "--timeout", "1"]) == 1
    assert "Error" in capsys.readouterr().out
