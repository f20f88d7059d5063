"""specdec.client: sync and async, typed results, deadlines, retries that resume a stream.

Against the real process stack (tests/http_support.py) for results and server-side
idempotency, and against a scripted fake Orchestrator (in this process) for the retry
and resume bookkeeping, which needs a server that fails on cue.
"""

from __future__ import annotations

import asyncio
import uuid
from concurrent import futures

import grpc
import pytest
from transformers import AutoTokenizer

from specdec.client import AsyncClient, Chunk, Client, ClientError, GenerateResult, build_request, collect
from specdec.redis_server import free_port
from specdec.v1 import orchestrator_pb2 as pb
from specdec.v1 import orchestrator_pb2_grpc
from tests.http_support import shared_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # one shared process stack: ~10-20 s to start

PROMPT = "Once upon a time there was"
MAX_NEW = 20
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def hs():
    return shared_stack()


@pytest.fixture(scope="module")
def client(hs):
    with Client(hs.orchestrator, timeout=TIMEOUT_S) as c:
        yield c


@pytest.fixture(scope="module")
def eos(client):
    return sorted(next(r.info for r in client.status().replicas if r.role == "target").eos_token_ids)


# -- request building ------------------------------------------------------------------------------


def test_unset_parameters_stay_unset():
    req = build_request("hi")
    assert req.prompt == "hi" and not req.HasField("sampling")
    for name in ("max_new_tokens", "k", "draft_kind", "trace", "session_id", "request_id", "logprobs"):
        assert not req.HasField(name), name
    req = build_request(
        messages=[{"role": "user", "content": "a"}, ("assistant", "b")], temperature=0.0, k=0, stop="x", seed=None
    )
    assert [(m.role, m.content) for m in req.messages.messages] == [("user", "a"), ("assistant", "b")]
    assert req.sampling.HasField("temperature") and req.HasField("k") and req.k == 0  # explicit 0 is set
    assert not req.sampling.HasField("seed") and list(req.stop) == ["x"]
    with pytest.raises(TypeError):
        build_request("hi", max_tokens=3)
    with pytest.raises(ValueError):
        build_request()


# -- against the real stack --------------------------------------------------------------------------


def test_generate_and_stream_equal_target_alone(hs, client, eos):
    tok = AutoTokenizer.from_pretrained(str(hs.target_dir), local_files_only=True)
    want = hs.target_alone(tok.encode(PROMPT), MAX_NEW, eos)
    r = client.generate(PROMPT, max_new_tokens=MAX_NEW, k=3, trace=True)
    assert isinstance(r, GenerateResult) and r.token_ids == want
    assert r.finish_reason in ("stop", "length") and r.finish_detail in ("eos", "length")
    assert r.usage.completion_tokens == len(want)
    assert r.stats["rounds"] == len(r.trace) and isinstance(r.stats["wire_bytes"], int)
    chunks = list(client.stream(PROMPT, max_new_tokens=MAX_NEW, k=3))
    assert all(isinstance(c, Chunk) for c in chunks) and chunks[-1].finish_reason == r.finish_reason
    streamed = collect(chunks)
    assert streamed.text == r.text and streamed.token_ids == want


def test_default_parameters_match_plain_grpc(hs, client):
    """Nothing given: the server's defaults (greedy), same as a bare gRPC request."""
    with grpc.insecure_channel(hs.orchestrator) as ch:
        bare = orchestrator_pb2_grpc.OrchestratorStub(ch).Generate(pb.GenerateRequest(prompt=PROMPT), timeout=TIMEOUT_S)
    assert client.generate(PROMPT).token_ids == list(bare.token_ids)


def test_async_client(hs, client):
    want = client.generate(messages=[{"role": "user", "content": "Hello"}], max_new_tokens=MAX_NEW)

    async def run():
        async with AsyncClient(hs.orchestrator, timeout=TIMEOUT_S) as ac:
            r = await ac.generate(messages=[{"role": "user", "content": "Hello"}], max_new_tokens=MAX_NEW)
            chunks = [
                c async for c in ac.stream(messages=[{"role": "user", "content": "Hello"}], max_new_tokens=MAX_NEW)
            ]
            return r, chunks, await ac.status()

    r, chunks, status = asyncio.run(run())
    assert r.token_ids == want.token_ids and collect(chunks).text == want.text
    assert status.target_model == str(hs.target_dir)


def test_retry_of_a_finished_request_is_a_replay(client):
    """The same request id twice: one generation (the second call replays it, nothing appended), with the same
    text to the last character (a completion ending inside a UTF-8 character ends in U+FFFD in both: see
    tests/unit/test_completion_text.py, which makes that case on purpose)."""
    sid, rid = uuid.uuid4().hex, uuid.uuid4().hex
    kw = dict(
        max_new_tokens=MAX_NEW, session_id=sid, create_session=True, request_id=rid, temperature=1.0
    )  # sampled: a second generation would (almost surely) differ
    first = client.generate(PROMPT, **kw)
    again = client.generate(PROMPT, **kw)
    assert again.token_ids == first.token_ids and again.text == first.text
    assert client.get_session(sid).turns == 1
    # a stream that says it holds the first 5 tokens gets exactly the rest
    rest = list(client.stream(PROMPT, resume_offset=5, **kw))
    assert rest[0].offset == 5 and sum((c.token_ids for c in rest), []) == first.token_ids[5:]
    rest_text = "".join(c.text for c in rest)
    assert first.text.endswith(rest_text)  # the rest of the same text, its end included


def test_deadline(client):
    with pytest.raises(ClientError) as e:
        client.generate(PROMPT, max_new_tokens=200, ignore_eos=True, timeout=0.01)
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_unavailable_is_retried_then_raised():
    with Client(f"127.0.0.1:{free_port()}", retries=2, backoff=0.01, timeout=10) as c, pytest.raises(ClientError) as e:
        c.generate(PROMPT)
    assert e.value.code == grpc.StatusCode.UNAVAILABLE and e.value.attempts == 3


# -- retry/resume against a scripted server ------------------------------------------------------------

TOKENS = list(range(100, 110))
TEXT = [f"<{t}>" for t in TOKENS]


class FlakyOrchestrator(orchestrator_pb2_grpc.OrchestratorServicer):
    """Streams TOKENS one per chunk; the first call dies with UNAVAILABLE after `fail_after` chunks.
    A retry must carry the same session/request id and resume_offset = tokens delivered."""

    def __init__(self, fail_after: int, replay_extra: int = 0, code=grpc.StatusCode.UNAVAILABLE) -> None:
        self.fail_after, self.replay_extra, self.code = fail_after, replay_extra, code
        self.calls: list[pb.GenerateRequest] = []
        self.metadata: list[dict] = []

    def GenerateStream(self, request, context):
        self.calls.append(request)
        self.metadata.append(dict(context.invocation_metadata()))
        start = request.resume_offset if request.HasField("resume_offset") else 0
        if len(self.calls) > 1:  # a resumed stream first replays `replay_extra` tokens it need not have
            start = max(0, start - self.replay_extra)
        for i in range(start, len(TOKENS)):
            if len(self.calls) == 1 and i == self.fail_after:
                context.abort(self.code, "replica went away")
            yield pb.GenerateChunk(text_delta=TEXT[i], token_ids=[TOKENS[i]], offset=i)
        final = pb.GenerateChunk(
            offset=len(TOKENS),
            session_id=request.session_id,
            request_id=request.request_id,
            usage=pb.Usage(completion_tokens=len(TOKENS)),
        )
        final.finish_reason = pb.FINISH_REASON_LENGTH
        yield final

    def Generate(self, request, context):
        self.calls.append(request)
        if len(self.calls) == 1:
            context.abort(self.code, "replica went away")
        return pb.GenerateResponse(
            text="".join(TEXT),
            token_ids=TOKENS,
            finish_reason=pb.FINISH_REASON_LENGTH,
            session_id=request.session_id,
            request_id=request.request_id,
        )


@pytest.fixture
def fake():
    servers = []

    def start(servicer):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        orchestrator_pb2_grpc.add_OrchestratorServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for s in servers:
        s.stop(None)


def test_stream_resumes_without_duplicates(fake):
    servicer = FlakyOrchestrator(fail_after=4)
    with Client(fake(servicer), retries=3, backoff=0.01, token="secret") as c:
        chunks = list(c.stream("p", max_new_tokens=10))
    assert "".join(ch.text for ch in chunks) == "".join(TEXT)
    assert sum((ch.token_ids for ch in chunks), []) == TOKENS
    first, retry = servicer.calls
    assert not first.HasField("resume_offset") and retry.resume_offset == 4
    assert retry.request_id == first.request_id and retry.session_id == first.session_id and first.request_id
    assert first.create_session and retry.max_new_tokens == 10 and not retry.sampling.HasField("temperature")
    assert all(m["authorization"] == "Bearer secret" for m in servicer.metadata)


def test_stream_drops_replayed_chunks(fake):
    servicer = FlakyOrchestrator(fail_after=6, replay_extra=2)
    with Client(fake(servicer), retries=1, backoff=0.01) as c:
        chunks = list(c.stream("p"))
    assert sum((ch.token_ids for ch in chunks), []) == TOKENS
    assert "".join(ch.text for ch in chunks) == "".join(TEXT)


def test_async_stream_resumes(fake):
    servicer = FlakyOrchestrator(fail_after=3)
    address = fake(servicer)

    async def run():
        async with AsyncClient(address, retries=2, backoff=0.01) as ac:
            return [ch async for ch in ac.stream(messages=[("user", "p")])]

    chunks = asyncio.run(run())
    assert sum((ch.token_ids for ch in chunks), []) == TOKENS and servicer.calls[1].resume_offset == 3


def test_generate_retried_with_same_request_id(fake):
    servicer = FlakyOrchestrator(fail_after=0)
    with Client(fake(servicer), retries=1, backoff=0.01) as c:
        r = c.generate("p")
    assert r.token_ids == TOKENS and r.attempts == 2
    assert servicer.calls[0].request_id == servicer.calls[1].request_id


def test_other_errors_are_not_retried(fake):
    servicer = FlakyOrchestrator(fail_after=2, code=grpc.StatusCode.INVALID_ARGUMENT)
    with Client(fake(servicer), retries=3, backoff=0.01) as c, pytest.raises(ClientError) as e:
        list(c.stream("p"))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and len(servicer.calls) == 1


def test_no_retries_leaves_ids_to_the_server(fake):
    servicer = FlakyOrchestrator(fail_after=99)
    with Client(fake(servicer), retries=0) as c:
        list(c.stream("p"))
    assert not servicer.calls[0].HasField("request_id") and not servicer.calls[0].HasField("session_id")
