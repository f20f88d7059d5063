"""The service side of round streams: many Propose/Verify calls on one bidirectional stream.

A round stream (Draft.ProposeStream, Target.VerifyStream; docs/protocol.md "Round streams") carries
one call at a time: the service reads a request, answers it exactly as the unary method would, then
reads the next. What the unary call pays per round and the stream does not: a new HTTP/2 stream,
its headers and trailers, the interceptors' per-call setup, and a wake-up of the service's event loop
for each of them (measured in docs/performance.md, "Where the per-round overhead goes").

  * A call's error ends the stream with that call's status and trailing metadata (ErrorMappingInterceptor
    maps it as for the unary call, so a context miss reads the same); the caller opens a new stream.
  * Draining (SIGTERM): the call being answered is finished, then the stream ends with OK, and an idle
    stream ends at once, so a drain never waits out its grace period for streams that carry nothing.
    The caller sees the end of the stream before a response and retries the call elsewhere (the
    request was never read, so no token is lost or doubled).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

MS_PER_S = 1000.0


def call_timeout_s(request: Any, context: Any) -> float | None:
    """How long the caller still waits for this call, in seconds (None: no deadline): the gRPC deadline
    of a unary call; on a round stream, the request's own timeout_ms (the stream's deadline, if any,
    covers the whole stream). The smaller of the two when both are set."""
    remaining = context.time_remaining()
    if request.HasField("timeout_ms"):
        own = request.timeout_ms / MS_PER_S
        remaining = own if remaining is None else min(remaining, own)
    return remaining


async def serve_round_stream(
    requests: AsyncIterator[Any], handle: Callable[[Any], Awaitable[Any]], draining: asyncio.Event
) -> AsyncIterator[Any]:
    """Answer each request of the stream with `handle(request)`, in order, until the caller ends the
    stream or the service drains (see the module docstring)."""
    iterator = requests.__aiter__()
    drained = asyncio.ensure_future(draining.wait())
    read: asyncio.Future | None = None
    try:
        while not draining.is_set():
            read = asyncio.ensure_future(iterator.__anext__())
            await asyncio.wait((read, drained), return_when=asyncio.FIRST_COMPLETED)
            if not read.done():  # draining while idle: end the stream (OK) without reading on
                read.cancel()
                return
            try:
                request = read.result()
            except StopAsyncIteration:  # the caller closed its side
                return
            yield await handle(request)
    finally:
        drained.cancel()
        if read is not None:
            discard(read)


def discard(task: asyncio.Future) -> None:
    """Cancel a read still pending (the stream was cancelled while idle), or retrieve the outcome of one
    that ended unread, so that asyncio never reports it as "never retrieved"."""
    if not task.done():
        task.cancel()
    elif not task.cancelled():
        task.exception()
