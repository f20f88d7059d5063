"""OpenAI's `n` in the gateway (http_gateway/choices.py, openai_schema): pure, no servers."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from http_gateway import app, choices, errors
from http_gateway import openai_schema as schema
from specdec.v1 import orchestrator_pb2 as pb

PROMPT = {"prompt": "hi"}


def test_each_choice_is_the_request_with_its_own_seed_and_request_id():
    req = schema.parse_request({**PROMPT, "n": 3, "seed": 5, "temperature": 0.7, "max_tokens": 9}, chat=False).request
    out = choices.choice_requests(req, 3)
    assert [r.sampling.seed for r in out] == [5, 6, 7]
    assert [r.request_id for r in out] == [req.request_id, f"{req.request_id}-1", f"{req.request_id}-2"]
    for r in out:  # nothing else differs
        r.ClearField("request_id")
        r.sampling.ClearField("seed")
    assert out[0] == out[1] == out[2] and out[0].max_new_tokens == 9
    assert choices.choice_requests(req, 1) == [req]


def test_without_a_seed_no_choice_gets_one_and_the_largest_seed_wraps():
    req = schema.parse_request({**PROMPT, "n": 2, "temperature": 0.7}, chat=False).request
    assert not any(r.sampling.HasField("seed") for r in choices.choice_requests(req, 2))
    req.sampling.seed = 2**64 - 1
    assert [r.sampling.seed for r in choices.choice_requests(req, 2)] == [2**64 - 1, 0]


@pytest.mark.parametrize(
    "body, chat, header, message",
    [
        ({**PROMPT, "n": 0}, False, None, "'n' must be >= 1"),
        ({**PROMPT, "n": -2}, False, None, "'n' must be >= 1"),
        ({**PROMPT, "n": "2"}, False, None, "must be int"),
        ({**PROMPT, "n": 2, "specdec": {"session_id": "s1"}}, False, None, "with a session"),
        ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, True, "s1", "with a session"),
        ({**PROMPT, "n": 2, "specdec": {"resume_offset": 3}}, False, None, "with resume_offset"),
    ],
)
def test_bad_n_is_a_400_naming_n(body, chat, header, message):
    with pytest.raises(errors.ApiError) as err:
        schema.parse_request(body, chat=chat, session_header=header)
    assert err.value.status == 400 and err.value.param == "n" and message in err.value.message


def test_n_defaults_to_one():
    assert schema.parse_request(PROMPT, chat=False).n == 1
    assert schema.parse_request({**PROMPT, "n": 4}, chat=False).n == 4


def _response(text: str, completion: int) -> pb.GenerateResponse:
    return pb.GenerateResponse(
        text=text,
        token_ids=list(range(completion)),
        session_id=f"s-{text}",
        request_id=f"r-{text}",
        finish_reason=pb.FINISH_REASON_LENGTH,
        usage=pb.Usage(
            prompt_tokens=7, completion_tokens=completion, total_tokens=7 + completion, cached_prompt_tokens=2
        ),
    )


def test_merged_body_has_every_choice_in_order_and_counts_the_prompt_once():
    parsed = schema.parse_request({**PROMPT, "n": 2}, chat=False)
    bodies = [schema.response_body(parsed, _response(t, c), "m") for t, c in (("a", 3), ("b", 5))]
    body = choices.merged_body(bodies)
    assert [(c["index"], c["text"]) for c in body["choices"]] == [(0, "a"), (1, "b")]
    assert body["usage"]["prompt_tokens"] == 7 and body["usage"]["completion_tokens"] == 8
    assert body["usage"]["total_tokens"] == 15 and body["usage"]["prompt_tokens_details"]["cached_tokens"] == 2
    assert [c["session_id"] for c in body["specdec"]["choices"]] == ["s-a", "s-b"]
    assert [c["index"] for c in body["specdec"]["choices"]] == [0, 1]
    assert body["id"] == "cmpl-r-a"
    assert choices.merged_body(bodies[:1]) is bodies[0]


def test_stream_chunks_carry_their_choice_and_leave_the_usage_chunk_to_the_caller():
    parsed = schema.parse_request(
        {
            "messages": [{"role": "user", "content": "hi"}],
            "n": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        chat=True,
    )
    writer = schema.ChunkWriter(parsed, "m", id="chatcmpl-x", index=1, usage_chunk=False)
    final = pb.GenerateChunk(
        text_delta="yo",
        token_ids=[4],
        finish_reason=pb.FINISH_REASON_EOS,
        usage=pb.Usage(prompt_tokens=3, completion_tokens=1, total_tokens=4),
    )
    out = writer.chunks(final)
    assert [c["choices"][0]["index"] for c in out] == [1, 1]
    assert out[-1]["choices"][0]["finish_reason"] == "stop" and "usage" not in out[-1]
    usage = writer.usage_body([schema.usage(final.usage), schema.usage(final.usage)])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 2 and usage["id"] == "chatcmpl-x"
    alone = schema.ChunkWriter(
        schema.parse_request(
            {
                "messages": [{"role": "user", "content": "hi"}],
                "stream": True,
                "stream_options": {"include_usage": True},
            },
            chat=True,
        ),
        "m",
    )
    assert alone.chunks(final)[-1]["choices"] == []  # n = 1: the writer sends the usage chunk itself


class _FakeCall:
    """A stand-in for a grpc.aio call: an awaitable / async iterator that records cancel()."""

    def __init__(self, chunks: list, error: BaseException | None = None, delay_s: float = 0.0) -> None:
        self.chunks, self.error, self.delay_s, self.cancelled = list(chunks), error, delay_s, False

    def cancel(self) -> bool:
        self.cancelled = True
        return True

    def __aiter__(self):
        return self

    async def __anext__(self):
        await asyncio.sleep(self.delay_s)
        if self.chunks:
            return self.chunks.pop(0)
        if self.error is not None:
            raise self.error
        raise StopAsyncIteration

    def __await__(self):
        return self.__anext__().__await__()


def _rpc_error(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "refused")


def test_a_failed_choice_is_raised_itself_and_every_call_is_cancelled():
    calls = [_FakeCall(["a"], delay_s=0.5), _FakeCall([], _rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED))]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        asyncio.run(app._all_choices(calls, calls))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert all(c.cancelled for c in calls)
    ok = [_FakeCall(["a"]), _FakeCall(["b"])]
    assert asyncio.run(app._all_choices(ok, ok)) == ["a", "b"] and not any(c.cancelled for c in ok)


def test_merged_streams_give_every_chunk_with_its_choice_and_raise_a_mid_stream_error():
    async def collect(calls):
        firsts = [await c.__anext__() for c in calls]
        got = []
        try:
            async for item in app._merged(calls, firsts):
                got.append(item)
        except grpc.aio.AioRpcError as exc:
            got.append(exc.code())
        return got

    got = asyncio.run(collect([_FakeCall(["a0", "a1", "a2"]), _FakeCall(["b0", "b1"])]))
    assert sorted(got) == [(0, "a0"), (0, "a1"), (0, "a2"), (1, "b0"), (1, "b1")]
    assert [c for i, c in got if i == 0] == ["a0", "a1", "a2"]  # each choice in its own order
    failing = asyncio.run(
        collect([_FakeCall(["a0", "a1"], delay_s=0.05), _FakeCall(["b0"], _rpc_error(grpc.StatusCode.UNAVAILABLE))])
    )
    assert failing[-1] == grpc.StatusCode.UNAVAILABLE and (1, "b0") in failing
    alone = asyncio.run(collect([_FakeCall(["x0", "x1"])]))
    assert alone == [(0, "x0"), (0, "x1")]
