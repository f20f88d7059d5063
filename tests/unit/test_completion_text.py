"""A completion's text is the same streamed live and replayed (a retried or resumed request).

The real SmolLM2 tokenizer (byte-level BPE); the completion ends inside a multi-byte UTF-8 character,
which the live stream's last round releases as U+FFFD. Pure pieces (CompletionText), then the whole
Generation: a live run and its replays, against an in-memory session store and scripted rounds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import pytest

from orchestrator.completion_text import CompletionText
from orchestrator.deps import Deps
from orchestrator.detokenize import REPLACEMENT_CHAR
from orchestrator.generation import Generation
from orchestrator.prompting import Prompter
from orchestrator.rounds import RoundOutcome
from orchestrator.session_types import Session, Written
from specdec.config import OrchestratorConfig
from specdec.v1 import orchestrator_pb2 as pb
from tests.support import smollm2_tokenizer

PROMPT = "Write the end of the sentence."
COMPLETION = "Il fait beau, ce n'est pas vier"
LEAD_BYTE_TOKEN = "æ"  # byte-level BPE symbol of the lone byte 0xE6 (a 3-byte UTF-8 lead): ends mid-character
ROUNDS = (3, 4, 2, 5)  # tokens per live round, cycled


@pytest.fixture(scope="module")
def tok() -> Any:
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def prompt_ids(tok: Any) -> list[int]:
    return tok.encode(PROMPT, add_special_tokens=False)


@pytest.fixture(scope="module")
def completion(tok: Any) -> list[int]:
    ids = tok.encode(COMPLETION, add_special_tokens=False) + [tok.convert_tokens_to_ids(LEAD_BYTE_TOKEN)]
    assert tok.decode(ids).endswith("vier" + REPLACEMENT_CHAR)
    return ids


def _rounds(ids: Sequence[int]) -> list[list[int]]:
    out, i, r = [], 0, 0
    while i < len(ids):
        out.append(list(ids[i : i + ROUNDS[r % len(ROUNDS)]]))
        i, r = i + len(out[-1]), r + 1
    return out


def _live(tok: Any, prompt: list[int], ids: Sequence[int], stop: Sequence[str]) -> list[tuple[int, str]]:
    """(tokens so far, text so far) after each live round; the last round ends the generation."""
    text, rounds, held, done = CompletionText(tok, prompt, stop), _rounds(ids), "", 0
    out = []
    for n, chunk in enumerate(rounds):
        held += text.push(chunk, last=n == len(rounds) - 1).emit
        done += len(chunk)
        out.append((done, held))
    return out


# -- pure pieces ------------------------------------------------------------------------------------


@pytest.mark.parametrize("stop", [[], ["zz"], ["ier!", "xyz"]])  # the last: "ier" is held till the end
def test_replay_gives_the_live_text(tok, prompt_ids, completion, stop):
    live = _live(tok, prompt_ids, completion, stop)
    full = live[-1][1]
    assert full == tok.decode(completion) and full.endswith("vier" + REPLACEMENT_CHAR)
    for offset, held_live in [(0, "")] + live:
        held, rest = CompletionText(tok, prompt_ids, stop).replay(completion, offset, ended=True)
        assert held == held_live and held + rest == full, (offset, held, rest)


def test_replay_after_a_stop_string_gives_the_text_before_it(tok, prompt_ids, completion):
    """The live stream stopped at "pas": the stored ids end with the token where it began, nothing is released."""
    text, emitted = CompletionText(tok, prompt_ids, ["pas"]), ""
    for chunk in _rounds(completion):
        delta = text.push(chunk)
        emitted += delta.emit
        if delta.stopped:
            break
    assert emitted == "Il fait beau, ce n'est "
    kept = completion[: len(tok.encode("Il fait beau, ce n'est pas", add_special_tokens=False))]
    for offset in range(len(kept) + 1):
        held, rest = CompletionText(tok, prompt_ids, ["pas"]).replay(kept, offset, ended=False)
        assert held + rest == emitted


OVERLAP_TEXT = ("Hello x", "ca", "bz")  # pieces tokenized apart: the stop "ab" begins in the "ca" token
OVERLAP_STOPS = ["ab", "cad"]  # ... whose "ca" is also the beginning of "cad"


def _overlap_completion(tok: Any) -> list[int]:
    return [i for piece in OVERLAP_TEXT for i in tok.encode(piece, add_special_tokens=False)]


def test_replay_of_overlapping_stop_strings_is_cut_at_the_delivered_text(tok, prompt_ids):
    """Live, "ab" completes and "Hello xc" is delivered; the stored ids end with the "ca" token, where the
    matcher alone would hold "ca" (the beginning of "cad") and give "Hello x". The delivered length cuts it."""
    ids = _overlap_completion(tok)
    text, emitted = CompletionText(tok, prompt_ids, OVERLAP_STOPS), ""
    for i in range(len(ids)):
        delta = text.push(ids[i : i + 1])
        emitted += delta.emit
        if delta.stopped:
            break
    assert emitted == "Hello xc"
    kept = ids[: len(_overlap_completion(tok)) - len(tok.encode("bz", add_special_tokens=False))]
    unknown = CompletionText(tok, prompt_ids, OVERLAP_STOPS).replay(kept, len(kept), ended=False)
    assert "".join(unknown) == "Hello x"  # what the matcher alone gives: one character short
    for offset in range(len(kept) + 1):
        held, rest = CompletionText(tok, prompt_ids, OVERLAP_STOPS).replay(kept, offset, False, len(emitted))
        assert held + rest == emitted and emitted.startswith(held), (offset, held, rest)


# -- the whole Generation: live, then replays --------------------------------------------------------


class MemoryStore:
    """The few SessionStore calls a generation makes, in memory (one session; no leases to contend)."""

    def __init__(self) -> None:
        self.session: Session | None = None

    async def get(self, session_id: str) -> Session | None:
        return self.session

    async def begin_request(
        self,
        session_id: str,
        request_id: str,
        owner: str,
        lease_seconds: float,
        new_turn_ids: Sequence[int],
        params: dict,
        create_missing: bool = False,
        fingerprint: str = "",
    ) -> tuple[Session, bool]:
        s = self.session
        if s is not None and s.request_id == request_id:
            return s, True
        now = time.time()
        self.session = Session(
            session_id,
            list(new_turn_ids),
            len(new_turn_ids),
            1,
            dict(params),
            "generating",
            0,
            0,
            0,
            0,
            "",
            now,
            now,
            1,
            owner,
            now + lease_seconds,
            request_id,
            0,
            fingerprint,
        )
        return self.session, False

    async def append(self, session_id: str, version: int, ids: Sequence[int], counters: dict, owner: str) -> Written:
        self.session.ids += list(ids)
        return self._bump()

    async def truncate(self, session_id: str, version: int, length: int, owner: str) -> Written:
        del self.session.ids[length:]
        return self._bump()

    async def finish_request(
        self, session_id: str, owner: str, reason: str, version: int, text_chars: int = -1
    ) -> Session:
        self.session = dataclasses.replace(
            self.session, status="idle", last_finish_reason=reason, last_text_chars=text_chars
        )
        self._bump()
        return self.session

    async def renew_lease(self, session_id: str, owner: str, lease_seconds: float) -> float:
        return time.time() + lease_seconds

    def _bump(self) -> Written:
        self.session.version += 1
        return Written(self.session.version, len(self.session.ids), self.session.lease_until)


class ScriptedRunner:
    """Rounds that emit the completion's next ROUNDS tokens (no draft: k = 0)."""

    def __init__(self, prompt_len: int, completion: list[int]) -> None:
        self.prompt_len, self.completion = prompt_len, completion

    def target_replicas(self) -> int:
        return 1

    async def run(self, req: Any) -> list[RoundOutcome]:
        done = len(req.context_ids) - self.prompt_len
        sizes = [len(r) for r in _rounds(self.completion)]
        n = next(s for i, s in enumerate(sizes) if sum(sizes[:i]) == done)
        emitted = self.completion[done : done + n]
        outcome = RoundOutcome(
            k=0,
            draft_ids=[],
            matches=[],
            target_ids=list(emitted),
            num_accepted=0,
            next_token=emitted[-1],
            next_kind=0,
            emitted=emitted,
        )
        return [outcome]


def _generate(deps: Deps, completion: list[int], **fields: Any) -> tuple[list, Generation]:
    request = pb.GenerateRequest(
        prompt=PROMPT,
        session_id="s1",
        request_id="r1",
        create_session=True,
        k=0,
        max_new_tokens=len(completion),
        **fields,
    )
    generation = Generation(deps, request)

    async def run() -> list:
        return [c async for c in generation.chunks()]

    return asyncio.run(run()), generation


def test_a_finished_generation_replays_its_live_text(tok, prompt_ids, completion):
    store = MemoryStore()
    deps = Deps(
        OrchestratorConfig(),
        store,
        ScriptedRunner(len(prompt_ids), completion),
        Prompter(tok),
        frozenset({tok.eos_token_id}),
        8192,
        "me",
        "m",
    )
    live, generation = _generate(deps, completion)
    assert [t for c in live for t in c.token_ids] == completion and live[-1].finish_reason == pb.FINISH_REASON_LENGTH
    live_text = "".join(c.text_delta for c in live)
    assert live_text == generation.response().text and live_text.endswith("vier" + REPLACEMENT_CHAR)
    chunks, again = _generate(deps, completion)  # the retry: a replay, nothing appended
    assert again.response().text == live_text and list(again.response().token_ids) == completion
    assert "".join(c.text_delta for c in chunks) == live_text and store.session.ids == prompt_ids + completion
    held = ""
    for chunk in live[:-1]:  # a client that holds the first rounds resumes after them: the rest of the text
        held += chunk.text_delta
        rest, _ = _generate(deps, completion, resume_offset=chunk.offset + len(chunk.token_ids))
        assert held + "".join(c.text_delta for c in rest) == live_text


def test_a_generation_ended_by_overlapping_stop_strings_replays_its_live_text(tok, prompt_ids):
    completion = _overlap_completion(tok)
    store = MemoryStore()
    deps = Deps(
        OrchestratorConfig(),
        store,
        ScriptedRunner(len(prompt_ids), completion),
        Prompter(tok),
        frozenset({tok.eos_token_id}),
        8192,
        "me",
        "m",
    )
    live, generation = _generate(deps, completion, stop=OVERLAP_STOPS)
    live_text = "".join(c.text_delta for c in live)
    assert live[-1].finish_reason == pb.FINISH_REASON_STOP and live_text == "Hello xc"
    assert store.session.last_text_chars == len(live_text)
    again, retried = _generate(deps, completion, stop=OVERLAP_STOPS)
    assert "".join(c.text_delta for c in again) == live_text == retried.response().text
    kept = len(store.session.completion_ids)
    for offset in range(kept + 1):  # a resume: the client's text and the rest make the live text
        rest, resumed = _generate(deps, completion, stop=OVERLAP_STOPS, resume_offset=offset)
        rest_text = "".join(c.text_delta for c in rest)
        assert resumed.response().text == live_text and live_text.endswith(rest_text), (offset, rest_text)
        assert offset > 0 or rest_text == live_text
