"""Reading README.md for its tests: the fenced code blocks and the performance table.

A code block either carries `<!-- not run: reason -->` on the line before its opening fence, or
tests/integration/test_readme_blocks.py runs it against one `specdec up` stack. Each number of
the performance table is checked against the committed bench JSON its row names
(tests/unit/test_readme.py).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 250
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(?P<reason>\S.*?)\s*-->$")
FENCE = re.compile(r"^```(?P<lang>\S*)\s*$")
#: README addresses of the stack that `specdec up --port 50050 --http-port 8000` starts.
ORCH_ADDRESS, HTTP_ADDRESS = "127.0.0.1:50050", "127.0.0.1:8000"
PERF_HEADING = "## Performance"
#: table column -> measure key of the bench JSON (result[SET][MEASURE][CONFIG]).
MEASURE_COLUMNS = {
    "tok/s": "tokens_per_s",
    "× our k=0": "speedup",
    "× HF prompt lookup": "vs_hf",
    "tokens / round": "mean_accepted_length",
}
TEXT_COLUMNS = ("prompts", "configuration", "JSON", "command", "CPU")
NOT_APPLICABLE = "–"
LLAMACPP = "llamacpp"  # the bench's llama.cpp anchor (result["llamacpp"]["tok_s"][set])
SERVER_CONFIGS = ("server", "server_ngram_simple", "server_ngram_mod")  # llama-server (result["llama_server"])
ENGINE_LABEL = "llama.cpp "  # a row of our stack on the llama.cpp engine: "llama.cpp Q4_1, n-gram, ..."
LOAD_KEY = "datasets"  # a `make bench-load` JSON (result["datasets"]["prompts"]["configs"][config][point])


@dataclass
class Block:
    lang: str
    code: str
    line: int  # 1-based line of the opening fence
    not_run: str | None  # the marker's reason, None when the block is meant to run


def code_blocks(text: str) -> list[Block]:
    """Every fenced block of a Markdown text, with the `not run` marker of the line before it."""
    lines, blocks, i = text.splitlines(), [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"README line {i + 1}: code block never closed")
        marker = NOT_RUN.match(lines[i - 1].strip()) if i > 0 else None
        blocks.append(Block(m["lang"], "\n".join(lines[i + 1 : end]), i + 1, marker["reason"] if marker else None))
        i = end + 1
    return blocks


def section(text: str, heading: str) -> str:
    """The text under `heading` up to the next heading of the same or a higher level."""
    level = heading.split()[0]
    out, inside = [], False
    for line in text.splitlines():
        if line.strip() == heading:
            inside = True
            continue
        if inside and re.match(rf"^#{{1,{len(level)}}} ", line):
            break
        if inside:
            out.append(line)
    if not inside:
        raise ValueError(f"no section {heading!r}")
    return "\n".join(out)


def table_rows(text: str) -> list[dict[str, str]]:
    """The first Markdown table of `text` as one dict per row (header -> cell, bold marks removed)."""
    lines = [ln.strip() for ln in text.splitlines()]
    start = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    block = []
    for ln in lines[start:]:
        if not ln.startswith("|"):
            break
        block.append([c.strip().replace("**", "") for c in ln.strip("|").split("|")])
    header, rows = block[0], block[2:]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"row {row} has {len(row)} cells, the header {len(header)}")
    return [dict(zip(header, row)) for row in rows]


def backticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def json_value(result: dict[str, Any], prompt_set: str, measure: str, config: str) -> float | None:
    """The median (or the single count) of one measure, None when the run has no such value. The
    llama.cpp anchor (`llamacpp`) has one measure, its tok/s per prompt set."""
    if config == LLAMACPP:
        tok_s = result.get(LLAMACPP, {}).get("tok_s", {})
        return tok_s.get(prompt_set) if measure == "tokens_per_s" else None
    if config in SERVER_CONFIGS:
        tok_s = result.get("llama_server", {}).get("configs", {}).get(config, {}).get("tok_s", {})
        return tok_s.get(prompt_set) if measure == "tokens_per_s" else None
    value = result.get(prompt_set, {}).get(measure, {}).get(config)
    if isinstance(value, dict):
        value = value.get("median")
    return value


def make_recipe(target: str) -> str:
    """The command a Makefile target runs (its first recipe line, `$(BIN)/` dropped)."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith(f"{target}:"))
    return lines[i + 1].strip().replace("$(BIN)/", "")


def bench_flags(command: str) -> dict[str, str | bool]:
    """`--flag value` pairs and bare `--flag`s of a `specdec bench` command (or `make TARGET`)."""
    words = shlex.split(command)
    if words[0] == "make":
        words = shlex.split(make_recipe(words[1]))
    if words[:2] != ["specdec", "bench"]:
        raise ValueError(f"not a specdec bench command: {command!r}")
    flags: dict[str, str | bool] = {}
    rest = words[2:]
    for i, word in enumerate(rest):
        if word.startswith("--"):
            has_value = i + 1 < len(rest) and not rest[i + 1].startswith("--")
            flags[word] = rest[i + 1] if has_value else True
    return flags


def _number_errors(row: dict[str, str], result: dict[str, Any], where: str) -> list[str]:
    errors = []
    (config,) = backticked(row["configuration"]) or [""]
    for column, measure in MEASURE_COLUMNS.items():
        shown, value = row[column], json_value(result, row["prompts"], measure, config)
        if shown == NOT_APPLICABLE:
            if value is not None:
                errors.append(f"{where}: {column} shown as {NOT_APPLICABLE} but the JSON has {value}")
            continue
        decimals = len(shown.split(".")[1]) if "." in shown else 0
        if value is None:
            errors.append(f"{where}: {column} = {shown}, the JSON has no {measure} for {row['prompts']}/{config}")
        elif f"{value:.{decimals}f}" != shown:
            errors.append(f"{where}: {column} = {shown}, the JSON says {value:.{decimals}f} ({value})")
    return errors


def _setting_errors(row: dict[str, str], path: str, result: dict[str, Any], where: str) -> list[str]:
    """The row's command, CPU and configuration label against what the JSON recorded."""
    errors, settings, machine = [], result["settings"], result["machine"]
    (command,) = backticked(row["command"]) or [row["command"]]
    flags = bench_flags(command)
    expect = {
        "--out": (flags.get("--out", "bench/results/latest.json"), path),
        # runs from before the engine option ran torch
        "--engine": (
            flags.get("--engine", "auto"),
            settings.get("engine_option", "auto" if "engine" in settings else "torch"),
        ),
        "--draft-kind": (flags.get("--draft-kind", "ngram"), settings["draft_kind"]),
        "--no-hf": (bool(flags.get("--no-hf")), "hf_assisted" not in result["grounded"]["tokens_per_s"]),
    }
    if "--draft-model" in flags:
        expect["--draft-model"] = (flags["--draft-model"], settings["draft_model"])
    if "--k" in flags:
        expect["--k"] = ([int(k) for k in str(flags["--k"]).split(",")], settings["k_sweep"])
    if "--threads" in flags:
        expect["--threads"] = (int(flags["--threads"]), settings["threads"]["target_service"])
    errors += [
        f"{where}: command {flag} gives {a!r}, the JSON recorded {b!r}" for flag, (a, b) in expect.items() if a != b
    ]
    cpu = f"{machine['cpu_model']}, {machine['cores']} cores"
    if row["CPU"] != cpu:
        errors.append(f"{where}: CPU {row['CPU']!r}, the JSON recorded {cpu!r}")
    if "--dtype" in flags and flags["--dtype"] != "auto" and flags["--dtype"] != settings["dtype"]:
        errors.append(f"{where}: command --dtype gives {flags['--dtype']!r}, the JSON recorded {settings['dtype']!r}")
    errors += _label_errors(row["configuration"], result, where)
    return errors


def _label_errors(label: str, result: dict[str, Any], where: str) -> list[str]:
    """A row's configuration label against the JSON: the anchors' GGUF, our engine and weights, the adaptive cap."""
    errors, settings = [], result["settings"]
    dtype = {"fp32": "float32", "bf16": "bfloat16", "int8": "int8", "int4": "int4"}.get(label.split(",")[0])
    if backticked(label) == [LLAMACPP] or (backticked(label) and backticked(label)[0] in SERVER_CONFIGS):
        anchor = result.get(LLAMACPP if backticked(label) == [LLAMACPP] else "llama_server", {})
        if anchor.get("gguf", "") not in label:
            errors.append(f"{where}: label {label!r} does not name llama.cpp's GGUF {anchor.get('gguf')!r}")
    elif label.startswith(ENGINE_LABEL):
        weights = label.split(",")[0][len(ENGINE_LABEL) :]
        if settings.get("engine") != "llamacpp" or settings["dtype"] != weights:
            errors.append(
                f"{where}: label {label!r}, the JSON ran engine {settings.get('engine')!r} on {settings['dtype']!r}"
            )
    elif dtype != settings["dtype"] or settings.get("engine", "torch") != "torch":
        errors.append(f"{where}: label {label!r} does not name the dtype {settings['dtype']} on torch")
    cap = re.search(r"adaptive k ≤ (\d+)", label)
    if cap and int(cap[1]) != settings["adaptive_k_cap"]:
        errors.append(f"{where}: label {label!r}, the JSON's adaptive cap is {settings['adaptive_k_cap']}")
    return errors


def performance_errors(readme_text: str, root: Path = ROOT) -> list[str]:
    """Every disagreement between the README's performance table and the JSON each row names."""
    rows = table_rows(section(readme_text, PERF_HEADING))
    missing = [c for c in (*TEXT_COLUMNS, *MEASURE_COLUMNS) if c not in rows[0]]
    if missing:
        return [f"performance table lacks the columns {missing}"]
    errors = []
    for n, row in enumerate(rows, 1):
        where = f"performance row {n} ({row['prompts']}, {row['configuration']})"
        (path,) = backticked(row["JSON"]) or [row["JSON"]]
        if not (root / path).is_file():
            errors.append(f"{where}: {path} is not a committed file")
            continue
        result = json.loads((root / path).read_text())
        if LOAD_KEY in result:
            errors += load_row_errors(row, path, result, where)
            continue
        errors += _number_errors(row, result, where) + _setting_errors(row, path, result, where)
    return errors


def load_point(row: dict[str, str], result: dict[str, Any]) -> dict[str, Any] | None:
    """The bench-load point a row shows: prompts "mixed, N streams" -> concurrency@N of its configuration."""
    streams = re.search(r"(\d+) streams", row["prompts"])
    (config,) = backticked(row["configuration"]) or [""]
    points = result[LOAD_KEY].get("prompts", {}).get("configs", {}).get(config, {})
    return points.get(f"concurrency@{streams[1]}") if streams else None


def load_row_errors(row: dict[str, str], path: str, result: dict[str, Any], where: str) -> list[str]:
    """A row from `make bench-load`'s JSON: streamed tok/s (output tok/s in runs before it) and its ratio to k = 0 at that point, the
    command's flags against the recorded settings, the CPU; the bench's other columns are –."""
    point = load_point(row, result)
    if point is None:
        return [f"{where}: no such point in {path} (prompts must read 'mixed, N streams')"]
    errors = []
    measure = "streamed_tokens_per_s" if "streamed_tokens_per_s" in point else "output_tokens_per_s"  # runs before it
    for column, value in (("tok/s", point[measure]), ("× our k=0", point["vs_k0"][measure])):
        shown = row[column]
        decimals = len(shown.split(".")[1]) if "." in shown else 0
        if f"{value:.{decimals}f}" != shown:
            errors.append(f"{where}: {column} = {shown}, the JSON says {value:.{decimals}f} ({value})")
    errors += [
        f"{where}: {column} should be {NOT_APPLICABLE}"
        for column in ("× HF prompt lookup", "tokens / round")
        if row[column] != NOT_APPLICABLE
    ]
    (command,) = backticked(row["command"]) or [row["command"]]
    words, settings = shlex.split(command), result["settings"]
    if words[:2] != ["make", "bench-load"] or "--out" in command:
        errors.append(f"{where}: command {command!r} is not `make bench-load ...` writing {path}")
    for flag, key in (("--max-tokens", "max_tokens"), ("--max-seconds-per-point", "max_seconds_per_point")):
        given = re.search(rf"{flag} (\S+)", command)
        if given and float(given[1].strip('"')) != float(settings[key]):
            errors.append(f"{where}: command {flag} {given[1]}, the JSON recorded {settings[key]}")
    machine = result["machine"]
    if row["CPU"] != f"{machine['cpu_model']}, {machine['cores']} cores":
        errors.append(f"{where}: CPU {row['CPU']!r}, the JSON recorded {machine['cpu_model']!r}")
    return errors
