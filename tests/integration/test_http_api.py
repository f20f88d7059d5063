"""The OpenAI-compatible HTTP API (http_gateway/), driven by the official `openai` package.

The stack is real processes (tests/http_support.py): Redis, a tiny target and draft,
the orchestrator, and the gateway in front of it. Greedy output must equal the target
decoding alone (HF generate in this process) and the orchestrator's own gRPC answer.
Every error class reaches the openai client (max_retries=0) as its exception.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.request
import uuid

import grpc
import openai
import pytest
from transformers import AutoTokenizer

from http_gateway.process import GatewayProcess
from specdec.launcher import Proc
from specdec.v1 import orchestrator_pb2 as pb
from specdec.v1 import orchestrator_pb2_grpc
from tests.http_support import AUTH_TOKEN, shared_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # one shared process stack: ~10-20 s to start

MAX_TOKENS = 24
CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three colours."}]
PROMPT = "The quick brown fox"
RPC_TIMEOUT_S = 60.0
LONG_MAX_TOKENS = 1500  # the request that holds the only admission slot while the next one is refused
READY_TIMEOUT_S = 120.0
LOGPROB_ATOL = 1e-4
MAX_N = 16  # GatewayConfig.max_n (SPECDEC_HTTP_MAX_N unset)


@pytest.fixture(scope="module")
def hs():
    return shared_stack()


@pytest.fixture(scope="module")
def client(hs):
    with openai.OpenAI(base_url=hs.base_url, api_key="unused", max_retries=0, timeout=RPC_TIMEOUT_S) as c:
        yield c


@pytest.fixture(scope="module")
def stub(hs):
    channel = grpc.insecure_channel(hs.orchestrator)
    yield orchestrator_pb2_grpc.OrchestratorStub(channel)
    channel.close()


@pytest.fixture(scope="module")
def tokenizer(hs):
    return AutoTokenizer.from_pretrained(str(hs.target_dir), local_files_only=True)


@pytest.fixture(scope="module")
def eos(stub):
    status = stub.Status(pb.StatusRequest(), timeout=RPC_TIMEOUT_S)
    return sorted(next(r.info for r in status.replicas if r.role == "target").eos_token_ids)


def chat_prompt_ids(tokenizer, messages) -> list[int]:
    """What the orchestrator feeds the target: the chat template's text, tokenized as is."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def http(url: str, body: dict | None = None, headers: dict | None = None) -> tuple[int, dict, dict]:
    """(status, JSON body, headers) of a plain HTTP call (what curl would do)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=RPC_TIMEOUT_S) as resp:
            return resp.status, json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)


# -- the three calls the issue names ---------------------------------------------------------------


def test_completion_equals_target_alone(hs, client, tokenizer, eos, stub):
    resp = client.completions.create(
        model="specdec", prompt=PROMPT, max_tokens=MAX_TOKENS, extra_body={"specdec": {"k": 3}}
    )
    ids = resp.model_extra["specdec"]["token_ids"]
    want = hs.target_alone(tokenizer.encode(PROMPT), MAX_TOKENS, eos)
    assert ids == want
    assert resp.object == "text_completion" and resp.usage.completion_tokens == len(ids)
    grpc_resp = stub.Generate(pb.GenerateRequest(prompt=PROMPT, max_new_tokens=MAX_TOKENS, k=3), timeout=RPC_TIMEOUT_S)
    assert list(grpc_resp.token_ids) == ids and grpc_resp.text == resp.choices[0].text


def test_chat_stream_equals_unary_equals_target(hs, client, tokenizer, eos, stub):
    unary = client.chat.completions.create(model="specdec", messages=CHAT, max_tokens=MAX_TOKENS)
    text = unary.choices[0].message.content
    ids = unary.model_extra["specdec"]["token_ids"]
    assert unary.object == "chat.completion" and unary.choices[0].message.role == "assistant"
    assert unary.choices[0].finish_reason in ("stop", "length")

    stream = client.chat.completions.create(
        model="specdec", messages=CHAT, max_tokens=MAX_TOKENS, stream=True, stream_options={"include_usage": True}
    )
    deltas, stream_ids, finish, usage = [], [], None, None
    for chunk in stream:
        if chunk.choices:
            deltas.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        stream_ids += (chunk.model_extra.get("specdec") or {}).get("token_ids", [])
        usage = chunk.usage or usage
    assert "".join(deltas) == text
    assert stream_ids == ids
    assert finish == unary.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == len(ids)

    # the target alone (HF greedy) on the templated prompt, and the orchestrator over gRPC with k=0
    want = hs.target_alone(chat_prompt_ids(tokenizer, CHAT), MAX_TOKENS, eos)
    assert ids == want
    req = pb.GenerateRequest(max_new_tokens=MAX_TOKENS, k=0)
    for m in CHAT:
        req.messages.messages.add(**m)
    assert list(stub.Generate(req, timeout=RPC_TIMEOUT_S).token_ids) == ids


def test_sse_wire_format_ends_with_done(hs):
    body = {"model": "specdec", "prompt": PROMPT, "max_tokens": 8, "stream": True}
    req = urllib.request.Request(
        f"{hs.base_url}/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=RPC_TIMEOUT_S) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        raw = resp.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2][len("data: ") :])
    assert last["choices"][0]["finish_reason"] in ("stop", "length") and last["usage"]["completion_tokens"] == 8


def test_models_and_health(hs, client):
    ids = [m.id for m in client.models.list().data]
    assert "specdec" in ids and str(hs.target_dir) in ids
    status, body, _ = http(f"{hs.gateway.url}/health")
    assert status == 200 and body["orchestrator_health"] == "SERVING"
    # the served id works as `model` too
    resp = client.completions.create(model=str(hs.target_dir), prompt=PROMPT, max_tokens=2)
    assert resp.model == str(hs.target_dir)


def test_defaults_are_the_grpc_defaults(hs, client, stub):
    """A request that leaves everything out behaves like a gRPC request with everything unset
    (temperature 0 = greedy, max_new_tokens 128, k 4), not like OpenAI's temperature 1.0."""
    resp = client.completions.create(model="specdec", prompt=PROMPT)
    grpc_resp = stub.Generate(pb.GenerateRequest(prompt=PROMPT), timeout=RPC_TIMEOUT_S)
    assert resp.model_extra["specdec"]["token_ids"] == list(grpc_resp.token_ids)
    again = client.completions.create(model="specdec", prompt=PROMPT)
    assert again.choices[0].text == resp.choices[0].text


def test_sampling_fields_and_seed(client):
    kw = dict(
        model="specdec",
        prompt=PROMPT,
        max_tokens=12,
        temperature=0.9,
        top_p=0.95,
        seed=7,
        frequency_penalty=0.1,
        presence_penalty=0.1,
        stop=["\n\n\n"],
        user="test-user",
    )
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert a.model_extra["specdec"]["token_ids"] == b.model_extra["specdec"]["token_ids"]


def test_extension_trace_and_stats(client):
    resp = client.chat.completions.create(
        model="specdec",
        messages=CHAT,
        max_tokens=10,
        extra_body={"specdec": {"k": 2, "trace": True, "draft_kind": "model"}},
    )
    ext = resp.model_extra["specdec"]
    assert ext["stats"]["rounds"] == len(ext["trace"]) >= 1
    assert all(r["k"] <= 2 for r in ext["trace"])
    assert ext["finish_reason"] == resp.choices[0].finish_reason and ext["session_id"] and ext["request_id"]
    assert (ext["finish_reason"], ext["finish_detail"]) in (("stop", "eos"), ("length", "length"))


def test_n_choices_are_the_single_requests_with_seeds_seed_plus_i(client):
    """OpenAI's n: choice i is the n = 1 request with seed + i; the prompt is counted once in usage."""
    kw = dict(model="specdec", prompt=PROMPT, max_tokens=10, temperature=1.0, seed=11, logprobs=1)
    many = client.completions.create(n=3, **kw)
    singles = [client.completions.create(**{**kw, "seed": 11 + i}) for i in range(3)]
    assert [c.index for c in many.choices] == [0, 1, 2]
    assert [c.text for c in many.choices] == [s.choices[0].text for s in singles]
    assert [c["token_ids"] for c in many.model_extra["specdec"]["choices"]] == [
        s.model_extra["specdec"]["token_ids"] for s in singles
    ]
    for c, s in zip(many.choices, singles, strict=True):  # choices run together share batched passes: float noise only
        assert c.logprobs.token_logprobs == pytest.approx(s.choices[0].logprobs.token_logprobs, abs=LOGPROB_ATOL)
    assert len({s.choices[0].text for s in singles}) > 1  # the seeds differ, so do the samples
    assert many.usage.prompt_tokens == singles[0].usage.prompt_tokens
    assert many.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)


def test_n_choices_streamed_equal_the_whole_answer(client):
    kw = dict(model="specdec", messages=CHAT, max_tokens=10, temperature=1.0, seed=3, n=2)
    whole = client.chat.completions.create(**kw)
    text, finish, usage = {0: "", 1: ""}, {}, None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert text == {c.index: c.message.content for c in whole.choices}
    assert finish == {c.index: c.finish_reason for c in whole.choices}
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


def test_stop_string(client):
    full = client.completions.create(model="specdec", prompt=PROMPT, max_tokens=MAX_TOKENS).choices[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    if not stop.strip():
        pytest.skip("no usable stop string in this output")
    cut = client.completions.create(model="specdec", prompt=PROMPT, max_tokens=MAX_TOKENS, stop=stop)
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == full[: full.index(stop)]


def test_logprobs(client):
    resp = client.chat.completions.create(model="specdec", messages=CHAT, max_tokens=4, logprobs=True, top_logprobs=2)
    content = resp.choices[0].logprobs.content
    assert len(content) == 4 and all(len(c.top_logprobs) == 2 for c in content)
    assert [c.token for c in content] == [f"token_id:{i}" for i in resp.model_extra["specdec"]["token_ids"]]
    comp = client.completions.create(model="specdec", prompt=PROMPT, max_tokens=3, logprobs=1)
    assert len(comp.choices[0].logprobs.token_logprobs) == 3


def test_session_continuation(hs, client, stub):
    """With a session only the new (last user) message is appended; without one each request is a fresh
    session, whose prompt the target serves from the longest prefix a cached session holds (prefix sharing)."""
    sid = f"http-{uuid.uuid4().hex[:8]}"
    first = client.chat.completions.create(
        model="specdec",
        messages=CHAT,
        max_tokens=6,
        extra_body={"specdec": {"session_id": sid, "create_session": True}},
    )
    history = CHAT + [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And three more?"},
    ]
    second = client.chat.completions.create(
        model="specdec", messages=history, max_tokens=6, extra_headers={"X-Specdec-Session": sid}
    )
    assert second.model_extra["specdec"]["session_id"] == sid
    info = stub.GetSession(pb.SessionRequest(session_id=sid), timeout=RPC_TIMEOUT_S)
    assert info.turns == 2
    # the session's context = first turn + its completion + the new turn: the earlier turns were cached
    assert second.usage.prompt_tokens_details.cached_tokens == first.usage.total_tokens
    fresh = client.chat.completions.create(model="specdec", messages=history, max_tokens=6)
    assert fresh.model_extra["specdec"]["session_id"] != sid
    # the session above holds this whole prompt: all of it but the last token (whose logits are asked) is shared
    assert fresh.usage.prompt_tokens_details.cached_tokens == fresh.usage.prompt_tokens - 1


# -- errors -----------------------------------------------------------------------------------------


def test_400_validation(client):
    for n in (0, MAX_N + 1):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="specdec", prompt=PROMPT, n=n)
        assert e.value.status_code == 400 and e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError):  # orchestrator: INVALID_ARGUMENT
        client.completions.create(model="specdec", prompt=PROMPT, extra_body={"specdec": {"k": 99}})
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="specdec", messages=CHAT, max_tokens=0)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="specdec", messages=CHAT, stream=True, top_p=0.0)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="specdec", prompt=PROMPT, extra_body={"specdec": {"kk": 1}})
    assert "kk" in e.value.message


def test_every_error_has_one_shape(hs):
    """The gateway's own 400, the orchestrator's INVALID_ARGUMENT, a 404 and a 405: the same four keys, `code`
    always a string, `param` the field when it is known."""
    url = hs.gateway.url
    own = http(f"{url}/v1/completions", {"model": "specdec", "prompt": PROMPT, "n": 0})
    theirs = http(f"{url}/v1/completions", {"model": "specdec", "prompt": PROMPT, "specdec": {"k": 99}})
    limit = http(f"{url}/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 0})
    for (status, body, _), param in ((own, "n"), (theirs, "specdec.k"), (limit, "max_completion_tokens")):
        assert status == 400 and body["error"]["param"] == param, body
        assert (body["error"]["type"], body["error"]["code"]) == ("invalid_request_error", "invalid_argument"), body
    for path, body, status, code in (
        ("/v1/nothing", None, 404, "not_found"),
        ("/v1/completions", None, 405, "method_not_allowed"),
    ):
        got = http(f"{url}{path}", body)
        assert got[0] == status and list(got[1]["error"]) == ["message", "type", "param", "code"], got
        assert got[1]["error"]["code"] == code and got[1]["error"]["type"] == "invalid_request_error", got


def test_404_unknown_model_and_session(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=CHAT)
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(
            model="specdec", messages=CHAT, extra_body={"specdec": {"session_id": "no-such-session"}}
        )
    assert e.value.code == "session_not_found"
    with pytest.raises(openai.NotFoundError):  # streamed: the status is known before the first byte
        client.completions.create(
            model="specdec", prompt=PROMPT, stream=True, extra_headers={"X-Specdec-Session": "no-such-session"}
        )


def test_401_with_tokens_configured(hs):
    gw = GatewayProcess(
        hs.orchestrator, log_dir=str(hs.stack.log_dir), extra_env={"SPECDEC_AUTH_TOKENS": f"other,{AUTH_TOKEN}"}
    ).start()
    try:
        bad = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as e:
            bad.completions.create(model="specdec", prompt=PROMPT, max_tokens=2)
        assert e.value.status_code == 401
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        good = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=AUTH_TOKEN, max_retries=0)
        assert good.completions.create(model="specdec", prompt=PROMPT, max_tokens=2).usage.completion_tokens == 2
        assert http(f"{gw.url}/health")[0] == 200  # probes need no token
    finally:
        gw.stop()


def _spare_orchestrator(hs, max_concurrent: int) -> Proc:
    """A second orchestrator process over the same targets, drafts and Redis, with its own admission cap, started
    as the stack starts its own (a fork of the suite's fork server); the caller takes it off the stack's lists."""
    proc = hs.stack.start_orchestrator(
        args=["--max-concurrent", str(max_concurrent)], env={"SPECDEC_DRAIN_SECONDS": "1"}
    )
    hs.stack.wait_ready(proc, timeout=READY_TIMEOUT_S)
    return proc


def _wait_for_a_free_slot(c: openai.OpenAI, wait_s: float = 30.0) -> None:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            c.completions.create(model="specdec", prompt=PROMPT, max_tokens=2)
            return
        except openai.RateLimitError:
            assert time.monotonic() < deadline, "the admission slot was never released"
            time.sleep(0.2)


def test_429_overload_then_503_orchestrator_stopped(hs):
    proc = _spare_orchestrator(hs, max_concurrent=1)
    gw = GatewayProcess(proc.address, log_dir=str(hs.stack.log_dir)).start()
    c = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0, timeout=RPC_TIMEOUT_S)
    try:
        # One stream holds the only slot (it runs to max_tokens: EOS ignored) ...
        holder = c.completions.create(
            model="specdec",
            prompt=PROMPT,
            max_tokens=LONG_MAX_TOKENS,
            stream=True,
            extra_body={"specdec": {"ignore_eos": True}},
        )
        next(iter(holder))
        # ... so the next request is refused with RESOURCE_EXHAUSTED -> 429, unary and streamed.
        with pytest.raises(openai.RateLimitError) as e:
            c.completions.create(model="specdec", prompt=PROMPT, max_tokens=2)
        assert e.value.status_code == 429
        with pytest.raises(openai.RateLimitError):
            c.chat.completions.create(model="specdec", messages=CHAT, max_tokens=2, stream=True)
        holder.close()
        _wait_for_a_free_slot(c)  # the slot frees once the orchestrator sees the cancel
        # n = 2 with one slot: the whole request is refused (not one choice of two), its admitted choice cancelled
        for stream in (False, True):
            with pytest.raises(openai.RateLimitError):
                c.completions.create(
                    model="specdec",
                    prompt=PROMPT,
                    max_tokens=LONG_MAX_TOKENS,
                    n=2,
                    stream=stream,
                    extra_body={"specdec": {"ignore_eos": True}},
                )
            _wait_for_a_free_slot(c)
        # Orchestrator stopped: UNAVAILABLE -> 503 (InternalServerError is openai's class for 5xx).
        proc.popen.send_signal(signal.SIGTERM)
        assert proc.popen.wait(timeout=30) == 0
        with pytest.raises(openai.InternalServerError) as e:
            c.completions.create(model="specdec", prompt=PROMPT, max_tokens=2)
        assert e.value.status_code == 503
        with pytest.raises(openai.InternalServerError) as e:
            c.chat.completions.create(model="specdec", messages=CHAT, max_tokens=2, stream=True)
        assert e.value.status_code == 503
        assert http(f"{gw.url}/health")[0] == 503
    finally:
        gw.stop()
        if proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait()
        hs.stack.procs.remove(proc)  # the shared stack's other users see its own orchestrator only
        hs.stack.orchestrators.remove(proc)
