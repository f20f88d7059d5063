"""Micro-benchmark behind round streams and the round lane: one grpc.aio unary call per request vs one
long-lived bidirectional stream vs length-prefixed frames on a plain asyncio TCP connection (the round
lane's transport, no gRPC), between two processes on loopback, the server spending `work_ms` of CPU per
request (a forward's stand-in, so the client's side sleeps as it does during a round). Prints, per way,
the p50 / p10 / p90 of (call time - work_ms): the hop's cost. Requests alternate between the ways.

    PYTHONPATH=$PWD .venv/bin/python scripts/grpc_hop_bench.py 25 200      # work_ms, requests per way
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time

import grpc

from specdec.redis_server import free_port


# channel and server arguments to try, e.g. HOP_OPTIONS='grpc.http2.bdp_probe=0,grpc.optimization_target=latency'
OPTIONS = [(k, int(v) if v.isdigit() else v) for k, v in
           (kv.split("=", 1) for kv in os.environ.get("HOP_OPTIONS", "").split(",") if kv)]


def ident(b: bytes) -> bytes:
    return b


def spin(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


async def serve(port: int, work_ms: float) -> None:
    async def unary(req, ctx):
        spin(work_ms)
        return req

    async def bidi(requests, ctx):
        async for req in requests:
            spin(work_ms)
            yield req
    handler = grpc.method_handlers_generic_handler("hop.S", {
        "U": grpc.unary_unary_rpc_method_handler(unary, ident, ident),
        "B": grpc.stream_stream_rpc_method_handler(bidi, ident, ident)})
    server = grpc.aio.server(options=OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()

    async def raw(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                size = int.from_bytes(await reader.readexactly(4), "little")
                req = await reader.readexactly(size)
            except asyncio.IncompleteReadError:
                return
            spin(work_ms)
            writer.write(len(req).to_bytes(4, "little") + req)
    lane = await asyncio.start_server(raw, "127.0.0.1", port + 1)
    async with lane:
        await server.wait_for_termination()


async def client(port: int, work_ms: float, n: int) -> None:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=OPTIONS)
    unary = channel.unary_unary("/hop.S/U", ident, ident)
    stream = channel.stream_stream("/hop.S/B", ident, ident)(timeout=3600)
    payload = b"x" * 300                                     # about a delta round's Verify
    for _ in range(20):
        await unary(payload, timeout=5)
    reader, writer = await asyncio.open_connection("127.0.0.1", port + 1)
    times: dict[str, list[float]] = {"unary": [], "stream": [], "raw": []}
    for _ in range(n):
        for way in times:
            start = time.perf_counter()
            if way == "unary":
                await unary(payload, timeout=5)
            elif way == "stream":
                await stream.write(payload)
                await stream.read()
            else:
                writer.write(len(payload).to_bytes(4, "little") + payload)
                await reader.readexactly(int.from_bytes(await reader.readexactly(4), "little"))
            times[way].append((time.perf_counter() - start) * 1000 - work_ms)
    await stream.done_writing()
    print(f"load average {os.getloadavg()}, options {OPTIONS}")
    for way, v in times.items():
        v.sort()
        print(f"work {work_ms} ms, {way:6s}: hop p50 {statistics.median(v):.3f} ms  p10 {v[len(v) // 10]:.3f}  "
              f"p90 {v[9 * len(v) // 10]:.3f}")
    await channel.close()
    writer.close()


def main() -> None:
    if sys.argv[1] == "serve":
        asyncio.run(serve(int(sys.argv[2]), float(sys.argv[3])))
        return
    work, n, port = float(sys.argv[1]), int(sys.argv[2]), free_port()   # the raw lane listens on port + 1
    server = subprocess.Popen([sys.executable, __file__, "serve", str(port), str(work)])
    try:
        time.sleep(1.5)
        asyncio.run(client(port, work, n))
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
