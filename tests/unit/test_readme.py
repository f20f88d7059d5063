"""README.md as a front door: short, every bash block run or marked, every performance number true.

The blocks themselves run in tests/integration/test_readme_blocks.py against one `specdec up` stack.
"""

from __future__ import annotations

import re

import pytest

from tests.readme_support import (
    MAX_README_LINES,
    MEASURE_COLUMNS,
    PERF_HEADING,
    README,
    ROOT,
    code_blocks,
    performance_errors,
    section,
    table_rows,
)

TEXT = README.read_text()
RUNNABLE_LANGS = ("bash", "python")
#: commands a README bash block may run against the stack (anything else needs a `not run` marker);
#: none sets shell state, so tests/integration/test_readme_blocks.py runs them one by one.
RUNNABLE_COMMANDS = (".venv/bin/specdec", ".venv/bin/python", "curl")
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")
DOCS = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]


def test_readme_is_short() -> None:
    assert len(TEXT.splitlines()) <= MAX_README_LINES


def test_every_code_block_is_runnable_or_marked() -> None:
    blocks = code_blocks(TEXT)
    assert [b for b in blocks if b.lang == "bash"], "the README has no bash block"
    for b in blocks:
        if b.not_run is not None or b.lang not in RUNNABLE_LANGS:
            continue
        if b.lang == "bash":
            for line in b.code.splitlines():
                if line.strip() and not line.startswith(" "):
                    assert line.startswith(RUNNABLE_COMMANDS), (
                        f"README line {b.line}: {line!r} runs something the README test cannot run against "
                        f"one `specdec up` stack; mark the block <!-- not run: reason -->"
                    )
                if "specdec generate" in line:
                    assert "--address 127.0.0.1:50050" in line, (
                        f"README line {b.line}: the test swaps the README's address for its stack's; a default "
                        f"address would reach whatever listens on the default port"
                    )


def test_exactly_one_block_starts_the_stack() -> None:
    ups = [b for b in code_blocks(TEXT) if b.not_run is None and "specdec up" in b.code]
    assert len(ups) == 1, f"{len(ups)} unmarked blocks run `specdec up`; the README test starts exactly one stack"
    assert len(ups[0].code.strip().splitlines()) == 1
    assert "--port 50050" in ups[0].code and "--http-port 8000" in ups[0].code


def test_not_run_markers_give_a_reason() -> None:
    for b in code_blocks(TEXT):
        if b.lang == "bash" and b.not_run is not None:
            assert len(b.not_run) >= 10, f"README line {b.line}: say why the block is not run"


def test_performance_numbers_match_the_committed_json() -> None:
    assert performance_errors(TEXT) == []


def test_performance_table_has_rows_from_the_latest_bench() -> None:
    rows = table_rows(section(TEXT, PERF_HEADING))
    assert len(rows) >= 4
    assert any("bench/results/latest.json" in r["JSON"] and r["command"] == "`make bench`" for r in rows)
    assert not re.search(r"\bwas\b|\bprevious\b", section(TEXT, PERF_HEADING)), "no history in the README"


def test_no_speed_figures_outside_the_table() -> None:
    """Speed figures live in the one table, where they are checked; the README quotes none elsewhere."""
    table = "\n".join(ln for ln in section(TEXT, PERF_HEADING).splitlines() if ln.startswith("|"))
    rest = TEXT.replace(table, "")
    assert not re.findall(r"\d\s*(?:×|x\b|tok/s|tokens/s|ms\b)", rest)


def _numeric_cells(text: str) -> list[tuple[int, str]]:
    """(row index, cell text) of every number in the performance table."""
    rows = table_rows(section(text, PERF_HEADING))
    return [(i, row[c]) for i, row in enumerate(rows) for c in MEASURE_COLUMNS if row[c] != "–"]


def _change_cell(text: str, row_index: int, old: str, new: str) -> str:
    """The README with one cell of one performance-table row replaced."""
    lines = text.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.strip() == PERF_HEADING)
    table = next(i for i in range(head, len(lines)) if lines[i].startswith("|")) + 2
    line = lines[table + row_index]
    cells = line.split("|")
    k = next(j for j, c in enumerate(cells) if c.strip().replace("**", "") == old)
    cells[k] = cells[k].replace(old, new)
    lines[table + row_index] = "|".join(cells)
    return "\n".join(lines)


@pytest.mark.parametrize("delta", [+1, -1])
def test_changing_any_number_fails_the_check(delta: int) -> None:
    """The check is not trivially green: every single number, nudged by one in its last digit, fails it."""
    cells = _numeric_cells(TEXT)
    assert len(cells) >= 10
    for row_index, shown in cells:
        decimals = len(shown.split(".")[1]) if "." in shown else 0
        nudged = f"{float(shown) + delta * 10**-decimals:.{decimals}f}"
        errors = performance_errors(_change_cell(TEXT, row_index, shown, nudged))
        assert errors, f"row {row_index}: {shown} -> {nudged} went unnoticed"


def test_wrong_json_command_or_cpu_fails_the_check() -> None:
    swaps = [
        (
            "`bench/results/int4.json` | `specdec bench --engine torch --dtype int4",
            "`bench/results/int8.json` | `specdec bench --engine torch --dtype int4",
        ),
        (
            "`bench/results/int4.json` | `specdec bench --engine torch",
            "`bench/results/int4.json` | `specdec bench --engine llamacpp",
        ),
        ("llama.cpp Q4_1, n-gram, k = 0 (`k0`) | 41.7", "llama.cpp Q8_0, n-gram, k = 0 (`k0`) | 41.7"),
        ("ngram-simple (`server_ngram_simple`) | 42.4", "ngram-simple (`server_ngram_simple`) | 42.5"),
        ("--no-hf --k 1,2,4 --threads 1", "--no-hf --k 1,2,4 --threads 2"),
        ("| AMD EPYC, 2 cores |", "| AMD EPYC, 4 cores |"),
        ("adaptive k ≤ 12 (`adaptive`) | 58.2", "adaptive k ≤ 8 (`adaptive`) | 58.2"),
        ("Q4_1.gguf, target alone (`server`) | 43.0", "Q8_0.gguf, target alone (`server`) | 43.0"),
    ]
    for old, new in swaps:
        assert old in TEXT, old
        assert performance_errors(TEXT.replace(old, new, 1)), f"{old!r} -> {new!r} went unnoticed"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc) -> None:
    """Every relative link of the README, docs/ and bench/README.md names a file that exists."""
    broken = []
    for target in MARKDOWN_LINK.findall(doc.read_text()):
        if target.startswith(("http://", "https://", "mailto:", "#")):
            continue
        path, _, anchor = target.partition("#")
        file = doc.parent / path if path else doc
        if not file.exists() or anchor and file.suffix == ".md" and anchor not in _anchors(file.read_text()):
            broken.append(target)
    assert broken == []


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    headings = re.findall(r"^#{1,6} (.+)$", markdown, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}
