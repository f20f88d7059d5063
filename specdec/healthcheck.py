"""`python -m specdec.healthcheck [--port N]`: exit 0 when the gRPC health service says SERVING.

Used by the Docker HEALTHCHECK and by `specdec up` to wait for services. Without --port
it checks $SPECDEC_PORT (so an image's exec-form HEALTHCHECK needs no shell). `--http`
checks the OpenAI gateway instead: GET /health on --port, else $SPECDEC_HTTP_PORT, answers
200 only when the orchestrator behind it is SERVING. With
SPECDEC_TLS_CA set (as in the service's own environment) it speaks TLS, presenting
SPECDEC_TLS_CERT/KEY as a client certificate when the service requires mTLS.
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specdec.config import CommandSettings, ConfigError, TLSConfig
from specdec.server.tls import channel_credentials

DEFAULT_TIMEOUT_S = 3.0
HTTP_OK = 200


def channel_for(address: str, tls: TLSConfig | None = None) -> grpc.Channel:
    """A blocking channel: TLS (with a client certificate for mTLS) when a CA is configured."""
    creds = channel_credentials(tls)
    return grpc.secure_channel(address, creds) if creds is not None else grpc.insecure_channel(address)


def check(
    address: str, service: str = "", timeout: float = DEFAULT_TIMEOUT_S, tls: TLSConfig | None = None
) -> tuple[bool, str]:
    """(serving?, status name or error) of one health check (TLS per `tls`; plaintext when None)."""
    with channel_for(address, tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            return False, f"{exc.code().name}: {exc.details()}"
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, name


def check_http(host: str, port: int, timeout: float = DEFAULT_TIMEOUT_S) -> tuple[bool, str]:
    """(healthy?, status) of the HTTP gateway's GET /health."""
    url = f"http://{host}:{port}/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:  # noqa: S310 (http on loopback)
            return reply.status == HTTP_OK, f"HTTP {reply.status}"
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return False, f"{type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, help="default: $SPECDEC_PORT ($SPECDEC_HTTP_PORT with --http)")
    parser.add_argument("--http", action="store_true", help="check the HTTP gateway's /health")
    parser.add_argument("--service", default="")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S)
    args = parser.parse_args(argv)
    port_env = "SPECDEC_HTTP_PORT" if args.http else "SPECDEC_PORT"
    try:
        settings, tls = CommandSettings(), None if args.http else TLSConfig()
    except ConfigError as exc:
        parser.error(str(exc))
    port = args.port if args.port is not None else settings.http_port if args.http else settings.port
    if not port:
        parser.error(f"--port or ${port_env} is required")
    if args.http:
        ok, status = check_http(args.host, port, args.timeout)
    else:
        ok, status = check(f"{args.host}:{port}", args.service, args.timeout, tls=tls)
    print(status)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
