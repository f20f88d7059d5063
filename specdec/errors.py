"""Errors that cross a service boundary, each bound to one gRPC status code.

Engines and stores raise these; the one error-mapping interceptor
(specdec.server.interceptors) turns them into the status and message the
client sees. Anything else that escapes a handler becomes INTERNAL with a
short message (the traceback goes to the log, never to the client).
"""

from __future__ import annotations

import grpc


class SpecDecError(Exception):
    """Base class: an error with a gRPC status code and a message a person understands."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        """Machine-readable detail sent with the status (none by default)."""
        return ()


class InvalidArgument(SpecDecError):
    """The request itself is wrong (bad values, out-of-range ids, empty prompt)."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(SpecDecError):
    """A named thing (session) does not exist."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(SpecDecError):
    """Asked to create something that exists."""

    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(SpecDecError):
    """The system is not in a state to serve this (e.g. incompatible draft/target pair)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


# Trailing-metadata key of a ContextMiss; its value is the reason (ContextMiss.REASONS).
CONTEXT_MISS_METADATA = "specdec-context-miss"


class ContextMiss(FailedPrecondition):
    """A delta-form Propose/Verify whose context prefix this replica does not hold (evicted, restarted,
    never seen, another context): FAILED_PRECONDITION with trailing metadata CONTEXT_MISS_METADATA =
    reason. The caller resends the whole context (docs/protocol.md, "Delta rounds")."""

    REASONS = ("unknown-session", "shorter", "hash-mismatch")

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return ((CONTEXT_MISS_METADATA, self.reason),)


class ResourceExhausted(SpecDecError):
    """Over a configured limit: admission cap, cache budget, message size."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(SpecDecError):
    """A dependency (replica, Redis) cannot be reached right now; retrying may help."""

    code = grpc.StatusCode.UNAVAILABLE


class Aborted(SpecDecError):
    """A concurrent writer won (session version conflict, lost lease)."""

    code = grpc.StatusCode.ABORTED


class DeadlineExceeded(SpecDecError):
    """The call's deadline passed before the work finished."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(SpecDecError):
    """The client went away."""

    code = grpc.StatusCode.CANCELLED


# Markers at the start of the details of two errors, so that the HTTP gateway can give them their own
# OpenAI error `code` (and clients can tell them apart from other ALREADY_EXISTS / ABORTED errors).
IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"  # ALREADY_EXISTS: a request_id reused for a different request
REQUEST_IN_PROGRESS = "request_in_progress"  # ABORTED: the same request is still running


class UnsupportedCacheError(RuntimeError):
    """The model's cache has layers that cannot be truncated exactly (refused at load)."""
