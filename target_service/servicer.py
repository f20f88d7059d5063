"""Target gRPC servicer: proto -> VerifyInput -> engine -> proto. Nothing else."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any

import grpc

from specdec.core.accept import BONUS, AcceptResult
from specdec.engine.batch_queue import BatchQueue
from specdec.engine.types import VerifyInput, VerifyOutput
from specdec.errors import InvalidArgument
from specdec.protocol import (
    fill_stats,
    hidden_to_proto,
    logprobs_to_proto,
    ms_since,
    resolve_context,
    sampling_from_proto,
    sparse_from_proto,
)
from specdec.server.model_service import ModelServiceBase
from specdec.v1 import target_pb2, target_pb2_grpc

SERVICE_NAME = target_pb2.DESCRIPTOR.services_by_name["Target"].full_name


class TargetServicer(ModelServiceBase, target_pb2_grpc.TargetServicer):
    """Implements specdec.v1.Target."""

    def __init__(self) -> None:
        super().__init__("target")
        self._batches: BatchQueue | None = None

    def batches(self) -> BatchQueue:
        """Concurrent Verify calls of distinct sessions go to the engine as one batch."""
        if self._batches is None:
            bundle = self.loaded()
            engine = bundle.engines["target"]
            self._batches = BatchQueue(
                self.worker,
                engine.verify_batch,
                bundle.info.get("max_batch", 1),
                bundle.batch_wait_s,
                engine.work_tokens,
                bundle.inline_max_tokens,
                engine.prefill_chunk,
                bundle.prefill_chunk_tokens,
                bundle.prefill_turn_ms,
                batch_turn=engine.verify_batch_with_turn,
                inline_tokens=engine.inline_tokens,
            )
        return self._batches

    async def Verify(self, request: target_pb2.VerifyRequest, context: grpc.aio.ServicerContext) -> Any:
        answer = self.verify_now(request, context.time_remaining())
        return await answer if inspect.isawaitable(answer) else answer

    def verify_now(self, request: target_pb2.VerifyRequest, deadline_s: float | None) -> Any:
        """Verify, answered at once where it can be: a lone session's decode round runs right here
        (BatchQueue.run_now) and its response is returned, so such a round needs no task; any other call
        returns the awaitable that queues it and answers (BatchQueue.submit). `deadline_s`: how long the
        caller still waits (None: no deadline)."""
        arrived = time.perf_counter()
        batches = self.batches()
        context, position_base, hashes = resolve_context(self.context_store(), request)
        hashes.extend(request.draft_ids)  # VerifyInput.prefix_hashes covers context + draft
        inp = VerifyInput(
            session_id=request.session_id,
            context_ids=context,
            draft_ids=list(request.draft_ids),
            sampling=sampling_from_proto(request.sampling),
            draft_probs=sparse_from_proto(request.draft_probs),
            logprobs=request.logprobs if request.HasField("logprobs") else -1,
            position_base=position_base,
            checked_ids=len(context),
            prefix_hashes=hashes,
            hidden_from=hidden_from(request, position_base),
            verdict_only=request.verdict_only,
        )
        out = batches.run_now(request.session_id, inp)
        if out is None:
            return self._queued(inp, deadline_s, arrived)
        asyncio.get_running_loop().call_soon(self.prepare_next, inp, out.result)  # runs once the answer is sent
        return verify_response(out, 0.0, arrived)

    def prepare_next(self, inp: VerifyInput, result: AcceptResult) -> None:
        """After a lone session's round is answered, while the caller works on the answer: do the first steps
        of the session's next round, which continues from this round's context and the tokens it emitted. The
        context store holds that context (the next delta then finds its tokens held), and the KV cache drops the
        rejected draft positions. Both are soft state, as before: a next request that differs (a retry, a resent
        context) is served as any other. Done only while no other call is in flight or queued (the KV cache
        changes between forwards only); docs/performance.md, "Where the per-round overhead goes"."""
        self.context_store().hold_next(inp.session_id, len(inp.context_ids), result.emitted(inp.draft_ids))
        if self.batches().lone(inp.session_id):
            pool = self.loaded().pool
            if pool is not None:
                pool.roll_back(inp.session_id, len(inp.context_ids) + result.num_accepted)

    async def _queued(self, inp: VerifyInput, deadline_s: float | None, arrived: float) -> target_pb2.VerifyResponse:
        out, queue_ms = await self.batches().submit(inp.session_id, inp, deadline_s)
        return verify_response(out, queue_ms, arrived)


def verify_response(out: VerifyOutput, queue_ms: float, arrived: float) -> target_pb2.VerifyResponse:
    """engine -> proto; `arrived`: when the call reached the service (ComputeStats.service_ms counts from it)."""
    out.stats.queue_ms = queue_ms
    r = out.result
    kind = target_pb2.NEXT_KIND_BONUS if r.next_kind == BONUS else target_pb2.NEXT_KIND_RECOVERED
    response = target_pb2.VerifyResponse(
        num_accepted=r.num_accepted, next_token=r.next_token, next_kind=kind, target_ids=r.target_ids, matches=r.matches
    )
    if out.logprobs:
        response.logprobs.extend(logprobs_to_proto(out.logprobs))
    fill_stats(response.stats, out.stats)
    if out.hidden is not None:
        response.hidden.CopyFrom(hidden_to_proto(out.hidden))
    response.stats.service_ms = ms_since(arrived)
    return response


def hidden_from(request: target_pb2.VerifyRequest, position_base: int) -> int:
    """The context-relative position to return hidden states from (-1 = none asked); position_base: the
    absolute position of the resolved context's first token."""
    if not request.return_hidden_states:
        return -1
    local = request.hidden_from - position_base
    if local < 0:
        raise InvalidArgument(f"hidden_from={request.hidden_from} is before position_base={position_base}")
    return local


def add_to_server(servicer: TargetServicer, server: grpc.aio.Server) -> None:
    target_pb2_grpc.add_TargetServicer_to_server(servicer, server)
