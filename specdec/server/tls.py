"""TLS credentials from the configured certificate files, for servers and for clients: gRPC credentials
for the gRPC hops, `ssl.SSLContext`s for the round lane (plain TCP, specdec/server/lane.py), built from the
same files with the same rules (server: cert + key, client certificates required when a CA is given;
client: verify the server against the CA, present cert + key when set)."""

from __future__ import annotations

import ssl
from pathlib import Path

import grpc

from specdec.config import TLSConfig

#: the oldest TLS version the round lane accepts, either side (gRPC's own floor is TLS 1.2 as well).
LANE_MIN_TLS = ssl.TLSVersion.TLSv1_2


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


def lane_server_context(tls: TLSConfig) -> ssl.SSLContext | None:
    """The round lane's server side, as server_credentials: None without cert + key (plain TCP)."""
    if not tls.enabled:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = LANE_MIN_TLS
    ctx.load_cert_chain(tls.cert, tls.key)
    if tls.ca:
        ctx.load_verify_locations(cafile=tls.ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def lane_client_context(tls: TLSConfig | None) -> ssl.SSLContext | None:
    """The round lane's client side, as channel_credentials: None without a CA (plain TCP). The server's
    certificate must name the host the caller connects to, as for the gRPC channel."""
    if tls is None or not tls.ca:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.ca)
    ctx.minimum_version = LANE_MIN_TLS
    if tls.cert and tls.key:
        ctx.load_cert_chain(tls.cert, tls.key)
    return ctx
