"""gRPC TLS credentials from the configured certificate files, for servers and for clients (server: cert + key,
client certificates required when a CA is given; client: verify the server against the CA, present cert + key
when set)."""

from __future__ import annotations

from pathlib import Path

import grpc

from specdec.config import TLSConfig


def _read(path: str) -> bytes | None:
    return Path(path).read_bytes() if path else None


def server_credentials(tls: TLSConfig) -> grpc.ServerCredentials | None:
    """Server TLS from cert + key; mTLS (client certificates required) when a CA is given too."""
    if not tls.enabled:
        return None
    ca = _read(tls.ca)
    return grpc.ssl_server_credentials(
        [(_read(tls.key), _read(tls.cert))], root_certificates=ca, require_client_auth=ca is not None
    )


def channel_credentials(tls: TLSConfig | None) -> grpc.ChannelCredentials | None:
    """Client TLS when a CA is configured, presenting cert + key (mTLS) when they are set; else None."""
    if tls is None or not tls.ca:
        return None
    return grpc.ssl_channel_credentials(_read(tls.ca), _read(tls.key), _read(tls.cert))
