"""gRPC server reflection on all three services, and a Generate call built from reflection alone.

grpcurl is not installed here, so the grpcio reflection client stands in for it:
scripts/grpc_reflect.py lists services, fetches the file descriptors, builds the message
classes in a fresh DescriptorPool (google.protobuf.message_factory) and calls the method.
It runs as its own process and checks that no specdec module (generated code included)
was imported. When grpcurl is on PATH the same is checked with grpcurl too.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.http_support import shared_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # one shared process stack: ~10-20 s to start

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "scripts" / "grpc_reflect.py"
HEALTH, REFLECTION = "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"
EXPECTED = {"orchestrator": "specdec.v1.Orchestrator", "draft": "specdec.v1.Draft", "target": "specdec.v1.Target"}
REQUEST = {"prompt": "Once upon a time", "max_new_tokens": 8, "k": 2}
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def hs():
    return shared_stack()


def addresses(hs) -> dict[str, str]:
    return {p.role: p.address for p in hs.stack.procs}


def list_services(address: str) -> list[str]:
    with grpc.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        req = reflection_pb2.ServerReflectionRequest(list_services="")
        reply = next(iter(stub.ServerReflectionInfo(iter([req]), timeout=TIMEOUT_S)))
    return sorted(s.name for s in reply.list_services_response.service)


def test_every_service_lists_itself_health_and_reflection(hs):
    for role, address in addresses(hs).items():
        assert set(list_services(address)) == {EXPECTED[role], HEALTH, REFLECTION}, role


def run_tool(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=TIMEOUT_S, cwd="/"
    )  # not the repo root: nothing of specdec is importable by accident
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_generate_from_reflected_descriptors_only(hs):
    """A separate process with no generated code gets the same answer as the generated stub."""
    from specdec.v1 import orchestrator_pb2 as pb
    from specdec.v1 import orchestrator_pb2_grpc

    orch = hs.orchestrator
    assert run_tool(orch, "list").split() == sorted([EXPECTED["orchestrator"], HEALTH, REFLECTION])
    reply = json.loads(run_tool(orch, "call", "specdec.v1.Orchestrator/Generate", json.dumps(REQUEST)))
    with grpc.insecure_channel(orch) as channel:
        want = orchestrator_pb2_grpc.OrchestratorStub(channel).Generate(
            pb.GenerateRequest(**REQUEST), timeout=TIMEOUT_S
        )
    assert reply["token_ids"] == list(want.token_ids) and reply["text"] == want.text
    assert reply["finish_reason"] == pb.FinishReason.Name(want.finish_reason)


def test_reflected_classes_in_process(hs):
    """The same through the tool's Reflector in this process: a fresh pool, a streaming call too."""
    spec = importlib.util.spec_from_file_location("grpc_reflect", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    with grpc.insecure_channel(hs.orchestrator) as channel:
        r = tool.Reflector(channel)
        method, req_cls, resp_cls = r.method("specdec.v1.Orchestrator/GenerateStream")
        assert method.server_streaming and req_cls.DESCRIPTOR.file.pool is r.pool
        chunks = list(r.call(channel, "specdec.v1.Orchestrator/GenerateStream", json.dumps(REQUEST), TIMEOUT_S))
        unary = next(r.call(channel, "specdec.v1.Orchestrator/Generate", json.dumps(REQUEST), TIMEOUT_S))
    assert "".join(c.text_delta for c in chunks) == unary.text
    assert chunks[-1].HasField("finish_reason")
    for role in ("draft", "target"):  # the model services' descriptors resolve too
        with grpc.insecure_channel(addresses(hs)[role]) as channel:
            service = tool.Reflector(channel).symbol(EXPECTED[role])
            assert "Info" in service.methods_by_name


@pytest.mark.skipif(shutil.which("grpcurl") is None, reason="grpcurl is not installed")
def test_grpcurl(hs):
    out = subprocess.run(
        ["grpcurl", "-plaintext", hs.orchestrator, "list"], capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert EXPECTED["orchestrator"] in out.stdout.split()
    out = subprocess.run(
        ["grpcurl", "-plaintext", "-d", json.dumps(REQUEST), hs.orchestrator, "specdec.v1.Orchestrator/Generate"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert out.returncode == 0 and json.loads(out.stdout)["tokenIds"]
