"""Bad input never gets a 5xx from the HTTP gateway; idempotency keys are honest.

Against the shared process stack of tests/http_support.py (Redis, tiny target and draft, the
orchestrator and the gateway, real processes over loopback):
  * every input the issue saw answered 500 is a 400 naming the field (unary and streamed);
  * oversized bodies 413, invalid UTF-8 / deep nesting 400, unsupported OpenAI features 400;
  * vLLM's top-level extras (top_k, min_tokens, ignore_eos, repetition_penalty) work like the extension;
  * a request_id reused for a different request is 409 `idempotency_key_reused` (gRPC ALREADY_EXISTS),
    the same request is a retry; a duplicate while the original runs is 409 `request_in_progress`;
  * a property-based test (hypothesis) over every documented field, the extension, nested content
    parts and unknown keys, valid and invalid: no 5xx ever, and every valid request succeeds.
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.parse
import uuid

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec.v1 import orchestrator_pb2 as pb
from specdec.v1 import orchestrator_pb2_grpc
from tests.http_support import shared_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPT = "The quick brown fox"
CHAT = [{"role": "user", "content": "Name three colours."}]
RPC_TIMEOUT_S = 60.0
LONG_MAX_TOKENS = 1500  # a stream that is still running while the duplicate arrives
# ~30 requests/s on a loaded 2-core box (valid ones generate <= 4 tokens, most others are refused early);
# SPECDEC_FUZZ_EXAMPLES=5000 SPECDEC_FUZZ_RANDOM=1 for a longer hunt with fresh examples.
FUZZ_EXAMPLES = int(os.environ.get("SPECDEC_FUZZ_EXAMPLES", "600"))
FUZZ_DERANDOMIZE = os.environ.get("SPECDEC_FUZZ_RANDOM", "") != "1"
REPORT: dict[str, str] = {}


@pytest.fixture(scope="module")
def hs():
    stack = shared_stack()
    yield stack
    for name, line in REPORT.items():
        print(f"\n[http robustness] {name}: {line}")


@pytest.fixture(scope="module")
def stub(hs):
    channel = grpc.insecure_channel(hs.orchestrator)
    yield orchestrator_pb2_grpc.OrchestratorStub(channel)
    channel.close()


def post(hs, path: str, body: bytes | dict, headers: dict | None = None) -> tuple[int, str]:
    """(status, body text) of a raw POST to the gateway (streams are read to the end)."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()  # lone surrogates become "\\ud800"
    url = urllib.parse.urlsplit(hs.gateway.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=RPC_TIMEOUT_S)
    try:
        conn.request("POST", f"/v1/{path}", body=raw, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    finally:
        conn.close()


def error_of(status: int, text: str) -> dict:
    assert 400 <= status < 500, (status, text[:300])
    return json.loads(text)["error"]


def stream_events(text: str) -> list:
    events = [e[len("data: ") :] for e in text.split("\n\n") if e.startswith("data: ")]
    assert events and events[-1] == "[DONE]", text[-300:]
    return [json.loads(e) for e in events[:-1]]


# -- every 500 the issue found ------------------------------------------------------------------------


ISSUE_CASES = [
    ("completions", {"prompt": PROMPT, "max_tokens": 10**12}, "max_tokens"),
    ("completions", {"prompt": PROMPT, "max_tokens": 2**40}, "max_tokens"),
    ("chat/completions", {"messages": CHAT, "max_completion_tokens": 2**40}, "max_completion_tokens"),
    ("completions", {"prompt": PROMPT, "seed": 2**70}, "seed"),
    ("completions", {"prompt": PROMPT, "logprobs": 2**40}, "logprobs"),
    ("chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": 2**40}, "top_logprobs"),
    ("completions", {"prompt": PROMPT, "specdec": {"k": 10**30}}, "specdec.k"),
    ("completions", {"prompt": PROMPT, "specdec": {"resume_offset": -1}}, "specdec.resume_offset"),
    ("completions", {"prompt": PROMPT, "specdec": {"resume_offset": 2**33}}, "specdec.resume_offset"),
    ("completions", {"prompt": PROMPT, "specdec": {"min_tokens": 2**40}}, "specdec.min_tokens"),
    ("completions", {"prompt": PROMPT, "specdec": {"max_rounds": 2**40}}, "specdec.max_rounds"),
    ("completions", {"prompt": PROMPT, "specdec": {"top_k": 2**40}}, "specdec.top_k"),
    ("completions", {"prompt": PROMPT, "specdec": {"draft_top_n": 2**40}}, "specdec.draft_top_n"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi \ud800"}]}, "messages[0].content"),
    (
        "chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udc80"}]}]},
        "messages[0].content[0].text",
    ),
    ("completions", {"prompt": "\udc80"}, "prompt"),
    ("completions", {"prompt": PROMPT, "stop": ["\ud800"]}, "stop[0]"),
    ("completions", {"prompt": PROMPT, "specdec": {"session_id": "\ud800"}}, "specdec.session_id"),
    ("chat/completions", {"messages": CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ("chat/completions", {"messages": CHAT, "response_format": {"type": "json_object"}}, "response_format"),
    ("completions", {"prompt": PROMPT, "logit_bias": {"50": 10}}, "logit_bias"),
]


@pytest.mark.parametrize("stream", [False, True])
def test_issue_inputs_are_400_naming_the_field(hs, stream):
    for path, body, param in ISSUE_CASES:
        status, text = post(hs, path, {**body, "stream": stream})
        err = error_of(status, text)
        assert status == 400 and err["param"] == param and param in err["message"], (path, body, status, text)


def test_body_level_errors(hs):
    big = json.dumps({"prompt": "x" * (5 * 1024 * 1024)}).encode()  # over the 4 MiB default
    status, text = post(hs, "completions", big)
    assert status == 413, (status, text[:200])
    status, text = post(hs, "completions", b'{"prompt": "\xff\xfe caf\xe9"}')
    assert status == 400 and "UTF-8" in error_of(status, text)["message"]
    status, text = post(hs, "completions", b"[" * 100_000 + b"]" * 100_000)
    assert status == 400, (status, text[:200])
    status, text = post(
        hs,
        "completions",
        json.dumps({"prompt": PROMPT, "max_tokens": 2}).encode(),
        {"Content-Type": "application/json; charset=no-such-charset"},
    )
    assert status == 200, (status, text[:200])  # JSON is UTF-8 whatever the header says
    status, text = post(hs, "completions", b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}")
    assert status == 400, (status, text[:200])  # more digits than Python converts


def test_header_bytes_that_are_not_utf8_or_ascii(hs):
    body = {"prompt": PROMPT, "max_tokens": 2}
    status, text = post(hs, "completions", body, {"X-Specdec-Session": b"\xff\xfe"})
    assert status == 400 and error_of(status, text)["param"] == "X-Specdec-Session"
    status, text = post(hs, "completions", body, {"Authorization": "Bearer caf\xe9".encode("latin-1")})
    assert status == 401 and "Authorization" in error_of(status, text)["message"]
    status, text = post(
        hs, "completions", body, {"X-Specdec-Session": "caf\xe9-\u4e2d".encode(), "Authorization": "Bearer anything"}
    )
    assert status == 404 and error_of(status, text)["code"] == "session_not_found"  # UTF-8 ids are fine


def test_vllm_top_level_extras(hs):
    status, text = post(hs, "completions", {"prompt": PROMPT, "max_tokens": 4, "top_k": -5})
    assert status == 400 and "top_k" in error_of(status, text)["message"]
    top = {
        "prompt": PROMPT,
        "max_tokens": 6,
        "temperature": 0.8,
        "seed": 3,
        "top_k": 5,
        "repetition_penalty": 1.2,
        "min_tokens": 6,
        "ignore_eos": True,
    }
    ext = {
        "prompt": PROMPT,
        "max_tokens": 6,
        "temperature": 0.8,
        "seed": 3,
        "specdec": {"top_k": 5, "repetition_penalty": 1.2, "min_tokens": 6, "ignore_eos": True},
    }
    a, b = post(hs, "completions", top), post(hs, "completions", ext)
    assert a[0] == b[0] == 200, (a, b)
    ids = [json.loads(t)["specdec"]["token_ids"] for _, t in (a, b)]
    assert ids[0] == ids[1] and len(ids[0]) == 6
    status, text = post(hs, "completions", {**top, "specdec": {"top_k": 7}})
    assert status == 400 and error_of(status, text)["param"] == "top_k"


def test_grpc_logprobs_and_draft_kind(stub):
    with pytest.raises(grpc.RpcError) as err:
        stub.Generate(pb.GenerateRequest(prompt=PROMPT, max_new_tokens=2, logprobs=-1), timeout=RPC_TIMEOUT_S)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "logprobs" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        stub.Generate(pb.GenerateRequest(prompt=PROMPT, max_new_tokens=2, draft_kind="bogus"), timeout=RPC_TIMEOUT_S)
    assert "'combined'" in err.value.details()


# GenerateRequest fields 19 (overlap, varint true) and 20 (overlap_branches, varint 2), now reserved: as an old
# client encodes them (tag = field number << 3, wire type 0).
OLD_OVERLAP_FIELDS = bytes([0x98, 0x01, 0x01, 0xA0, 0x01, 0x02])


def test_grpc_an_old_clients_overlap_fields_are_ignored(hs):
    """Overlapped rounds are gone; their request fields are reserved: a request that still sets them is
    parsed (protobuf keeps them as unknown fields) and generates as if they were unset."""
    with grpc.insecure_channel(hs.orchestrator) as channel:
        generate = channel.unary_unary(
            "/specdec.v1.Orchestrator/Generate", response_deserializer=pb.GenerateResponse.FromString
        )
        plain = pb.GenerateRequest(prompt=PROMPT, max_new_tokens=2, k=2)
        resp = generate(plain.SerializeToString() + OLD_OVERLAP_FIELDS, timeout=RPC_TIMEOUT_S)
    assert len(resp.token_ids) == 2


# -- idempotency keys ---------------------------------------------------------------------------------


def test_reused_request_id_is_refused_and_a_retry_resumes(hs, stub):
    sid, rid = f"idem-{uuid.uuid4().hex[:8]}", f"req-{uuid.uuid4().hex[:8]}"
    ext = {"session_id": sid, "create_session": True, "request_id": rid}
    body = {"prompt": PROMPT, "max_tokens": 6, "specdec": ext}
    status, text = post(hs, "completions", body)
    assert status == 200, text
    first = json.loads(text)
    # a true retry (stream and trace may change, resume_offset too) returns the same completion
    for retry in ({**body, "stream": True}, {**body, "specdec": {**ext, "trace": True, "resume_offset": 2}}, body):
        status, text = post(hs, "completions", retry)
        assert status == 200, text
        if retry.get("stream"):
            events = stream_events(text)
            ids = [i for e in events for i in (e.get("specdec") or {}).get("token_ids", [])]
            assert ids == first["specdec"]["token_ids"]
            assert "".join(c["text"] for e in events for c in e["choices"]) == first["choices"][0]["text"]
        else:
            assert json.loads(text)["choices"][0]["text"] == first["choices"][0]["text"]
    # the same key for a different request: 409 idempotency_key_reused, unary and streamed
    for changed in (
        {**body, "prompt": PROMPT + " jumps"},
        {**body, "max_tokens": 7},
        {**body, "temperature": 0.5},
        {**body, "stop": ["x"]},
        {**body, "specdec": {**ext, "k": 1}},
        {**body, "stream": True, "seed": 1},
    ):
        status, text = post(hs, "completions", changed)
        err = error_of(status, text)
        assert status == 409 and err["code"] == "idempotency_key_reused" and rid in err["message"], (changed, text)
    info = stub.GetSession(pb.SessionRequest(session_id=sid), timeout=RPC_TIMEOUT_S)
    assert info.turns == 1, "a refused request must not add a turn"
    # gRPC: ALREADY_EXISTS
    with pytest.raises(grpc.RpcError) as err:
        stub.Generate(
            pb.GenerateRequest(prompt="other", session_id=sid, request_id=rid, max_new_tokens=6), timeout=RPC_TIMEOUT_S
        )
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS and "idempotency_key_reused" in err.value.details()
    # a new request_id on the session is a new turn
    status, text = post(hs, "completions", {**body, "prompt": " and", "specdec": {**ext, "request_id": rid + "-2"}})
    assert status == 200 and stub.GetSession(pb.SessionRequest(session_id=sid), timeout=RPC_TIMEOUT_S).turns == 2


def test_reused_request_id_without_a_session_is_refused_and_a_retry_replays(hs, stub):
    """The key alone (no session_id) names one request for the store's TTL, as Stripe's keys do."""
    rid = f"solo-{uuid.uuid4().hex[:8]}"
    body = {"prompt": PROMPT, "max_tokens": 6, "specdec": {"request_id": rid}}
    status, text = post(hs, "completions", body)
    assert status == 200, text
    first = json.loads(text)
    for retry in (body, {**body, "stream": True}):  # a true retry: the same completion, same session
        status, text = post(hs, "completions", retry)
        assert status == 200, text
        if retry.get("stream"):
            events = stream_events(text)
            assert [i for e in events for i in (e.get("specdec") or {}).get("token_ids", [])] == first["specdec"][
                "token_ids"
            ]
            assert events[-1]["specdec"]["session_id"] == first["specdec"]["session_id"]
        else:
            again = json.loads(text)
            assert again["choices"][0]["text"] == first["choices"][0]["text"]
            assert again["specdec"]["session_id"] == first["specdec"]["session_id"]
    for changed in (
        {**body, "prompt": PROMPT + " jumps"},
        {**body, "max_tokens": 7},
        {**body, "stream": True, "seed": 1},
    ):
        status, text = post(hs, "completions", changed)
        err = error_of(status, text)
        assert status == 409 and err["code"] == "idempotency_key_reused" and rid in err["message"], (changed, text)
    info = stub.GetSession(pb.SessionRequest(session_id=first["specdec"]["session_id"]), timeout=RPC_TIMEOUT_S)
    assert info.turns == 1, "a refused request must not add a turn"
    # gRPC: ALREADY_EXISTS for a different request, the stored result for the same one
    with pytest.raises(grpc.RpcError) as err:
        stub.Generate(pb.GenerateRequest(prompt="other", request_id=rid, max_new_tokens=6), timeout=RPC_TIMEOUT_S)
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS and "idempotency_key_reused" in err.value.details()
    grpc_rid = f"solo-grpc-{uuid.uuid4().hex[:8]}"
    req = pb.GenerateRequest(prompt=PROMPT, request_id=grpc_rid, max_new_tokens=5)
    one, two = (stub.Generate(req, timeout=RPC_TIMEOUT_S) for _ in range(2))
    assert (two.session_id, list(two.token_ids), two.text) == (one.session_id, list(one.token_ids), one.text)
    with pytest.raises(grpc.RpcError) as err:
        stub.Generate(pb.GenerateRequest(prompt=PROMPT, request_id=grpc_rid, max_new_tokens=4), timeout=RPC_TIMEOUT_S)
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS


def test_chat_retries_in_a_session_are_the_same_request(hs, stub):
    """OpenAI clients resend the conversation: a retried session-creating request (history with an
    assistant turn) and a retried later turn are retries, not reused keys."""
    sid = f"chat-{uuid.uuid4().hex[:8]}"
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Colours?"},
    ]
    first = {
        "messages": history,
        "max_tokens": 4,
        "specdec": {"session_id": sid, "create_session": True, "request_id": "turn-1"},
    }
    answers = [post(hs, "chat/completions", first) for _ in range(2)]
    assert [a[0] for a in answers] == [200, 200], answers
    assert len({json.loads(t)["choices"][0]["message"]["content"] for _, t in answers}) == 1
    reply = json.loads(answers[0][1])["choices"][0]["message"]["content"]
    second = {
        "messages": history + [{"role": "assistant", "content": reply}, {"role": "user", "content": "More?"}],
        "max_tokens": 4,
        "specdec": {"session_id": sid, "request_id": "turn-2"},
    }
    answers = [post(hs, "chat/completions", second) for _ in range(2)]
    assert [a[0] for a in answers] == [200, 200], answers
    assert stub.GetSession(pb.SessionRequest(session_id=sid), timeout=RPC_TIMEOUT_S).turns == 2
    changed = {**second, "messages": second["messages"][:-1] + [{"role": "user", "content": "Fewer?"}]}
    status, text = post(hs, "chat/completions", changed)
    assert status == 409 and error_of(status, text)["code"] == "idempotency_key_reused"


def test_duplicate_while_the_original_runs(hs, stub):
    sid, rid = f"dup-{uuid.uuid4().hex[:8]}", f"req-{uuid.uuid4().hex[:8]}"
    req = pb.GenerateRequest(
        prompt=PROMPT,
        session_id=sid,
        create_session=True,
        request_id=rid,
        max_new_tokens=LONG_MAX_TOKENS,
        ignore_eos=True,
    )
    holder = stub.GenerateStream(req, timeout=RPC_TIMEOUT_S)
    next(holder)
    try:
        body = {
            "prompt": PROMPT,
            "max_tokens": LONG_MAX_TOKENS,
            "specdec": {"session_id": sid, "request_id": rid, "ignore_eos": True},
        }
        started = time.monotonic()
        status, text = post(hs, "completions", body)
        err = error_of(status, text)
        assert status == 409 and err["code"] == "request_in_progress", text
        assert time.monotonic() - started < 5, "a duplicate must be answered at once, not wait for the original"
        status, text = post(hs, "completions", {**body, "prompt": "another"})
        assert status == 409 and error_of(status, text)["code"] == "idempotency_key_reused", text
        with pytest.raises(grpc.RpcError) as e:
            next(stub.GenerateStream(req, timeout=RPC_TIMEOUT_S))
        assert e.value.code() == grpc.StatusCode.ABORTED
        next(holder)  # the original was not disturbed
    finally:
        holder.cancel()
    REPORT["duplicate while running"] = "409 request_in_progress (gRPC ABORTED), a different request 409 reused"


# -- property-based: no 5xx, valid requests succeed ---------------------------------------------------


SURROGATE = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
BAD_TEXT = st.one_of(st.text(SURROGATE, min_size=1, max_size=3), st.tuples(TEXT, SURROGATE).map("".join), st.just(""))
HUGE = st.sampled_from([-1, -(2**31) - 1, 2**31, 2**32, 2**33, 2**40, 2**63, 2**64, 2**70, 10**12, 10**30])


def json_values(*texts: st.SearchStrategy) -> st.SearchStrategy:
    return st.recursive(
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(-(2**80), 2**80),
            HUGE,
            st.floats(allow_nan=False, allow_infinity=False),
            *texts,
        ),
        lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
        max_leaves=6,
    )


JSON_ANY = json_values(TEXT, BAD_TEXT)
JSON_WELL_FORMED = json_values(TEXT)  # text without lone surrogates (a body with one anywhere is refused)

VALID_EXT = st.fixed_dictionaries(
    {},
    optional={
        "k": st.integers(0, 8),
        "draft_kind": st.sampled_from(["model", "ngram", "combined"]),
        "trace": st.booleans(),
        "request_id": st.builds(lambda: f"fz-{uuid.uuid4().hex}"),
        "resume_offset": st.integers(0, 2**32 - 1),
        "top_k": st.sampled_from([-1, 0, 1, 5, 50]),
        "repetition_penalty": st.floats(0.5, 2.0),
        "draft_top_n": st.integers(1, 32),
        "ignore_eos": st.booleans(),
        "min_tokens": st.integers(0, 1),
        "max_rounds": st.integers(0, 5),
        "add_generation_prompt": st.booleans(),
        "adaptive_k": st.booleans(),
    },
)
EXT_NAMES = [
    "k",
    "draft_kind",
    "trace",
    "session_id",
    "create_session",
    "request_id",
    "resume_offset",
    "top_k",
    "repetition_penalty",
    "draft_top_n",
    "ignore_eos",
    "min_tokens",
    "max_rounds",
    "adaptive_k",
    "unknown",
]
VALID_TOP = {  # every field docs/http.md lists, with values the server must accept
    "model": st.sampled_from(["specdec"]),
    "temperature": st.floats(0.0, 2.0),
    "top_p": st.floats(0.05, 1.0),
    "seed": st.integers(0, 2**64 - 1),
    "frequency_penalty": st.floats(-2.0, 2.0),
    "presence_penalty": st.floats(-2.0, 2.0),
    "stop": st.one_of(TEXT, st.lists(TEXT, max_size=4)),
    "n": st.just(1),
    "best_of": st.just(1),
    "user": TEXT,
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "echo": st.just(False),
    "specdec": VALID_EXT,
    "top_k": st.sampled_from([-1, 0, 3]),
    "min_tokens": st.integers(0, 1),
    "ignore_eos": st.booleans(),
    "repetition_penalty": st.floats(0.8, 1.5),
    "tools": st.just([]),
    "tool_choice": st.just("none"),
    "response_format": st.just({"type": "text"}),
    "logit_bias": st.just({}),
    "parallel_tool_calls": st.booleans(),
}
PART = st.fixed_dictionaries({"type": st.just("text"), "text": TEXT})
VALID_MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "developer", "user", "assistant"]),
        "content": st.one_of(TEXT, st.lists(PART, min_size=1, max_size=3)),
    },
    optional={"name": TEXT},
)
UNKNOWN_KEYS = st.dictionaries(
    st.text("abcdefghijklmnopqrstuvwxyz_", min_size=3, max_size=10).map(lambda s: "x_" + s),
    JSON_WELL_FORMED,
    max_size=2,
)


@st.composite
def valid_request(draw) -> tuple[str, dict]:
    chat = draw(st.booleans())
    body = draw(st.fixed_dictionaries({}, optional=VALID_TOP))
    body.update(draw(UNKNOWN_KEYS))  # OpenAI clients send fields we do not know: ignored
    limit = "max_completion_tokens" if chat and draw(st.booleans()) else "max_tokens"
    body[limit] = draw(st.integers(1, 4))  # always set: the default is 128 tokens
    if chat:
        body["messages"] = draw(st.lists(VALID_MESSAGE, min_size=1, max_size=3)) + [{"role": "user", "content": "Hi"}]
        if draw(st.booleans()):
            body["logprobs"], body["top_logprobs"] = True, draw(st.integers(0, 5))
    else:
        # a prompt of control characters only tokenizes to nothing (a 400): valid prompts have a word too
        prompt = TEXT.map(lambda t: "Say " + t)
        body["prompt"] = draw(st.one_of(prompt, prompt.map(lambda t: [t])))
        if draw(st.booleans()):
            body["logprobs"] = draw(st.integers(0, 5))
    ext = body.get("specdec")
    if ext is not None:
        for name in ("top_k", "min_tokens", "ignore_eos", "repetition_penalty"):
            if name in ext and name in body:  # one place only (the same value in both is fine too)
                ext[name] = body[name]
        if draw(st.booleans()):  # a new session (ids must be fresh: a reused one continues it)
            ext.update(session_id=f"fz-{uuid.uuid4().hex}", create_session=True)
    return ("chat/completions" if chat else "completions"), body


@st.composite
def any_request(draw) -> tuple[str, dict]:
    """A valid request with some fields replaced by anything (wrong types, huge numbers, bad text)."""
    path, body = draw(valid_request())
    names = list(VALID_TOP) + [
        "messages",
        "prompt",
        "logprobs",
        "top_logprobs",
        "functions",
        "function_call",
        "suffix",
        "audio",
        "modalities",
        "guided_json",
    ]
    for name in draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True)):
        body[name] = draw(JSON_ANY)
    if draw(st.booleans()):  # the limits too, but never a valid one over 4 tokens (or unset: 128)
        body["max_tokens"] = draw(st.one_of(st.integers(-3, 4), HUGE, st.sampled_from(["4", 4.5, True, [4], {}])))
    if draw(st.booleans()) and isinstance(body.get("specdec"), dict):
        body["specdec"][draw(st.sampled_from(EXT_NAMES))] = draw(JSON_ANY)
    if path.startswith("chat") and isinstance(body.get("messages"), list) and draw(st.booleans()):
        body["messages"].append(
            {
                "role": draw(st.one_of(TEXT, JSON_ANY)),
                "content": draw(
                    st.one_of(
                        JSON_ANY,
                        st.lists(
                            st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": JSON_ANY})
                        ),
                    )
                ),
            }
        )
    return path, body


def test_fuzz_no_5xx_and_valid_requests_succeed(hs):
    seen: dict[str, int] = {}
    started = time.monotonic()

    @settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=FUZZ_DERANDOMIZE,
        database=None,
    )
    @given(st.one_of(valid_request().map(lambda r: (True, r)), any_request().map(lambda r: (False, r))))
    def one(case):
        valid, (path, body) = case
        status, text = post(hs, path, body)
        assert status < 500, (status, text[:500], body)
        if valid:
            assert status == 200, (status, text[:500], body)
            if body.get("stream"):
                events = stream_events(text)
                assert not any("error" in e for e in events), (events[-1], body)
            else:
                limit = body.get("max_tokens") or body["max_completion_tokens"]
                assert json.loads(text)["usage"]["completion_tokens"] <= limit
        key = f"{'valid' if valid else 'any'} {status}"
        seen[key] = seen.get(key, 0) + 1

    one()
    took = time.monotonic() - started
    REPORT["fuzz"] = f"{sum(seen.values())} requests in {took:.1f} s: {dict(sorted(seen.items()))}"
    assert any(k.startswith("valid 200") for k in seen) and any(k.startswith("any 4") for k in seen), seen
