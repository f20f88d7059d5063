"""The one error shape of the HTTP API, whatever found the problem (docs/http.md, "Errors").

Every error is OpenAI's `{"error": {"message", "type", "param", "code"}}`, filled by one rule:

* `type` follows the HTTP status alone (ERROR_TYPES: 401, 403 and 429 have their own; any other
  4xx is `invalid_request_error`, any 5xx `server_error`), so the openai client's exception class
  and the `type` always agree;
* `code` is always a snake_case string: a specific code where one exists (`model_not_found`,
  `session_not_found`, `idempotency_key_reused`, `request_in_progress`, `invalid_api_key`), else
  the gRPC status the error is (or corresponds to) in lower case: the gateway's own validation
  errors are `invalid_argument` like the orchestrator's INVALID_ARGUMENT, a refused admission
  `resource_exhausted`; HTTP-level errors without a gRPC twin use their status phrase
  (`method_not_allowed`, `request_too_large`);
* `param` is the request field (path as the client wrote it: `messages[0].content`, `specdec.k`)
  when it is known, else null. Orchestrator errors about a field name the GenerateRequest field
  first; the gateway maps it back to the field the request set (`max_new_tokens` -> `max_tokens`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from http import HTTPStatus

import grpc

from http_gateway.protocol import ErrorDetail, ErrorResponse
from specdec.errors import IDEMPOTENCY_KEY_REUSED, REQUEST_IN_PROGRESS

CLIENT_ERROR = "invalid_request_error"
SERVER_ERROR = "server_error"
ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}
FIRST_SERVER_STATUS = 500

# gRPC status -> HTTP status (anything else: 500).
GRPC_HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.FAILED_PRECONDITION: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
INTERNAL_STATUS = 500
# The default code of an HTTP status: the gRPC status it corresponds to, else its HTTP phrase.
STATUS_CODES = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    413: "request_too_large",
    429: "resource_exhausted",
    500: "internal",
    503: "unavailable",
    504: "deadline_exceeded",
}
SPECIFIC_CODES = (IDEMPOTENCY_KEY_REUSED, REQUEST_IN_PROGRESS)  # markers the orchestrator puts in its details
SESSION_NOT_FOUND = "session_not_found"
INVALID_ARGUMENT = "invalid_argument"
_LEADING_NAME = re.compile(r"[a-z_]+")


def error_type(status: int) -> str:
    """OpenAI's error `type` of an HTTP status."""
    return ERROR_TYPES.get(status, SERVER_ERROR if status >= FIRST_SERVER_STATUS else CLIENT_ERROR)


def status_code(status: int) -> str:
    """The default `code` of an HTTP status."""
    if status in STATUS_CODES:
        return STATUS_CODES[status]
    try:
        return HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        return f"http_{status}"


class ApiError(Exception):
    """An error the gateway answers with: HTTP status + the OpenAI error object."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.type = error_type(status)
        self.code = code or status_code(status)

    def body(self) -> dict:
        detail = ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code)
        return ErrorResponse(error=detail).model_dump()


def api_error(status: int, message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(status, message, param, code)


def bad_request(message: str, param: str | None = None) -> ApiError:
    """A 400 `invalid_argument` (the gateway's own validation)."""
    return ApiError(400, message, param, INVALID_ARGUMENT)


def from_grpc(code: grpc.StatusCode | None, details: str, params: Mapping[str, str] | None = None) -> ApiError:
    """The HTTP error for a gRPC status from the orchestrator.

    params: GenerateRequest field name -> the request field that set it (Parsed.params); an
    INVALID_ARGUMENT whose message starts with one of those names gets that field as `param`.
    """
    details = details or (code.name if code is not None else "internal error")
    status = GRPC_HTTP_STATUS.get(code, INTERNAL_STATUS)
    err_code = code.name.lower() if code is not None else status_code(INTERNAL_STATUS)
    if code == grpc.StatusCode.NOT_FOUND and "session" in details:
        err_code = SESSION_NOT_FOUND
    for marker in SPECIFIC_CODES:
        if marker in details:
            err_code = marker
    param = None
    if code == grpc.StatusCode.INVALID_ARGUMENT and params:
        name = _LEADING_NAME.match(details)
        param = params.get(name.group(0)) if name else None
    return ApiError(status, details, param, err_code)
