"""Configuration of the services, read from the environment (CLI flags override it).

Every limit the system enforces is named here (no magic numbers in code). The settings are typed, range-checked
pydantic-settings models (specdec/settings/): a value that cannot be used stops the service at startup with one
line naming the variable and what it allows (:class:`ConfigError`). docs/configuration.md lists every variable,
written from the models by ``python -m specdec.settings.docs``.

Secrets (SPECDEC_AUTH_TOKENS, SPECDEC_SERVICE_TOKEN, SPECDEC_TOKEN, REDIS_URL, REDIS_PASSWORD) can instead be read
from files, as Kubernetes and compose mount them: NAME_FILE=/path (see env_secret). REDIS_PASSWORD (or
REDIS_PASSWORD_FILE) fills in the password of a REDIS_URL that has none.
"""

from __future__ import annotations

from specdec.settings.base import (
    DEFAULT_DRAFT_PORT,
    DEFAULT_ORCHESTRATOR_PORT,
    DEFAULT_TARGET_PORT,
    GIB,
    MIB,
    ConfigError,
    env_secret,
    redis_url_from_env,
)
from specdec.settings.gateway import GatewaySettings
from specdec.settings.model_service import (
    DEFAULT_MODELS,
    KERNEL_BAND_ROWS,
    KernelConfig,
    LlamaCppConfig,
    ModelServiceConfig,
)
from specdec.settings.orchestrator import LeaseConfig, OrchestratorConfig, RedisSettings, RetryConfig
from specdec.settings.shared import (
    DEFAULT_CONTEXT_STORE_TOKENS,
    NGRAM_MAX_N,
    NGRAM_MIN_N,
    CommandSettings,
    HealthConfig,
    Limits,
    ServerConfig,
    TLSConfig,
)

__all__ = [
    "DEFAULT_CONTEXT_STORE_TOKENS",
    "DEFAULT_DRAFT_PORT",
    "DEFAULT_MODELS",
    "DEFAULT_ORCHESTRATOR_PORT",
    "DEFAULT_TARGET_PORT",
    "GIB",
    "KERNEL_BAND_ROWS",
    "MIB",
    "NGRAM_MAX_N",
    "NGRAM_MIN_N",
    "CommandSettings",
    "ConfigError",
    "GatewaySettings",
    "HealthConfig",
    "KernelConfig",
    "LeaseConfig",
    "Limits",
    "LlamaCppConfig",
    "ModelServiceConfig",
    "OrchestratorConfig",
    "RedisSettings",
    "RetryConfig",
    "ServerConfig",
    "TLSConfig",
    "env_secret",
    "redis_url_from_env",
]
