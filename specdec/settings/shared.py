"""The parts several services share: TLS, the gRPC server, health, request limits, client tokens, the model
cache, the context store with its n-gram lookup, and what the command line itself reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, model_validator

from specdec.settings.base import MAX_GRPC_MESSAGE_BYTES, MAX_PORT, MIB, SpecdecSettings, comma_list, env

DEFAULT_CONTEXT_STORE_TOKENS = 1 << 20  # delta rounds: context tokens a model service keeps (about 50 MB)
# N-gram draft: a 1-token match of the context's tail is usually wrong on open-ended text (simulated on
# the target's own greedy continuations of the bench prompts at k = 4, min_n = 1 drafted 137 of 286 open
# rounds at acceptance 0.07, min_n = 2 32 at 0.20, with a mean accepted length of 2.27 vs 2.36 grounded).
NGRAM_MIN_N = 2
NGRAM_MAX_N = 4
AUTO, OFF, ON = -1, 0, 1  # the three-way switches: -1 = auto, 0 = off, 1 = on


class TLSConfig(SpecdecSettings):
    """Optional TLS/mTLS: server cert+key, and a CA to verify peers (mTLS) or servers (client side)."""

    cert: str = env("SPECDEC_TLS_CERT", "", "TLS certificate file (PEM); with SPECDEC_TLS_KEY turns TLS on.")
    key: str = env("SPECDEC_TLS_KEY", "", "TLS private key file (PEM) of SPECDEC_TLS_CERT.")
    ca: str = env(
        "SPECDEC_TLS_CA",
        "",
        "CA bundle (PEM): a server with a certificate requires client "
        "certificates signed by it (mTLS); a client verifies servers with it (TLS on when set).",
    )

    @property
    def enabled(self) -> bool:
        """True when a certificate and key are configured."""
        return bool(self.cert and self.key)

    @model_validator(mode="after")
    def _cert_and_key_together(self) -> TLSConfig:
        if bool(self.cert) != bool(self.key):
            raise ValueError(
                "SPECDEC_TLS_CERT and SPECDEC_TLS_KEY (--tls-cert, --tls-key) are set together or not at "
                f"all (cert={self.cert!r}, key={self.key!r})"
            )
        return self


class MessageSize(SpecdecSettings):
    """The largest gRPC message a process sends or receives."""

    max_message_bytes: int = env(
        "SPECDEC_MAX_MESSAGE_BYTES", 4 * MIB, "Largest gRPC message sent or received.", ge=1, le=MAX_GRPC_MESSAGE_BYTES
    )


class ServerConfig(MessageSize):
    """What every gRPC service shares: address, metrics, drain, message size, security."""

    host: str = env("SPECDEC_HOST", "127.0.0.1", "Address a gRPC service listens on.")
    port: int = Field(0, ge=0, le=MAX_PORT)  # set by `specdec serve` from --port, SPECDEC_PORT or the role's port
    metrics_port: int = env(
        "SPECDEC_METRICS_PORT", 0, "Port of the Prometheus /metrics endpoint (0 = off).", ge=0, le=MAX_PORT
    )
    drain_seconds: float = env("SPECDEC_DRAIN_SECONDS", 30.0, "On SIGTERM: how long in-flight calls may finish.", ge=0)
    service_token: str = env(
        "SPECDEC_SERVICE_TOKEN",
        "",
        "Bearer token the model services require and the "
        "orchestrator presents to them (empty = none); or SPECDEC_SERVICE_TOKEN_FILE.",
        secret=True,
    )
    tls: TLSConfig = Field(default_factory=TLSConfig)


class HealthConfig(SpecdecSettings):
    """When a model service reports NOT_SERVING besides loading and draining.

    poll_s: how often the health watcher looks at the model worker.
    wedged_s: a forward running longer than this marks the service NOT_SERVING (0 = never).
    fault_file: chaos/testing hook, off unless set: while this file exists, every forward
        fails with RuntimeError (a real failure of the worker, used by the reliability tests).
    """

    poll_s: float = Field(0.2, gt=0)
    wedged_s: float = env(
        "SPECDEC_HEALTH_WEDGED_SECONDS",
        120.0,
        "A forward running longer than this marks the model service NOT_SERVING (0 = never).",
        ge=0,
    )
    fault_file: str = env("SPECDEC_FAULT_FILE", "", "Testing only: while this file exists every forward fails.")


@dataclass
class Limits:
    """Named limits enforced on requests (INVALID_ARGUMENT / RESOURCE_EXHAUSTED beyond them); fixed, not read from
    the environment."""

    max_k: int = 16
    max_new_tokens: int = 4096
    max_prompt_tokens: int = 8192
    max_stop_strings: int = 8
    max_stop_chars: int = 256
    max_logprobs: int = 20
    max_message_bytes: int = 4 * MIB
    max_id_chars: int = 256  # session_id / request_id length


class ClientAuth(SpecdecSettings):
    """The bearer tokens a public entry point (orchestrator, HTTP gateway) accepts from clients."""

    auth_tokens: Annotated[tuple[str, ...], BeforeValidator(comma_list)] = env(
        "SPECDEC_AUTH_TOKENS",
        (),
        "Comma-separated bearer tokens clients must present (empty = no auth); or "
        "SPECDEC_AUTH_TOKENS_FILE. The gateway forwards the client's token to the orchestrator.",
        secret=True,
    )


class ModelCache(SpecdecSettings):
    """Where models and tokenizers are cached, and whether they may be downloaded."""

    cache_dir: str = env("SPECDEC_MODEL_CACHE_DIR", "", "Model cache directory (empty = ~/.cache/specdec).")
    offline: bool = env(
        "SPECDEC_OFFLINE", False, "Never download models (HF_HUB_OFFLINE and MODELSCOPE_OFFLINE count too)."
    )


class ContextSettings(SpecdecSettings):
    """The context store of delta rounds and the n-gram lookup, the same on the orchestrator and the services."""

    context_store_tokens: int = env(
        "SPECDEC_CONTEXT_STORE_TOKENS",
        DEFAULT_CONTEXT_STORE_TOKENS,
        "Delta rounds: the most context tokens kept "
        "over all sessions (about 50 bytes each) so that Propose/Verify carry only new tokens; least recently used "
        "sessions are dropped first. 0 = keep none (Info does not offer the delta form).",
        ge=0,
    )
    ngram_min_n: int = env(
        "SPECDEC_NGRAM_MIN_N",
        NGRAM_MIN_N,
        "The shortest context tail the n-gram draft matches (1-token matches are mostly wrong on open text).",
        ge=1,
    )
    ngram_max_n: int = env("SPECDEC_NGRAM_MAX_N", NGRAM_MAX_N, "The longest context tail the n-gram draft tries.", ge=1)
    ngram_prefer: Literal["earliest", "recent"] = env(
        "SPECDEC_NGRAM_PREFER", "earliest", "Which earlier occurrence of the context's tail the n-gram draft continues."
    )

    @model_validator(mode="after")
    def _min_n_at_most_max_n(self) -> ContextSettings:
        if self.ngram_min_n > self.ngram_max_n:
            raise ValueError(
                f"SPECDEC_NGRAM_MIN_N ({self.ngram_min_n}) must not exceed SPECDEC_NGRAM_MAX_N ({self.ngram_max_n})"
            )
        return self


class CommandSettings(SpecdecSettings):
    """What the command line reads: `specdec serve`'s port, the healthcheck's ports, `specdec generate`'s token."""

    port: int | None = env(
        "SPECDEC_PORT",
        None,
        "gRPC port of `specdec serve` (default: orchestrator 50050, "
        "draft 50051, target 50052; 0 = any free port); `python -m specdec.healthcheck` checks "
        "it.",
        ge=0,
        le=MAX_PORT,
    )
    http_port: int | None = env(
        "SPECDEC_HTTP_PORT", None, "Port `python -m specdec.healthcheck --http` checks.", ge=0, le=MAX_PORT
    )
    token: str = env(
        "SPECDEC_TOKEN",
        "",
        "`specdec generate`: the bearer token sent (or --token); or SPECDEC_TOKEN_FILE.",
        secret=True,
    )
