"""One generation: session in Redis, speculative rounds, detokenizing, stop handling, stats.

`Generation.chunks()` is the single implementation behind both Generate
(unary: the chunks are gathered) and GenerateStream. Per round:
  1. choose k for the round (clipped to the tokens and context left),
  2. run the round (draft proposes, target verifies in one pass),
  3. cut at EOS / max_new_tokens,
  4. detokenize incrementally and hold back text that may start a stop string,
  5. store the kept tokens in Redis (version-checked, under this instance's lease),
  6. stream the text delta (and the round, with trace).
Rounds are pipelined: round r+1 starts (1-2) as soon as round r's tokens are cut (3)
and runs while round r's tokens are detokenized (4), stored (5) and streamed (6); a chunk
never leaves before its tokens are in Redis. A stop string found in (4) cancels round r+1.

Reliability (docs/reliability.md): the session's lease is held and renewed while the request generates, and
every write is checked against it and the session's version (orchestrator/lease.py); a retry of a request whose
instance died waits for that lease to lapse and resumes from Redis (orchestrator/request_begin.py); a failed
dependency releases the lease at once so the retry resumes; a cancel ends the request as "cancelled"; the client's
deadline caps every call (orchestrator/rounds.py). ignore_eos runs to max_new_tokens and min_tokens holds EOS back
for that many tokens: neither changes which tokens the target picks, only where the generation is cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator

from orchestrator.adaptive import AcceptanceTracker, choose_k
from orchestrator.completion_text import CompletionText
from orchestrator.delta import ContextWire
from orchestrator.deps import Deps
from orchestrator.features import HiddenRelay
from orchestrator.idempotency import check_id, request_fingerprint
from orchestrator.lease import SessionLease, store_errors
from orchestrator.request_begin import RequestIds, State, begin
from orchestrator.rounds import RoundOutcome, RoundRequest, cancel_round
from orchestrator.stats import Emitted, StatsCollector
from orchestrator.stops import cut_at_limits, tokens_before_stop
from specdec.params import MODEL, GenerationParams, field_or_default, resolve_generation
from specdec.proto_json import finish_detail
from specdec.v1 import orchestrator_pb2 as pb

log = logging.getLogger("specdec.orchestrator")


class Generation:
    """One Generate/GenerateStream call."""

    def __init__(self, deps: Deps, request: pb.GenerateRequest, deadline: float | None = None, keyed: str = "") -> None:
        self.deps = deps
        self.request = request
        self.deadline = deadline  # time.monotonic() of the client's deadline (None = none)
        self.params: GenerationParams = resolve_generation(request, deps.cfg.limits)
        for name in ("session_id", "request_id"):
            if request.HasField(name):
                check_id(name, getattr(request, name), deps.cfg.limits.max_id_chars)
        self.session_id = keyed or (request.session_id if request.HasField("session_id") else uuid.uuid4().hex)
        self.route = ""  # replicas' routing key, set by the servicer ("" = the session id)
        self.lease = SessionLease(deps.store, self.session_id, deps.owner, deps.cfg.lease)
        self.request_id = request.request_id if request.HasField("request_id") else uuid.uuid4().hex
        self.fingerprint = request_fingerprint(request, self.params)  # orchestrator/idempotency.py
        self.stats = StatsCollector()
        self.acceptance: dict[str, AcceptanceTracker] = {}  # per proposer (orchestrator/adaptive.py)
        self.relay = HiddenRelay()  # the target's hidden states on their way to a feature draft
        self.wire = ContextWire()  # what each replica holds of the context (delta rounds)
        self.state: State | None = None
        self.advanced = 0  # rounds cut and appended by _advance (the stats count them a step later)
        self.pass_ms = 0.0  # the target's last pass of a round without a draft (_steps' time cap)

    def _begin_ids(self) -> RequestIds:
        return RequestIds(self.session_id, self.request_id, self.fingerprint, self.deadline)

    async def chunks(self) -> AsyncIterator[pb.GenerateChunk]:
        """The generation as a stream of chunks; the last one carries finish reason, usage, stats."""
        with store_errors():
            state, self.params = await begin(self.deps, self.request, self.params, self._begin_ids())
            self.state = state
            text = self._text_pipeline(state)
            catch_up = self._catch_up(state, text)
            if catch_up is not None:
                yield catch_up
            if state.finish != pb.FINISH_REASON_UNSPECIFIED:  # a retry of a request that already finished
                yield self._final_chunk(state)
                return
            try:
                async with self.lease.renewing(), contextlib.aclosing(self._rounds(state, text)) as rounds:
                    async for chunk in rounds:
                        yield chunk
                await self._finish(state)
            except (asyncio.CancelledError, GeneratorExit):
                state.finish = pb.FINISH_REASON_CANCELLED
                await asyncio.shield(self._finish_quietly(state))
                raise
            except Exception:  # noqa: BLE001 - re-raised below, after the lease is handled
                await self.lease.release_after_failure()
                raise
        yield self._final_chunk(state)

    # -- text ------------------------------------------------------------------------------

    def _text_pipeline(self, state: State) -> CompletionText:
        return CompletionText(self.deps.prompter.tokenizer, state.ids[: state.prompt_len], self.params.stop)

    def _catch_up(self, state: State, text: CompletionText) -> pb.GenerateChunk | None:
        """A resumed request: replay stored completion tokens the client does not hold yet, with the text the
        live stream gave them (a finished request's text released at its end as well: CompletionText.replay)."""
        if not state.completion:
            return None
        offset = min(int(field_or_default(self.request, "resume_offset")), len(state.completion))
        ended = state.finish not in (pb.FINISH_REASON_UNSPECIFIED, pb.FINISH_REASON_STOP)
        chars = state.session.last_text_chars if state.finish != pb.FINISH_REASON_UNSPECIFIED else -1
        held, emitted = text.replay(state.completion, offset, ended, chars)
        state.text = held + emitted
        return pb.GenerateChunk(
            text_delta=emitted,
            token_ids=state.completion[offset:],
            offset=offset,
            session_id=self.session_id,
            request_id=self.request_id,
        )

    # -- rounds ----------------------------------------------------------------------------

    def _round_k(self, state: State) -> tuple[int, str]:
        """(k, the draft expected to propose): k clipped to the tokens and context left; with adaptive k chosen from the
        proposer's acceptance and costs, and 0 for a model in the prompt's round (adaptive.py)."""
        left_tokens, left_context = (
            self.params.max_new_tokens - len(state.completion),
            self.deps.max_context - len(state.ids),
        )
        cap = max(0, min(self.params.k, left_tokens - 1, left_context - 1))
        if cap == 0:
            return 0, ""
        proposer = self.deps.runner.proposer(self.params.draft_kind, state.ids, self.wire)
        if not self.params.adaptive_k:
            return cap, proposer
        if proposer == MODEL and not self.stats.rounds:
            return 0, proposer
        return choose_k(self.deps.costs, self._tracker(proposer), cap, proposer), proposer

    def _tracker(self, proposer: str) -> AcceptanceTracker:
        return self.acceptance.setdefault(proposer, AcceptanceTracker(k_max=max(self.params.k, 1)))

    def _learn(self, outcome: RoundOutcome, step: bool = False) -> None:
        """Feed adaptive k: acceptance per session and proposer; costs only from rounds without a prefill. A decode
        step of a round at k = 0 (`step`) counts as a round at k = 0 towards the next probe."""
        proposed = len(outcome.draft_ids)
        if step and self.params.adaptive_k:
            self._tracker(outcome.proposer).rounds_at_zero += 1
        self.deps.costs.observe_batch(outcome.cost.target_batch)
        if proposed:
            self._tracker(outcome.proposer).observe(proposed, outcome.num_accepted)
        if outcome.cost.target_computed <= proposed + 1 and not outcome.degraded:
            self.deps.costs.observe(
                proposed,
                outcome.cost.pass_tokens,
                outcome.cost.draft_ms,
                outcome.cost.target_ms,
                outcome.cost.fixed_overhead_ms,
                outcome.proposer,
            )

    async def _rounds(self, state: State, text: CompletionText) -> AsyncGenerator[pb.GenerateChunk, None]:
        """Steps 1-6 of the module docstring, call after call, until the generation finishes.

        Pipelined: as soon as a call's tokens are cut (3), the next call starts (1, 2) and runs on the
        draft and target while this call's tokens are detokenized (4), stored in Redis (5) and streamed
        (6): none of that is on the critical path. A chunk still leaves only after its tokens are
        stored; a failed store or a stop string cancels the call in flight. A call is one round, or
        several with decode steps (RoundRunner.run).
        """
        running: asyncio.Task | None = self._start_round(state)
        try:
            while running is not None:
                outcomes = await running
                start_len = len(state.completion)
                kept = self._advance(state, outcomes)  # 3
                running = None if state.finish else self._start_round(state)  # next 1, 2
                await asyncio.sleep(0)  # the next round sends its calls before the bookkeeping below
                rounds, delta = await self._settle(state, text, outcomes, start_len, kept)  # 4
                if state.finish and running is not None:  # a stop string: the round started is not needed
                    await cancel_round(running)
                    running = None
                tokens = state.completion[start_len:]
                if tokens:
                    await self._store(state, tokens, rounds)  # 5
                chunk = self._chunk(state, rounds, tokens, start_len, delta)  # 6
                if chunk is not None:
                    yield chunk
        finally:
            await cancel_round(running)

    def _start_round(self, state: State) -> asyncio.Task:
        """Steps 1-2 (draft proposes, target verifies) for the context so far, as a task."""
        self.lease.check()
        (k, proposer), p = self._round_k(state), self.params
        return asyncio.create_task(
            self.deps.runner.run(
                RoundRequest(
                    self.session_id,
                    self.request_id,
                    list(state.ids),
                    k,
                    p.sampling,
                    p.draft_kind,
                    p.logprobs,
                    self.deadline,
                    self.relay,
                    proposer,
                    self.wire,
                    route=self.route,
                    verdict_only=not (p.trace and self.deps.cfg.trace_rejected_rows),
                    steps=self._steps(state),
                    stop_ids=() if p.ignore_eos else tuple(self.deps.eos_ids),
                )
            )
        )

    def _steps(self, state: State) -> int:
        """The most decode steps a round may ask for (RoundRunner._steps decides whether it does): none for the first
        token; else up to the setting, the steps the last pass says fit in decode_steps_ms, the tokens and context
        left and the rounds left (params.max_rounds)."""
        if not state.completion:
            return 1
        cap = self.deps.cfg.decode_steps
        if self.deps.cfg.decode_steps_ms > 0 and self.pass_ms > 0:
            cap = max(1, min(cap, int(self.deps.cfg.decode_steps_ms // self.pass_ms)))
        left = min(
            cap,
            self.params.max_new_tokens - len(state.completion),
            self.deps.max_context - len(state.ids),
        )
        if self.params.max_rounds:
            left = min(left, self.params.max_rounds - self.advanced)
        return max(1, left)

    def _advance(self, state: State, outcomes: list[RoundOutcome]) -> list[list[int]]:
        """Step 3: cut the call's tokens round by round (EOS, max_new_tokens, the context end, max_rounds) and grow
        the context, so the next call can start; adaptive k learns from each round. Returns each round's tokens
        (_settle may still cut them); rounds after the finish keep none."""
        kept: list[list[int]] = []
        for outcome in outcomes:
            if state.finish:
                kept.append([])
                continue
            tokens, finish = cut_at_limits(
                outcome.emitted,
                len(state.completion),
                len(state.ids),
                self.params,
                self.deps.eos_ids,
                self.deps.max_context,
            )
            state.finish = finish or state.finish
            if not outcome.draft_ids and outcome.cost.target_ms > 0:  # the first (with the prefill): an upper bound
                self.pass_ms = outcome.cost.target_ms  # what a decode step costs now (_steps)
            state.completion += tokens
            state.ids += tokens
            kept.append(tokens)
            self._learn(outcome, step=len(kept) > 1 and outcomes[0].k == 0)
            self.advanced += 1
            if self.params.max_rounds and self.advanced >= self.params.max_rounds and not state.finish:
                state.finish = pb.FINISH_REASON_LENGTH
        return kept

    async def _settle(
        self, state: State, text: CompletionText, outcomes: list[RoundOutcome], start_len: int, kept: list[list[int]]
    ) -> tuple[list[tuple[RoundOutcome, Emitted]], str]:
        """Step 4, while the next call runs: detokenize, handle a stop string (it ends the generation
        and cuts the tokens, also from the context); count the rounds.

        start_len: completion tokens before this call; kept: what _advance added per round. Returns (the rounds
        counted with what each emitted: the first, and each later one that kept a token; text to stream). Redis
        gets the tokens in step 5.
        """
        tokens = [t for part in kept for t in part]
        delta = text.push(tokens, last=state.finish != pb.FINISH_REASON_UNSPECIFIED)  # last: held text released
        if delta.stopped:
            state.finish = pb.FINISH_REASON_STOP
            keep = tokens_before_stop(self.deps.prompter.tokenizer, state.completion, len(state.text + delta.emit))
            await self._store_cut(state, keep, start_len)
            state.completion = state.completion[:keep]
            del state.ids[state.prompt_len + len(state.completion) :]
        state.text += delta.emit
        left = max(0, len(state.completion) - start_len)
        rounds = []
        for i, (outcome, part) in enumerate(zip(outcomes, kept)):
            n = min(len(part), left)
            left -= n
            if i and not n:
                break
            counted = self.stats.add_round(outcome, n)  # only what was emitted counts
            rounds.append((outcome, counted))
            self.deps.metrics.observe_round(
                outcome.draft_ids[: counted.drafted],
                counted.accepted,
                n,
                outcome.cost.draft_ms,
                outcome.cost.target_ms,
                outcome.cost.overhead_ms,
                outcome.cost.wall_ms,
                outcome.degraded,
            )
            self.deps.metrics.observe_load(outcome.k, outcome.cost.target_batch, self.params.adaptive_k)
        return rounds, delta.emit

    async def _store(self, state: State, tokens: list[int], rounds: list[tuple[RoundOutcome, Emitted]]) -> None:
        counters = {
            "rounds": len(rounds),
            "drafted": sum(e.drafted for _, e in rounds),
            "accepted": sum(e.accepted for _, e in rounds),
            "delivered": len(tokens),
        }
        written = await self.deps.store.append(self.session_id, state.version, tokens, counters, self.deps.owner)
        state.version = written.version
        for outcome, e in rounds:
            state.logprobs += outcome.logprobs[: e.tokens]

    async def _store_cut(self, state: State, keep: int, start_len: int) -> None:
        """A stop string ended inside tokens stored by earlier rounds: drop them from the session."""
        if keep < start_len:
            written = await self.deps.store.truncate(
                self.session_id, state.version, state.prompt_len + keep, self.deps.owner
            )
            state.version = written.version

    def _chunk(
        self, state: State, rounds: list[tuple[RoundOutcome, Emitted]], tokens: list[int], offset: int, text: str
    ) -> pb.GenerateChunk | None:
        rows = []
        if self.params.trace:
            # the tokens each round appended (after EOS/length/stop cuts), special tokens shown
            at = 0
            for index, (outcome, e) in enumerate(rounds, self.stats.rounds - len(rounds)):
                text_of_round = self.deps.prompter.tokenizer.decode(tokens[at : at + e.tokens])
                rows.append(self.stats.round_proto(outcome, e, text_of_round, index))
                at += e.tokens
            state.trace += rows
        if not tokens and not text and not rows:
            return None
        return pb.GenerateChunk(text_delta=text, token_ids=tokens, offset=offset, rounds=rows)

    # -- end -------------------------------------------------------------------------------

    async def _finish(self, state: State) -> None:
        state.session = await self.deps.store.finish_request(
            self.session_id, self.deps.owner, finish_detail(state.finish), state.version, text_chars=len(state.text)
        )
        state.version = state.session.version
        self.deps.metrics.observe_generation(finish_detail(state.finish), self.stats.first_token_ms)

    async def _finish_quietly(self, state: State) -> None:
        with contextlib.suppress(Exception):
            await self._finish(state)

    def _begun(self) -> State:
        assert self.state is not None, "the request has begun (chunks() ran)"
        return self.state

    def usage(self) -> pb.Usage:
        """prompt_tokens counts the whole context before the completion (earlier turns included);
        cached_prompt_tokens says how many of them were not computed for this request: what the session
        already held, or what the target's KV cache served at the first round (prefix sharing), the more."""
        state = self._begun()
        n = len(state.completion)
        cached = max(state.session.request_base_len, min(self.stats.first_target_cached, state.prompt_len))
        return pb.Usage(
            prompt_tokens=state.prompt_len,
            completion_tokens=n,
            total_tokens=state.prompt_len + n,
            cached_prompt_tokens=cached,
        )

    def _final_chunk(self, state: State) -> pb.GenerateChunk:
        chunk = pb.GenerateChunk(
            offset=len(state.completion),
            usage=self.usage(),
            stats=self.stats.proto(),
            session_id=self.session_id,
            request_id=self.request_id,
        )
        chunk.finish_reason = state.finish
        return chunk

    def response(self) -> pb.GenerateResponse:
        """The whole result, after chunks() ran to the end."""
        s = self._begun()
        return pb.GenerateResponse(
            session_id=self.session_id,
            request_id=self.request_id,
            text=s.text,
            token_ids=s.completion,
            finish_reason=s.finish,
            usage=self.usage(),
            stats=self.stats.proto(),
            trace=s.trace,
            logprobs=s.logprobs,
            model=self.deps.model_name,
        )
