"""`python -m specdec.healthcheck --port N`: exit 0 when the gRPC health service says SERVING.

Used by the Docker HEALTHCHECK and by `specdec up` to wait for services.
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

DEFAULT_TIMEOUT_S = 3.0


def check(address: str, service: str = "", timeout: float = DEFAULT_TIMEOUT_S) -> tuple[bool, str]:
    """(serving?, status name or error) of one health check."""
    with grpc.insecure_channel(address) as channel:
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
    ok, status = check(f"{args.host}:{args.port}", args.service, args.timeout)
    print(status)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
