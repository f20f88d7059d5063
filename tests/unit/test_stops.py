"""StopMatcher: hold-back of partial stop strings across arbitrary deltas."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.stops import StopMatcher, StopResult

HYPOTHESIS_EXAMPLES = 500
ALPHABET = "ab\n"  # tiny alphabet: stop strings overlap and partially match often


def _feed(matcher: StopMatcher, deltas: Sequence[str]) -> tuple[str, str | None]:
    """Push deltas until a stop; return (all emitted text incl. flush, matched stop)."""
    out = []
    for delta in deltas:
        result = matcher.push(delta)
        out.append(result.emit)
        if result.stopped:
            return "".join(out), result.matched
    out.append(matcher.flush())
    return "".join(out), None


def _reference(text: str, stops: Sequence[str]) -> tuple[str, str | None]:
    """Text cut at the stop that completes first (ties: longest), by brute force."""
    for end in range(1, len(text) + 1):
        hits = [s for s in stops if text[:end].endswith(s)]
        if hits:
            stop = max(hits, key=len)
            return text[: end - len(stop)], stop
    return text, None


def _split(text: str, cuts: Sequence[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(points, points[1:])]


def test_stop_split_across_many_deltas_is_never_emitted() -> None:
    matcher = StopMatcher(["<|im_end|>"])
    deltas = ["Hello", " world", "<", "|", "im", "_", "end", "|", ">", "junk after"]
    emitted = []
    for delta in deltas:
        result = matcher.push(delta)
        emitted.append(result.emit)
        if result.stopped:
            break
    assert "".join(emitted) == "Hello world"
    assert result == StopResult("", True, "<|im_end|>")
    assert not any("<" in e for e in emitted)
    assert matcher.flush() == ""


def test_partial_prefix_that_is_not_a_stop_is_emitted_later_in_order() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.push("a ST") == StopResult("a ", False, None)
    assert matcher.held == "ST"
    assert matcher.push("O") == StopResult("", False, None)
    assert matcher.push("P? no: STOx") == StopResult("", True, "STOP")

    matcher = StopMatcher(["STOP"])
    assert matcher.push("a ST").emit == "a "
    assert matcher.push("OMP").emit == "STOMP"
    assert matcher.push(" S").emit == " "
    assert matcher.flush() == "S"


def test_several_stop_strings_first_completion_wins() -> None:
    matcher = StopMatcher(["\nUser:", "###"])
    result = matcher.push("answer ### more \nUser: x")
    assert result == StopResult("answer ", True, "###")


def test_overlapping_stops_earliest_completion_then_longest() -> None:
    # "bc" completes before "abcd" can: the streamer stops there.
    assert _feed(StopMatcher(["abcd", "bc"]), ["a", "b", "c", "d"]) == ("a", "bc")
    # Same end index: the longer one (starting earlier) wins.
    assert _feed(StopMatcher(["c", "abc"]), ["xa", "bc"]) == ("x", "abc")
    # Self-overlapping stop: "aab" inside "aaab".
    assert _feed(StopMatcher(["aab"]), ["a", "a", "a", "b", "z"]) == ("a", "aab")


def test_empty_stop_list_is_pass_through() -> None:
    matcher = StopMatcher([])
    assert matcher.push("anything <|im_end|>") == StopResult("anything <|im_end|>", False, None)
    assert matcher.flush() == ""


def test_pushes_after_stop_emit_nothing() -> None:
    matcher = StopMatcher(["x"])
    assert matcher.push("axb").stopped
    assert matcher.push("more") == StopResult("", True, "x")
    assert matcher.stopped


def test_empty_stop_string_is_rejected() -> None:
    with pytest.raises(ValueError):
        StopMatcher(["ok", ""])


def test_duplicate_stops_are_fine() -> None:
    assert _feed(StopMatcher(["ab", "ab"]), ["xa", "by"]) == ("x", "ab")


def test_unicode_stops() -> None:
    assert _feed(StopMatcher(["。"]), ["今天", "天气", "晴朗。", "阳光"]) == ("今天天气晴朗", "。")
    assert _feed(StopMatcher(["🎉🎉"]), ["a🎉", "b🎉", "🎉c"]) == ("a🎉b", "🎉🎉")


@settings(max_examples=HYPOTHESIS_EXAMPLES, deadline=None)
@given(
    text=st.text(alphabet=ALPHABET, max_size=40),
    stops=st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(0, 40), max_size=15),
)
def test_any_chunking_equals_text_cut_at_first_stop(text: str, stops: list[str], cuts: list[int]) -> None:
    expected = _reference(text, stops)
    assert _feed(StopMatcher(stops), _split(text, cuts)) == expected


@settings(max_examples=HYPOTHESIS_EXAMPLES, deadline=None)
@given(
    text=st.text(alphabet=ALPHABET, max_size=40),
    stops=st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 40), max_size=15),
)
def test_emitted_text_never_contains_a_stop(text: str, stops: list[str], cuts: list[int]) -> None:
    matcher, emitted = StopMatcher(stops), ""
    for delta in _split(text, cuts):
        result = matcher.push(delta)
        emitted += result.emit
        assert not any(s in emitted for s in stops)
        assert len(matcher.held) < max(len(s) for s in stops)
        if result.stopped:
            break
