"""The gateway's request checks (http_gateway/validation.py via openai_schema.parse_request): pure, no servers.

Every case the issue found answering 500 must be a 400 naming the field; the vLLM top-level extras
map to the extension's fields; gRPC errors with the idempotency markers get their own codes.
"""

from __future__ import annotations

import grpc
import pytest

from http_gateway import errors
from http_gateway import openai_schema as schema
from http_gateway.validation import UNSUPPORTED, BadField, assign, check_strings
from specdec.errors import IDEMPOTENCY_KEY_REUSED, REQUEST_IN_PROGRESS
from specdec.v1 import orchestrator_pb2 as pb

PROMPT = {"prompt": "hi"}
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def refused(body: dict, chat: bool = False) -> errors.ApiError:
    with pytest.raises(errors.ApiError) as err:
        schema.parse_request(body, chat=chat)
    assert err.value.status == 400, err.value.message
    return err.value


@pytest.mark.parametrize(
    "body, chat, param",
    [
        ({**PROMPT, "max_tokens": 10**12}, False, "max_tokens"),
        ({**PROMPT, "max_tokens": 2**40, "stream": True}, False, "max_tokens"),
        ({**CHAT, "max_completion_tokens": 2**40}, True, "max_completion_tokens"),
        ({**PROMPT, "seed": 2**70}, False, "seed"),
        ({**PROMPT, "seed": -1}, False, "seed"),
        ({**PROMPT, "logprobs": 2**40}, False, "logprobs"),
        ({**CHAT, "logprobs": True, "top_logprobs": 2**40}, True, "top_logprobs"),
        ({**PROMPT, "specdec": {"k": 10**30}}, False, "specdec.k"),
        ({**PROMPT, "specdec": {"resume_offset": -1}}, False, "specdec.resume_offset"),
        ({**PROMPT, "specdec": {"resume_offset": 2**33}}, False, "specdec.resume_offset"),
        ({**PROMPT, "specdec": {"min_tokens": 2**40}}, False, "specdec.min_tokens"),
        ({**PROMPT, "specdec": {"max_rounds": 2**40}}, False, "specdec.max_rounds"),
        ({**PROMPT, "specdec": {"top_k": 2**40}}, False, "specdec.top_k"),
        ({**PROMPT, "specdec": {"draft_top_n": 2**40}}, False, "specdec.draft_top_n"),
        ({**PROMPT, "top_k": 2**40}, False, "top_k"),
        ({**PROMPT, "temperature": 1e39}, False, "temperature"),
        ({**PROMPT, "specdec": {"repetition_penalty": 10**400}}, False, "specdec.repetition_penalty"),
    ],
)
def test_out_of_range_numbers_are_400_naming_the_field(body, chat, param):
    err = refused(body, chat)
    assert err.param == param and param in err.message
    assert "range" in err.message or "too large" in err.message


@pytest.mark.parametrize(
    "body, chat, param",
    [
        ({"messages": [{"role": "user", "content": "a\ud800"}]}, True, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udc80"}]}]},
            True,
            "messages[0].content[0].text",
        ),
        ({"messages": [{"role": "\ud800", "content": "x"}]}, True, "messages[0].role"),
        ({"prompt": "\udc80x"}, False, "prompt"),
        ({**PROMPT, "stop": ["ok", "\ud800"]}, False, "stop[1]"),
        ({**PROMPT, "stop": "\ud800"}, False, "stop"),
        ({**PROMPT, "specdec": {"session_id": "\ud800"}}, False, "specdec.session_id"),
        ({**PROMPT, "user": "\udfff"}, False, "user"),
        ({**PROMPT, "some_unknown_key": {"deep": ["\ud800"]}}, False, "some_unknown_key.deep[0]"),
    ],
)
def test_lone_surrogates_anywhere_are_400_naming_the_path(body, chat, param):
    err = refused(body, chat)
    assert err.param == param and "surrogate" in err.message


def test_a_surrogate_in_a_key_is_refused():
    assert "surrogate" in refused({**PROMPT, "\ud800": 1}).message
    assert "surrogate" in refused({**PROMPT, "specdec": {"\udc00": 1}}).message


def test_paired_surrogates_written_as_escapes_are_one_character_and_fine():
    check_strings({"text": "\U0001f600", "list": ["é", "中"]})  # what json.loads makes of "\ud83d\ude00"


@pytest.mark.parametrize(
    "name, value",
    [
        ("tools", [{"type": "function", "function": {"name": "f"}}]),
        ("tool_choice", "auto"),
        ("functions", [{"name": "f"}]),
        ("function_call", "auto"),
        ("response_format", {"type": "json_object"}),
        ("logit_bias", {"50256": -100}),
        ("suffix", "end"),
        ("audio", {"voice": "alloy"}),
        ("modalities", ["text", "audio"]),
        ("guided_json", {"type": "object"}),
        ("use_beam_search", True),
    ],
)
def test_unsupported_openai_features_are_400_naming_the_field(name, value):
    err = refused({**PROMPT, name: value})
    assert err.param == name and "not supported" in err.message


@pytest.mark.parametrize("name, value", [("overlap", True), ("overlap_branches", 2)])
def test_the_removed_overlap_extension_fields_are_400_naming_them(name, value):
    """Overlapped rounds are gone: an old client that still sends their fields is told so, as any unknown
    extension field is (a silent ignore would hide that they no longer do anything)."""
    err = refused({**PROMPT, "specdec": {name: value}})
    assert err.param == f"specdec.{name}"


@pytest.mark.parametrize(
    "name, value",
    [
        ("tools", []),
        ("tool_choice", "none"),
        ("response_format", {"type": "text"}),
        ("logit_bias", {}),
        ("modalities", ["text"]),
        ("parallel_tool_calls", True),
        ("store", False),
        ("metadata", {"a": "b"}),
    ],
)
def test_harmless_values_and_unknown_fields_are_accepted(name, value):
    assert schema.parse_request({**PROMPT, name: value}, chat=False).request.prompt == "hi"


def test_every_unsupported_entry_accepts_leaving_it_null():
    for name, harmless in UNSUPPORTED.items():
        assert harmless(None), name


def test_vllm_top_level_extras_map_to_the_extension_fields():
    req = schema.parse_request(
        {**PROMPT, "top_k": 5, "min_tokens": 2, "ignore_eos": True, "repetition_penalty": 1.1}, chat=False
    ).request
    assert req.sampling.top_k == 5 and req.min_tokens == 2 and req.ignore_eos
    assert req.sampling.repetition_penalty == pytest.approx(1.1)
    same = schema.parse_request({**PROMPT, "top_k": 5, "specdec": {"top_k": 5}}, chat=False).request
    assert same.sampling.top_k == 5
    # vLLM's "-1 = off" is our 0, at the top level and in the extension alike
    assert schema.parse_request({**PROMPT, "top_k": -1}, chat=False).request.sampling.top_k == 0
    assert schema.parse_request({**PROMPT, "specdec": {"top_k": -1}}, chat=False).request.sampling.top_k == 0


@pytest.mark.parametrize(
    "name, top, ext",
    [("top_k", 5, 6), ("min_tokens", 1, 2), ("ignore_eos", True, False), ("repetition_penalty", 1.1, 1.2)],
)
def test_conflicting_duplicates_are_400(name, top, ext):
    err = refused({**PROMPT, name: top, "specdec": {name: ext}})
    assert err.param == name and "differ" in err.message


@pytest.mark.parametrize(
    "name, value", [("top_k", "5"), ("min_tokens", 1.5), ("ignore_eos", 1), ("repetition_penalty", "x")]
)
def test_vllm_extras_are_type_checked_like_the_extension(name, value):
    assert refused({**PROMPT, name: value}).param == name
    assert refused({**PROMPT, "specdec": {name: value}}).param == f"specdec.{name}"


def test_assign_reads_the_range_from_the_descriptor():
    req = pb.GenerateRequest()
    assign(req, "max_new_tokens", 2**31 - 1, "x")
    assign(req, "resume_offset", 2**32 - 1, "x")
    assign(req.sampling, "seed", 2**64 - 1, "x")
    for name, value in (("max_new_tokens", 2**31), ("resume_offset", 2**32), ("resume_offset", -1)):
        with pytest.raises(BadField):
            assign(req, name, value, name)
    with pytest.raises(BadField):
        assign(req.sampling, "seed", 2**64, "seed")
    with pytest.raises(BadField):
        assign(req.sampling, "temperature", float("nan"), "temperature")


def test_grpc_markers_become_the_openai_error_code():
    reused = errors.from_grpc(grpc.StatusCode.ALREADY_EXISTS, f"{IDEMPOTENCY_KEY_REUSED}: request_id 'r' ...")
    assert (reused.status, reused.code) == (409, "idempotency_key_reused")
    running = errors.from_grpc(grpc.StatusCode.ABORTED, f"{REQUEST_IN_PROGRESS}: request_id 'r' ...")
    assert (running.status, running.code) == (409, "request_in_progress")
    other = errors.from_grpc(grpc.StatusCode.ALREADY_EXISTS, "session 's' already exists")
    assert (other.status, other.code) == (409, "already_exists")
