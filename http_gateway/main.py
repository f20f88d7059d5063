"""`specdec serve http`: run the OpenAI-compatible gateway until SIGTERM/SIGINT.

Its settings (specdec.config.GatewaySettings; flags override them): SPECDEC_ORCHESTRATOR (orchestrator address),
SPECDEC_HTTP_HOST, SPECDEC_HTTP_PORT, SPECDEC_AUTH_TOKENS or SPECDEC_AUTH_TOKENS_FILE (comma-separated bearer
tokens; empty = no auth at the gateway, the token is still forwarded), SPECDEC_ORCHESTRATOR_TLS=1 and
SPECDEC_TLS_CA (TLS to the orchestrator), SPECDEC_HTTP_REQUEST_TIMEOUT (seconds, the gRPC deadline of one
generation), SPECDEC_HTTP_MAX_N (the largest OpenAI `n`), SPECDEC_MAX_MESSAGE_BYTES (shared with the services).
docs/configuration.md lists them with their defaults and ranges.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

from aiohttp import web

from http_gateway.app import GatewayConfig, build_app
from specdec.config import GatewaySettings


def config_from_env(**overrides: Any) -> GatewayConfig:
    """GatewayConfig from the environment (GatewaySettings), keyword arguments (flags; None = unset) over it.

    Raises:
        ConfigError: a setting cannot be used (the message names it and what it allows).
    """
    settings = GatewaySettings(**{name: value for name, value in overrides.items() if value is not None})
    return GatewayConfig(
        orchestrator=settings.orchestrator,
        host=settings.host,
        port=settings.port,
        auth_tokens=settings.auth_tokens,
        tls=settings.orchestrator_tls,
        tls_ca=settings.tls.ca,
        request_timeout_s=settings.request_timeout_s,
        max_message_bytes=settings.max_message_bytes,
        max_n=settings.max_n,
    )


async def serve(cfg: GatewayConfig) -> None:
    """Serve until SIGTERM/SIGINT, then let in-flight requests finish (aiohttp's shutdown timeout)."""
    runner = web.AppRunner(build_app(cfg), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port)
    await site.start()
    port = runner.addresses[0][1] if runner.addresses else cfg.port
    print(
        f"specdec http listening on http://{cfg.host}:{port} (orchestrator {cfg.orchestrator})",
        file=sys.stderr,
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
