"""Security: mTLS on every gRPC hop, bearer tokens at the orchestrator, a service token toward
draft/target, Redis AUTH, and no secret in any log. Certificates are made in the test."""

from __future__ import annotations

import datetime
import ipaddress
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from specdec.config import TLSConfig
from specdec.healthcheck import channel_for
from specdec.launcher import LocalStack, StackConfig
from specdec.redis_server import EmbeddedRedis
from specdec.v1 import common_pb2, orchestrator_pb2 as pb, orchestrator_pb2_grpc, target_pb2, target_pb2_grpc

pytestmark = [pytest.mark.integration, pytest.mark.slow]

USER_TOKEN, SERVICE_TOKEN, REDIS_PASSWORD = "user-secret-7f3a", "service-secret-91bc", "redis-secret-44d0"
VALID_DAYS = 2


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: Path, key, cert) -> None:
    path.with_suffix(".key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def make_pki(directory: Path) -> dict[str, Path]:
    """A CA and one leaf certificate (server + client auth) for 127.0.0.1/localhost."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("specdec test CA")).issuer_name(_name("specdec test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    san = x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    leaf = (x509.CertificateBuilder().subject_name(_name("specdec")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(san, critical=False).sign(ca_key, hashes.SHA256()))
    _write(directory / "ca", ca_key, ca)
    _write(directory / "leaf", key, leaf)
    return {"ca": directory / "ca.crt", "cert": directory / "leaf.crt", "key": directory / "leaf.key"}


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    env = {"SPECDEC_TLS_CA": str(pki["ca"]), "SPECDEC_TLS_CERT": str(pki["cert"]), "SPECDEC_TLS_KEY": str(pki["key"]),
           "SPECDEC_SERVICE_TOKEN": SERVICE_TOKEN, "SPECDEC_AUTH_TOKENS": f"other-token,{USER_TOKEN}"}
    with EmbeddedRedis(password=REDIS_PASSWORD) as redis:
        stack = LocalStack(StackConfig(target_model="embedded", draft_kind="ngram", redis_url=redis.url, extra_env=env))
        with stack:
            yield stack, TLSConfig(cert=str(pki["cert"]), key=str(pki["key"]), ca=str(pki["ca"]))


def generate(address: str, tls: TLSConfig | None, token: str | None) -> pb.GenerateResponse:
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    with channel_for(address, tls) as channel:
        return orchestrator_pb2_grpc.OrchestratorStub(channel).Generate(
            pb.GenerateRequest(prompt="Hello", max_new_tokens=8, k=2), timeout=30, metadata=metadata)


def test_mtls_and_token_work_end_to_end(secured):
    stack, tls = secured
    resp = generate(stack.orchestrator_address, tls, USER_TOKEN)
    assert resp.usage.completion_tokens > 0 and resp.stats.rounds > 0


def test_missing_or_wrong_token_is_unauthenticated(secured):
    stack, tls = secured
    for token in (None, "wrong"):
        with pytest.raises(grpc.RpcError) as err:
            generate(stack.orchestrator_address, tls, token)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "bearer token" in err.value.details()


def test_plaintext_and_certless_clients_are_refused(secured):
    stack, tls = secured
    with pytest.raises(grpc.RpcError) as err:
        generate(stack.orchestrator_address, None, USER_TOKEN)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.RpcError) as err:  # TLS but no client certificate: mTLS refuses
        generate(stack.orchestrator_address, TLSConfig(ca=tls.ca), USER_TOKEN)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_target_requires_the_service_token(secured):
    stack, tls = secured
    target = next(p for p in stack.procs if p.role == "target")
    with channel_for(target.address, tls) as channel:
        stub = target_pb2_grpc.TargetStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Verify(target_pb2.VerifyRequest(session_id="x", context_ids=[1, 2]), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        info = stub.Info(common_pb2.InfoRequest(), timeout=10, metadata=(("authorization", f"Bearer {SERVICE_TOKEN}"),))
        assert info.role == "target"
        assert info.round_lane_port == 0        # with TLS on, no plain-TCP round lane is opened


def test_healthcheck_speaks_tls_from_the_environment(secured):
    stack, tls = secured
    env = {"SPECDEC_TLS_CA": tls.ca, "SPECDEC_TLS_CERT": tls.cert, "SPECDEC_TLS_KEY": tls.key, "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "specdec.healthcheck", "--port", str(stack.orchestrator.port)],
                         env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.strip() == "SERVING"


def test_no_secret_appears_in_any_log(secured):
    stack, _ = secured
    for proc in stack.procs:
        text = proc.log_path.read_text(errors="replace")
        for secret in (USER_TOKEN, SERVICE_TOKEN, REDIS_PASSWORD):
            assert secret not in text, f"{secret} leaked into {proc.role} log"
