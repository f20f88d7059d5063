"""Target gRPC servicer: proto -> VerifyInput -> engine -> proto. Nothing else."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
from collections.abc import Sequence
from typing import Any

import grpc

from specdec.core.accept import BONUS
from specdec.core.ngram import NgramIndex
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
        returns the awaitable that queues it and answers (BatchQueue.submit), as does a call of several decode
        steps. `deadline_s`: how long the caller still waits (None: no deadline)."""
        arrived = time.perf_counter()
        inp = self._input(request)
        if request.steps > 1:
            return self._stepped(request, inp, deadline_s, arrived)
        out = self.batches().run_now(request.session_id, inp)
        if out is None:
            return self._queued(inp, deadline_s, arrived)
        # the next delta continues from this context and the tokens emitted: held, it needs no copy or hashing
        self.context_store().hold_next(inp.session_id, len(inp.context_ids), out.result.emitted(inp.draft_ids))
        return verify_response(out, 0.0, arrived)

    def _input(self, request: target_pb2.VerifyRequest) -> VerifyInput:
        """proto -> VerifyInput, the context resolved from the delta form (a bad step request is refused here)."""
        if request.steps > 1 and (request.draft_ids or request.return_hidden_states):
            raise InvalidArgument("steps > 1 decodes without a draft: not with draft_ids or return_hidden_states")
        context, position_base, hashes = resolve_context(self.context_store(), request)
        hashes.extend(request.draft_ids)  # VerifyInput.prefix_hashes covers context + draft
        return VerifyInput(
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

    async def _queued(self, inp: VerifyInput, deadline_s: float | None, arrived: float) -> target_pb2.VerifyResponse:
        out, queue_ms = await self.batches().submit(inp.session_id, inp, deadline_s)
        return verify_response(out, queue_ms, arrived)

    async def _stepped(
        self, request: target_pb2.VerifyRequest, inp: VerifyInput, deadline_s: float | None, arrived: float
    ) -> target_pb2.VerifyResponse:
        """Decode steps (VerifyRequest.steps): a k = 0 round per token, each through the batch queue as any round
        (a lone session's inline, others batched with the sessions they meet), until `steps` tokens, a stop id, or
        the context's tail repeats (stop_on_repeat). Between steps the event loop turns, so calls of other sessions
        arriving meanwhile join the next pass."""
        batches, first_context = self.batches(), len(inp.context_ids)
        stop = StepStop(request.stop_ids, request.stop_on_repeat)
        outs: list[VerifyOutput] = []
        queue_ms = 0.0
        while True:
            out = batches.run_now(inp.session_id, inp)
            if out is None:
                left = None if deadline_s is None else deadline_s - (time.perf_counter() - arrived)
                out, waited = await batches.submit(inp.session_id, inp, left)
                queue_ms += waited
            outs.append(out)
            inp = next_step(inp, out.result.next_token)
            if len(outs) >= request.steps or stop.after(inp.context_ids):
                break
            await asyncio.sleep(0)  # calls that arrived meanwhile queue, and the next step batches with them
        self.context_store().hold_next(inp.session_id, first_context, inp.context_ids[first_context:])
        return verify_response(outs[0], queue_ms, arrived, outs[1:])


class StepStop:
    """When decode steps end before their number: after a stop id (EOS), or, with `repeat` = n > 0, once the
    context's last n tokens occurred earlier in it (where a prompt-lookup draft of n-grams from n on proposes)."""

    def __init__(self, stop_ids: Sequence[int], repeat: int) -> None:
        self.stop_ids = frozenset(stop_ids)
        self.index = NgramIndex(repeat, repeat) if repeat > 0 else None

    def after(self, context: Sequence[int]) -> bool:
        """Whether stepping ends at `context` (its last token: the one just decoded); contexts grow call by call."""
        if context[-1] in self.stop_ids:
            return True
        return self.index is not None and bool(self.index.propose(context, 1))


def next_step(inp: VerifyInput, token: int) -> VerifyInput:
    """The k = 0 round after `inp` emitted `token` (no draft): its context grown by the token, hashes kept in step."""
    hashes = inp.prefix_hashes
    if hashes is not None:
        hashes.extend([token])  # the call's own copy (resolve_context); the engine copies what it keeps
    return dataclasses.replace(
        inp, context_ids=[*inp.context_ids, token], checked_ids=len(inp.context_ids) + 1, prefilled=None, _ids=None
    )


def verify_response(
    out: VerifyOutput, queue_ms: float, arrived: float, steps: Sequence[VerifyOutput] = ()
) -> target_pb2.VerifyResponse:
    """engine -> proto; `arrived`: when the call reached the service (ComputeStats.service_ms counts from it);
    `steps`: the decode steps after the first (VerifyRequest.steps)."""
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
    for step in steps:
        added = response.steps.add(token=step.result.next_token)
        if step.logprobs:
            added.logprob.CopyFrom(logprobs_to_proto(step.logprobs)[0])
        fill_stats(added.stats, step.stats)
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
