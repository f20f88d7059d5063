"""Draft gRPC servicer: proto -> ProposeInput -> engine -> proto. Nothing else."""

from __future__ import annotations

import inspect
import time
from typing import Any

import grpc

from specdec.engine.types import ProposeInput, ProposeOutput
from specdec.engine.worker import fits_inline
from specdec.errors import FailedPrecondition
from specdec.protocol import (
    fill_stats,
    hidden_from_proto,
    ms_since,
    resolve_context,
    sampling_from_proto,
    sparse_to_proto,
)
from specdec.server.model_service import ModelServiceBase
from specdec.v1 import draft_pb2, draft_pb2_grpc

SERVICE_NAME = draft_pb2.DESCRIPTOR.services_by_name["Draft"].full_name


class DraftServicer(ModelServiceBase, draft_pb2_grpc.DraftServicer):
    """Implements specdec.v1.Draft."""

    def __init__(self) -> None:
        super().__init__("draft")

    async def Propose(self, request: draft_pb2.ProposeRequest, context: grpc.aio.ServicerContext) -> Any:
        answer = self.propose_now(request)
        return await answer if inspect.isawaitable(answer) else answer

    def propose_now(self, request: draft_pb2.ProposeRequest) -> Any:
        """Propose, answered at once where it can be: with no other call in flight and the model thread idle, a
        small proposal (a decode round's) runs right here (ModelWorker.call_now) and its response is returned;
        any other call returns the awaitable that runs it (prefill chunks, the session lock, the model thread)."""
        arrived = time.perf_counter()
        bundle = self.loaded()
        kind = request.draft_kind if request.HasField("draft_kind") and request.draft_kind else bundle.default_kind
        engine = bundle.engines.get(kind)
        if engine is None:
            raise FailedPrecondition(f"this draft service has no {kind!r} draft (it serves {sorted(bundle.engines)})")
        context, position_base, hashes = resolve_context(self.context_store(), request)
        inp = ProposeInput(
            session_id=request.session_id,
            context_ids=context,
            k=request.k,
            sampling=sampling_from_proto(request.sampling),
            draft_kind=kind,
            ngram_min_n=request.ngram.min_n if request.ngram.HasField("min_n") else None,
            ngram_max_n=request.ngram.max_n if request.ngram.HasField("max_n") else None,
            position_base=position_base,
            checked_ids=len(context),
            prefix_hashes=hashes,
        )
        if getattr(engine, "needs_target_hidden", False):
            inp.target_hidden = hidden_from_proto(request.target_hidden, engine.hidden_size)
        if self.worker.idle_now() and small_call(engine, inp, bundle.inline_max_tokens):
            return propose_response(self.worker.call_now(lambda: engine.propose(inp)), 0.0, arrived)
        return self._propose_queued(engine, inp, bundle, arrived)

    async def _propose_queued(self, engine: Any, inp: ProposeInput, bundle: Any, arrived: float) -> Any:
        queue_ms = await self._prefill_in_chunks(engine, inp, bundle.prefill_chunk_tokens)
        out, last_queue_ms = await self.worker.run(
            inp.session_id, lambda: engine.propose(inp), lambda: small_call(engine, inp, bundle.inline_max_tokens)
        )
        return propose_response(out, queue_ms + last_queue_ms, arrived)

    async def _prefill_in_chunks(self, engine: Any, inp: ProposeInput, chunk: int) -> float:
        """A proposal over a long new context (a prompt's first round) prefills it `chunk` tokens a call, each its
        own model call: other sessions' proposals run in between instead of waiting for the whole prefill, and
        with forwards on the event loop (SPECDEC_LOOP_FORWARDS) no pass holds the loop longer than a chunk.
        Returns the ms the chunks waited for the model (queue_ms)."""
        prefill = getattr(engine, "prefill_chunk", None)
        queue_ms = 0.0
        if prefill is None or chunk <= 0:
            return queue_ms
        left = engine.work_tokens(inp)  # the proposal's tokens: context still uncached + k steps
        while left - inp.k > chunk:
            left, waited = await self.worker.run(inp.session_id, lambda: prefill(inp, chunk))
            queue_ms += waited
        return queue_ms


def add_to_server(servicer: DraftServicer, server: grpc.aio.Server) -> None:
    draft_pb2_grpc.add_DraftServicer_to_server(servicer, server)


def propose_response(out: ProposeOutput, queue_ms: float, arrived: float) -> draft_pb2.ProposeResponse:
    """engine -> proto; `arrived`: when the call reached the service (ComputeStats.service_ms counts from it)."""
    out.stats.queue_ms = queue_ms
    response = draft_pb2.ProposeResponse(
        draft_ids=out.draft_ids,
        draft_probs=sparse_to_proto(out.draft_probs),
        draft_kind=out.draft_kind,
    )
    fill_stats(response.stats, out.stats)
    if out.target_hidden_from >= 0:
        response.target_hidden_from = out.target_hidden_from
    response.stats.service_ms = ms_since(arrived)
    return response


def small_call(engine: Any, inp: ProposeInput, limit: int) -> bool:
    """Whether this proposal is small enough to run on the event loop (ModelWorker.run_on_thread)."""
    work = getattr(engine, "inline_tokens", None)  # a feature draft's catch-up is not counted: model thread
    return fits_inline(work(inp) if work is not None and limit > 0 else None, limit)
