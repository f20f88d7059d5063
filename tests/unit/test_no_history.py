"""No tracked text file cites the project's internal history: docs and code say what is, CHANGELOG.md says what changed.

A citation is a development session, issue, stop or lettered run named by its number or letter ("session 26",
"(issue 18, item 4)", "issue #19", "stop 51", "run D", "runs C, D, E", "round 3 of development"). Ordinary prose
that shares the words does not count: "issue a request", "a GitHub issue", "session_id", "session 3 of a test",
"run the bench", "runs a command", an "A/A" repeat. The generated protobuf code (specdec/v1/) and third-party data
(the Compose specification's JSON schema) are not scanned.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUFFIXES = (".py", ".md", ".json", ".yml", ".yaml", ".sh", ".toml", ".txt")
NAMES = ("Makefile",)
#: generated code and third-party data, not written here
EXCLUDED = ("specdec/v1/", "deploy_tools/compose-spec.json")
#: this file's own examples of what a citation looks like
SELF = "tests/unit/test_no_history.py"
#: our issues and sessions are numbered in one to three digits; a longer number is someone else's tracker
OUR_NUMBER = r"#?\d{1,3}\b"
CITATIONS = (
    # "session 26", "sessions 31-33", "Session 25:", "session 12's"; not "session 3 of a test"
    re.compile(rf"\bsessions? {OUR_NUMBER}(?!\s+of\b)", re.IGNORECASE),
    # "issue 18", "issue #19", "(issue 18, item 4)"; not "issue a request", "GitHub issue"
    re.compile(rf"\bissues? {OUR_NUMBER}", re.IGNORECASE),
    # "stop 51"; not "stop the stack"
    re.compile(rf"\bstops? {OUR_NUMBER}", re.IGNORECASE),
    # "run D", "Run A", "runs C, D, E"; not "runs a command", "run A/A", "run E2E"
    re.compile(r"\b[Rr]uns? [A-H](?![\w/'’-])"),
    # "round 3 of development"; not "round 3 of the generation"
    re.compile(r"\brounds? \d+ of (?:development|the project)\b", re.IGNORECASE),
)


def citations(text: str) -> list[tuple[int, str]]:
    """(1-based line, matched text) of every history citation in a text."""
    return [
        (n, m.group(0))
        for n, line in enumerate(text.splitlines(), 1)
        for pattern in CITATIONS
        for m in pattern.finditer(line)
    ]


def scanned_files() -> list[str]:
    """Every tracked (or new, not ignored) text file the rule covers, relative to the repository root."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return [
        p
        for p in listed
        if (p.endswith(SUFFIXES) or Path(p).name in NAMES)
        and not p.startswith(EXCLUDED)
        and p != SELF
        and (ROOT / p).is_file()
    ]


@pytest.mark.parametrize(
    "text",
    [
        "measured in session 26 on the Xeon",
        "sessions 31-33 found the same",
        "## Session 25: the combined draft",
        "session 12's A/A repeat drifted",
        "the goal (issue 18, item 4)",
        "Issue #19 asks that overlap never costs",
        "issue 18, session 21",
        "what stop 51 left open",
        "Run D counted the pass alone",
        "runs C, D, E agree",
        "run B has the gate",
        "built in round 3 of development",
    ],
)
def test_detector_finds_citations(text: str) -> None:
    assert citations(text), text


@pytest.mark.parametrize(
    "text",
    [
        "the gateway may issue a request to the orchestrator",
        "see the GitHub issue for the upstream bug",
        "llama.cpp issue #12345 tracks it",
        "session_id = new_session()",
        "session 3 of a test reuses the stack",
        "run the bench with make bench",
        "it runs a command with a deadline",
        "an A/A repeat: run A/A twice",
        "Run E2E tests",
        "stop the stack with Ctrl-C",
        "the round 3 of the generation accepted 2 tokens",
        "16 concurrent sessions, 4 of them long",
    ],
)
def test_detector_passes_ordinary_prose(text: str) -> None:
    assert citations(text) == [], text


def test_detector_reports_lines() -> None:
    assert citations("fine\nsee issue 7\nfine") == [(2, "issue 7")]


def test_no_file_cites_internal_history() -> None:
    found = [
        f"{path}:{line}: {match!r}"
        for path in scanned_files()
        for line, match in citations((ROOT / path).read_text(encoding="utf-8", errors="replace"))
    ]
    assert found == [], (
        "history citations (say what is; history belongs in CHANGELOG.md without internal numbers):\n"
        + "\n".join(found)
    )
