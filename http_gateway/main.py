"""`specdec serve http`: run the OpenAI-compatible gateway until SIGTERM/SIGINT.

Environment (flags override): SPECDEC_ORCHESTRATOR (orchestrator address),
SPECDEC_HTTP_HOST, SPECDEC_HTTP_PORT, SPECDEC_AUTH_TOKENS or SPECDEC_AUTH_TOKENS_FILE (comma-separated bearer
tokens; empty = no auth at the gateway, the token is still forwarded),
SPECDEC_ORCHESTRATOR_TLS=1 and SPECDEC_TLS_CA (TLS to the orchestrator),
SPECDEC_HTTP_REQUEST_TIMEOUT (seconds, the gRPC deadline of one generation),
SPECDEC_HTTP_MAX_N (the largest OpenAI `n`, choices per request; default 16).
"""

from __future__ import annotations

import asyncio
import signal
import sys

from aiohttp import web

from specdec.config import env_bool, env_float, env_int, env_secret, env_str

from http_gateway.app import GatewayConfig, build_app

DEFAULT_HTTP_PORT = 8000


def config_from_env() -> GatewayConfig:
    """GatewayConfig from the environment."""
    return GatewayConfig(
        orchestrator=env_str("SPECDEC_ORCHESTRATOR", "127.0.0.1:50050"),
        host=env_str("SPECDEC_HTTP_HOST", "127.0.0.1"),
        port=env_int("SPECDEC_HTTP_PORT", DEFAULT_HTTP_PORT),
        auth_tokens=tuple(t for t in env_secret("SPECDEC_AUTH_TOKENS").split(",") if t),
        tls=env_bool("SPECDEC_ORCHESTRATOR_TLS"),
        tls_ca=env_str("SPECDEC_TLS_CA"),
        request_timeout_s=env_float("SPECDEC_HTTP_REQUEST_TIMEOUT", 600.0),
        max_n=env_int("SPECDEC_HTTP_MAX_N", GatewayConfig.max_n),
    )


async def serve(cfg: GatewayConfig) -> None:
    """Serve until SIGTERM/SIGINT, then let in-flight requests finish (aiohttp's shutdown timeout)."""
    runner = web.AppRunner(build_app(cfg), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port)
    await site.start()
    port = site._server.sockets[0].getsockname()[1] if site._server and site._server.sockets else cfg.port
    print(f"specdec http listening on http://{cfg.host}:{port} (orchestrator {cfg.orchestrator})",
          file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
