"""The settings of the OpenAI-compatible HTTP gateway (http_gateway/): where the orchestrator is, how to reach it,
what the gateway accepts. Client tokens, the CA and the gRPC message size are the shared settings the
orchestrator reads too."""

from __future__ import annotations

from pydantic import Field

from specdec.settings.base import DEFAULT_ORCHESTRATOR_PORT, MAX_PORT, env
from specdec.settings.shared import ClientAuth, MessageSize, TLSConfig

DEFAULT_HTTP_PORT = 8000
DEFAULT_MAX_N = 16


class GatewaySettings(ClientAuth, MessageSize):
    """`specdec serve http`: the gateway's own variables plus the shared client tokens, TLS and message size."""

    orchestrator: str = env(
        "SPECDEC_ORCHESTRATOR",
        f"127.0.0.1:{DEFAULT_ORCHESTRATOR_PORT}",
        "HTTP gateway: the orchestrator's gRPC address.",
    )
    host: str = env("SPECDEC_HTTP_HOST", "127.0.0.1", "HTTP gateway: the address it listens on.")
    port: int = env(
        "SPECDEC_HTTP_PORT",
        DEFAULT_HTTP_PORT,
        "HTTP gateway: the port it listens on (0 = any free port); `python -m specdec.healthcheck --http` checks it.",
        ge=0,
        le=MAX_PORT,
    )
    orchestrator_tls: bool = env(
        "SPECDEC_ORCHESTRATOR_TLS",
        False,
        "HTTP gateway: TLS to the orchestrator (verified with SPECDEC_TLS_CA, else the system roots).",
    )
    tls: TLSConfig = Field(default_factory=TLSConfig)
    request_timeout_s: float = env(
        "SPECDEC_HTTP_REQUEST_TIMEOUT", 600.0, "HTTP gateway: the gRPC deadline of one generation, in seconds.", gt=0
    )
    max_n: int = env(
        "SPECDEC_HTTP_MAX_N",
        DEFAULT_MAX_N,
        "HTTP gateway: the largest OpenAI `n` (choices per request, each one generation).",
        ge=1,
    )
