"""RoundStreams when a write races the replica's end of an idle stream (gRPC fails the send with INTERNAL)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from orchestrator.streams import RoundStreams, rpc_error


class FakeStream:
    """A stream-stream call: `write` fails with `fail` (if any), else `read` answers the request back."""

    def __init__(self, fail: grpc.aio.AioRpcError | None = None) -> None:
        self.fail, self.request, self.cancelled = fail, None, False

    async def write(self, request: object) -> None:
        if self.fail is not None:
            raise self.fail
        self.request = request

    async def read(self) -> object:
        return ("answer", self.request)

    def done(self) -> bool:
        return self.cancelled

    def cancel(self) -> bool:
        self.cancelled = True
        return True


class FakeStub:
    def __init__(self, streams: list[FakeStream]) -> None:
        self.streams = streams

    def VerifyStream(self, metadata: tuple) -> FakeStream:  # noqa: N802 - the gRPC method's name
        return self.streams.pop(0)


class Request:
    timeout_ms = 0


def test_a_send_that_races_the_end_of_an_idle_stream_is_sent_again_on_a_new_stream():
    raced = FakeStream(rpc_error(grpc.StatusCode.INTERNAL, "Internal error from Core"))
    fresh = FakeStream()
    streams = RoundStreams(FakeStub([fresh]), lambda: (), idle_max=4)
    streams._idle["Verify"] = [raced]  # an idle stream the replica has just ended
    request = Request()
    assert asyncio.run(streams.call("Verify", request, 5.0)) == ("answer", request)
    assert raced.cancelled and fresh.request is request and streams.opened == 1


def test_other_write_failures_keep_their_status():
    denied = FakeStream(rpc_error(grpc.StatusCode.UNAUTHENTICATED, "bad token"))
    streams = RoundStreams(FakeStub([denied]), lambda: (), idle_max=4)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        asyncio.run(streams.call("Verify", Request(), 5.0))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_new_stream_that_fails_its_first_send_is_unavailable_not_internal():
    streams = RoundStreams(
        FakeStub([FakeStream(rpc_error(grpc.StatusCode.INTERNAL, "Internal error from Core"))]), lambda: (), idle_max=4
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        asyncio.run(streams.call("Verify", Request(), 5.0))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
