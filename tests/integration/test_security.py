"""Security: mTLS on every gRPC hop, bearer tokens at the orchestrator, a service
token toward draft/target, Redis AUTH, and no secret in any log. Certificates are made in the test."""

from __future__ import annotations

import subprocess
import sys

import grpc
import pytest

from specdec.config import TLSConfig
from specdec.healthcheck import channel_for
from specdec.launcher import LocalStack, StackConfig
from specdec.redis_server import EmbeddedRedis
from specdec.v1 import common_pb2, orchestrator_pb2_grpc, target_pb2, target_pb2_grpc
from specdec.v1 import orchestrator_pb2 as pb
from tests.pki_support import make_pki

pytestmark = [pytest.mark.integration, pytest.mark.slow]

USER_TOKEN, SERVICE_TOKEN, REDIS_PASSWORD = "user-secret-7f3a", "service-secret-91bc", "redis-secret-44d0"
SERVICE_METADATA = (("authorization", f"Bearer {SERVICE_TOKEN}"),)


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    env = {
        "SPECDEC_TLS_CA": str(pki["ca"]),
        "SPECDEC_TLS_CERT": str(pki["cert"]),
        "SPECDEC_TLS_KEY": str(pki["key"]),
        "SPECDEC_SERVICE_TOKEN": SERVICE_TOKEN,
        "SPECDEC_AUTH_TOKENS": f"other-token,{USER_TOKEN}",
    }
    with EmbeddedRedis(password=REDIS_PASSWORD) as redis:
        stack = LocalStack(StackConfig(target_model="embedded", draft_kind="ngram", redis_url=redis.url, extra_env=env))
        with stack:
            yield stack, TLSConfig(cert=str(pki["cert"]), key=str(pki["key"]), ca=str(pki["ca"]))


def generate(address: str, tls: TLSConfig | None, token: str | None) -> pb.GenerateResponse:
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    with channel_for(address, tls) as channel:
        return orchestrator_pb2_grpc.OrchestratorStub(channel).Generate(
            pb.GenerateRequest(prompt="Hello", max_new_tokens=8, k=2), timeout=30, metadata=metadata
        )


def target_channel(stack: LocalStack, tls: TLSConfig):
    target = next(p for p in stack.procs if p.role == "target")
    return channel_for(target.address, tls)


def test_mtls_and_token_work_end_to_end(secured):
    stack, tls = secured
    with target_channel(stack, tls) as channel:
        stub = target_pb2_grpc.TargetStub(channel)
        before = stub.Stats(common_pb2.InfoRequest(), timeout=10, metadata=SERVICE_METADATA).calls
        resp = generate(stack.orchestrator_address, tls, USER_TOKEN)
        after = stub.Stats(common_pb2.InfoRequest(), timeout=10, metadata=SERVICE_METADATA).calls
    assert resp.usage.completion_tokens > 0 and resp.stats.rounds > 0
    assert after - before >= resp.stats.rounds  # every round's Verify reached the target over mTLS


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
    with target_channel(stack, tls) as channel:
        stub = target_pb2_grpc.TargetStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Verify(target_pb2.VerifyRequest(session_id="x", context_ids=[1, 2]), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        info = stub.Info(common_pb2.InfoRequest(), timeout=10, metadata=SERVICE_METADATA)
        assert info.role == "target"


def test_target_speaks_mtls_only(secured, tmp_path):
    """The target's gRPC port answers a client presenting the CA's certificate; a plaintext client, a TLS
    client without a client certificate and a client that does not trust the server's CA get no answer."""
    stack, tls = secured
    target = next(p for p in stack.procs if p.role == "target")
    request = target_pb2.VerifyRequest(session_id="tls-target", context_ids=[1, 2, 3])

    def verify(client_tls):
        with channel_for(target.address, client_tls) as channel:
            return target_pb2_grpc.TargetStub(channel).Verify(request, timeout=30, metadata=SERVICE_METADATA)

    answer = verify(tls)
    assert answer.next_kind == target_pb2.NEXT_KIND_BONUS and answer.num_accepted == 0
    other_ca = make_pki(tmp_path)
    for refused in (
        None,
        TLSConfig(ca=tls.ca),
        TLSConfig(cert=tls.cert, key=tls.key, ca=str(other_ca["ca"])),
    ):
        with pytest.raises(grpc.RpcError) as err:
            verify(refused)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_healthcheck_speaks_tls_from_the_environment(secured):
    stack, tls = secured
    env = {"SPECDEC_TLS_CA": tls.ca, "SPECDEC_TLS_CERT": tls.cert, "SPECDEC_TLS_KEY": tls.key, "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-m", "specdec.healthcheck", "--port", str(stack.orchestrator.port)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0 and out.stdout.strip() == "SERVING"


def test_no_secret_appears_in_any_log(secured):
    stack, _ = secured
    for proc in stack.procs:
        text = proc.log_path.read_text(errors="replace")
        for secret in (USER_TOKEN, SERVICE_TOKEN, REDIS_PASSWORD):
            assert secret not in text, f"{secret} leaked into {proc.role} log"
