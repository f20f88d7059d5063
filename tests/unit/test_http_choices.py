"""OpenAI's `n` in the gateway (http_gateway/choices.py, openai_schema): pure, no servers."""

from __future__ import annotations

import pytest

from http_gateway import choices
from http_gateway import openai_schema as schema
from specdec.v1 import orchestrator_pb2 as pb

PROMPT = {"prompt": "hi"}


def test_each_choice_is_the_request_with_its_own_seed_and_request_id():
    req = schema.parse_request({**PROMPT, "n": 3, "seed": 5, "temperature": 0.7, "max_tokens": 9}, chat=False).request
    out = choices.choice_requests(req, 3)
    assert [r.sampling.seed for r in out] == [5, 6, 7]
    assert [r.request_id for r in out] == [req.request_id, f"{req.request_id}-1", f"{req.request_id}-2"]
    for r in out:   # nothing else differs
        r.ClearField("request_id")
        r.sampling.ClearField("seed")
    assert out[0] == out[1] == out[2] and out[0].max_new_tokens == 9
    assert choices.choice_requests(req, 1) == [req]


def test_without_a_seed_no_choice_gets_one_and_the_largest_seed_wraps():
    req = schema.parse_request({**PROMPT, "n": 2, "temperature": 0.7}, chat=False).request
    assert not any(r.sampling.HasField("seed") for r in choices.choice_requests(req, 2))
    req.sampling.seed = 2 ** 64 - 1
    assert [r.sampling.seed for r in choices.choice_requests(req, 2)] == [2 ** 64 - 1, 0]


@pytest.mark.parametrize("body, chat, header, message", [
    ({**PROMPT, "n": 0}, False, None, "'n' must be >= 1"),
    ({**PROMPT, "n": -2}, False, None, "'n' must be >= 1"),
    ({**PROMPT, "n": "2"}, False, None, "must be int"),
    ({**PROMPT, "n": 2, "specdec": {"session_id": "s1"}}, False, None, "with a session"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, True, "s1", "with a session"),
    ({**PROMPT, "n": 2, "specdec": {"resume_offset": 3}}, False, None, "with resume_offset"),
])
def test_bad_n_is_a_400_naming_n(body, chat, header, message):
    with pytest.raises(schema.ApiError) as err:
        schema.parse_request(body, chat=chat, session_header=header)
    assert err.value.status == 400 and err.value.param == "n" and message in err.value.message


def test_n_defaults_to_one():
    assert schema.parse_request(PROMPT, chat=False).n == 1
    assert schema.parse_request({**PROMPT, "n": 4}, chat=False).n == 4


def _response(text: str, completion: int) -> pb.GenerateResponse:
    return pb.GenerateResponse(text=text, token_ids=list(range(completion)), session_id=f"s-{text}",
                               request_id=f"r-{text}", finish_reason=pb.FINISH_REASON_LENGTH,
                               usage=pb.Usage(prompt_tokens=7, completion_tokens=completion,
                                              total_tokens=7 + completion, cached_prompt_tokens=2))


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
    parsed = schema.parse_request({"messages": [{"role": "user", "content": "hi"}], "n": 2, "stream": True,
                                   "stream_options": {"include_usage": True}}, chat=True)
    writer = schema.ChunkWriter(parsed, "m", id="chatcmpl-x", index=1, usage_chunk=False)
    final = pb.GenerateChunk(text_delta="yo", token_ids=[4], finish_reason=pb.FINISH_REASON_EOS,
                             usage=pb.Usage(prompt_tokens=3, completion_tokens=1, total_tokens=4))
    out = writer.chunks(final)
    assert [c["choices"][0]["index"] for c in out] == [1, 1]
    assert out[-1]["choices"][0]["finish_reason"] == "stop" and "usage" not in out[-1]
    usage = writer.usage_body([schema.usage(final.usage), schema.usage(final.usage)])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 2 and usage["id"] == "chatcmpl-x"
    alone = schema.ChunkWriter(schema.parse_request({"messages": [{"role": "user", "content": "hi"}], "stream": True,
                                                     "stream_options": {"include_usage": True}}, chat=True), "m")
    assert alone.chunks(final)[-1]["choices"] == []    # n = 1: the writer sends the usage chunk itself
