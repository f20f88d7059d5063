"""One error shape on every path of the HTTP gateway (http_gateway/errors.py): pure, no servers.

Every error is `{"error": {"message", "type", "param", "code"}}` with `code` a snake_case string,
`type` a function of the HTTP status alone and `param` the request field when it is known, whether the
gateway found the problem itself or the orchestrator answered with a gRPC status.
"""

from __future__ import annotations

import re

import grpc
import pytest

from http_gateway import errors
from http_gateway import openai_schema as schema
from specdec.errors import IDEMPOTENCY_KEY_REUSED

SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")
PROMPT = {"prompt": "hi"}


def shape(err: errors.ApiError) -> dict:
    body = err.body()
    assert list(body) == ["error"] and list(body["error"]) == ["message", "type", "param", "code"], body
    inner = body["error"]
    assert isinstance(inner["code"], str) and SNAKE.match(inner["code"]), inner
    assert inner["param"] is None or isinstance(inner["param"], str), inner
    assert inner["type"] == errors.error_type(err.status), inner
    return inner


def own(body: dict, chat: bool = False) -> dict:
    with pytest.raises(errors.ApiError) as err:
        schema.parse_request(body, chat=chat)
    return shape(err.value)


def test_gateway_validation_and_orchestrator_invalid_argument_look_the_same():
    mine = own({**PROMPT, "n": 0})
    parsed = schema.parse_request({**PROMPT, "max_tokens": 9999, "specdec": {"k": 99}}, chat=False)
    theirs = shape(
        errors.from_grpc(
            grpc.StatusCode.INVALID_ARGUMENT, "k must be in [0, 16] (0 = target-only), got 99", parsed.params
        )
    )
    assert (mine["type"], mine["code"], mine["param"]) == ("invalid_request_error", "invalid_argument", "n")
    assert (theirs["type"], theirs["code"], theirs["param"]) == (
        "invalid_request_error",
        "invalid_argument",
        "specdec.k",
    )
    limit = shape(
        errors.from_grpc(
            grpc.StatusCode.INVALID_ARGUMENT, "max_new_tokens must be in [1, 4096], got 9999", parsed.params
        )
    )
    assert limit["param"] == "max_tokens"
    unknown = shape(
        errors.from_grpc(grpc.StatusCode.INVALID_ARGUMENT, "the prompt tokenizes to nothing", parsed.params)
    )
    assert unknown["param"] is None and unknown["code"] == "invalid_argument"


@pytest.mark.parametrize(
    "body, chat, param",
    [
        ({**PROMPT, "max_tokens": 10**12}, False, "max_tokens"),
        ({**PROMPT, "specdec": {"kk": 1}}, False, "specdec.kk"),
        ({**PROMPT, "temperature": "hot"}, False, "temperature"),
        ({"messages": [{"role": "user", "content": 5}]}, True, "messages[0].content"),
        ({**PROMPT, "tools": [{"type": "function"}]}, False, "tools"),
        ({**PROMPT, "stop": ["\ud800"]}, False, "stop[0]"),
    ],
)
def test_every_gateway_validation_error_names_its_field_with_the_same_code(body, chat, param):
    err = own(body, chat)
    assert (err["param"], err["code"], err["type"]) == (param, "invalid_argument", "invalid_request_error")


@pytest.mark.parametrize(
    "code, status, err_code",
    [
        (grpc.StatusCode.NOT_FOUND, 404, "not_found"),
        (grpc.StatusCode.ALREADY_EXISTS, 409, "already_exists"),
        (grpc.StatusCode.ABORTED, 409, "aborted"),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 429, "resource_exhausted"),
        (grpc.StatusCode.UNAVAILABLE, 503, "unavailable"),
        (grpc.StatusCode.FAILED_PRECONDITION, 503, "failed_precondition"),
        (grpc.StatusCode.DEADLINE_EXCEEDED, 504, "deadline_exceeded"),
        (grpc.StatusCode.UNAUTHENTICATED, 401, "unauthenticated"),
        (grpc.StatusCode.INTERNAL, 500, "internal"),
    ],
)
def test_grpc_statuses_map_to_one_status_and_code(code, status, err_code):
    err = errors.from_grpc(code, "something")
    assert err.status == status and shape(err)["code"] == err_code


def test_specific_codes_win_and_the_type_follows_the_status_alone():
    reused = shape(errors.from_grpc(grpc.StatusCode.ALREADY_EXISTS, f"{IDEMPOTENCY_KEY_REUSED}: request_id 'r'"))
    assert reused["code"] == "idempotency_key_reused" and reused["type"] == "invalid_request_error"
    missing = shape(errors.from_grpc(grpc.StatusCode.NOT_FOUND, "session 's' does not exist"))
    model = shape(errors.api_error(404, "no such model", "model", "model_not_found"))
    assert (missing["code"], model["code"]) == ("session_not_found", "model_not_found")
    assert missing["type"] == model["type"] == "invalid_request_error"
    assert errors.error_type(401) == "authentication_error" and errors.error_type(429) == "rate_limit_error"
    assert errors.error_type(503) == errors.error_type(500) == "server_error"


@pytest.mark.parametrize(
    "status, code", [(404, "not_found"), (405, "method_not_allowed"), (413, "request_too_large"), (502, "bad_gateway")]
)
def test_http_level_errors_get_a_code_from_their_status(status, code):
    assert shape(errors.api_error(status, "x"))["code"] == code
