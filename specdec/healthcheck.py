"""`python -m specdec.healthcheck --port N`: exit 0 when the gRPC health service says SERVING.

Used by the Docker HEALTHCHECK and by `specdec up` to wait for services. With
SPECDEC_TLS_CA set (as in the service's own environment) it speaks TLS, presenting
SPECDEC_TLS_CERT/KEY as a client certificate when the service requires mTLS.
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specdec.config import TLSConfig
from specdec.server.tls import channel_credentials

DEFAULT_TIMEOUT_S = 3.0


def channel_for(address: str, tls: TLSConfig | None = None) -> grpc.Channel:
    """A blocking channel: TLS (with a client certificate for mTLS) when a CA is configured."""
    creds = channel_credentials(tls)
    return grpc.secure_channel(address, creds) if creds is not None else grpc.insecure_channel(address)


def check(address: str, service: str = "", timeout: float = DEFAULT_TIMEOUT_S,
          tls: TLSConfig | None = None) -> tuple[bool, str]:
    """(serving?, status name or error) of one health check (TLS per `tls`; plaintext when None)."""
    with channel_for(address, tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            return False, f"{exc.code().name}: {exc.details()}"
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--service", default="")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S)
    args = parser.parse_args(argv)
    ok, status = check(f"{args.host}:{args.port}", args.service, args.timeout, tls=TLSConfig())
    print(status)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
