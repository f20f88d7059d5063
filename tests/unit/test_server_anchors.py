"""specdec.bench.llama_server.ServerAnchors and ServerWaves: llama-server kept running through the bench's loop
(`specdec bench`: each prompt on every configuration; `specdec bench-concurrency`: each c's waves on one server with
slots); a server that fails to start or dies costs its own column with the reason, never the run. A stand-in `llama-server` (a small HTTP server with the endpoints the bench uses) plays the binary,
as real processes on real sockets."""

from __future__ import annotations

import os
import signal
import sys
from collections import namedtuple
from pathlib import Path

import pytest

from specdec.bench.llama_server import SPEC_CONFIGS, ServerAnchors, ServerWaves

Prompt = namedtuple("Prompt", "set id ids")
PROMPTS = [Prompt("grounded", "g1", [5, 6, 7]), Prompt("open", "o1", [8, 9])]

STAND_IN = """#!{python}
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

if "--spec-type" in sys.argv and os.environ.get("STAND_IN_SPEC_FAILS"):
    sys.exit(3)
PORT = int(sys.argv[sys.argv.index("--port") + 1])


class Handler(BaseHTTPRequestHandler):
    def _send(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send({{"status": "ok"}})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = req["prompt"]
        self._send({{"tokens": [prompt[i % len(prompt)] for i in range(req["n_predict"])]}})

    def log_message(self, *args):
        pass


HTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
"""


@pytest.fixture
def binary(tmp_path: Path) -> Path:
    path = tmp_path / "llama-server"
    path.write_text(STAND_IN.format(python=sys.executable))
    path.chmod(0o755)
    return path


def _run(anchors: ServerAnchors, repeats: int = 2, between=None) -> dict:
    anchors.warm_up(PROMPTS[0].ids)
    for rep in range(repeats):
        for p in PROMPTS:
            anchors.measure(p)
        if between is not None:
            between(rep)
    return anchors.result()


def test_every_configuration_measures_each_prompt_and_keeps_its_tokens(binary: Path):
    with ServerAnchors(Path("model.gguf"), 2, 4, ["server", "server_ngram_mod"], str(binary)) as anchors:
        got = _run(anchors)
    assert not anchors.servers  # stopped on exit
    assert got["gguf"] == "model.gguf" and got["threads"] == 2 and "interleaved" in got["order"]
    assert list(got["configs"]) == ["server", "server_ngram_mod"]  # SPEC_CONFIGS' order, only those named
    for name, cfg in got["configs"].items():
        assert cfg["args"] == SPEC_CONFIGS[name]
        assert {s: len(v) for s, v in cfg["runs"].items()} == {"grounded": 2, "open": 2}
        assert all(v > 0 for v in cfg["tok_s"].values())
        assert cfg["tokens"] == {"grounded/g1": [5, 6, 7, 5], "open/o1": [8, 9, 8, 9]}


def test_a_server_that_does_not_start_is_skipped_with_its_reason(binary: Path, monkeypatch):
    monkeypatch.setenv("STAND_IN_SPEC_FAILS", "1")
    with ServerAnchors(Path("model.gguf"), 2, 4, binary=str(binary)) as anchors:
        got = _run(anchors, repeats=1)
    assert set(got["configs"]) == set(SPEC_CONFIGS)
    assert set(got["configs"]["server"]["tok_s"]) == {"grounded", "open"}
    for name in ("server_ngram_simple", "server_ngram_mod"):
        assert "exited (3)" in got["configs"][name]["skipped"]


def test_a_server_that_dies_mid_run_costs_its_column_not_the_run(binary: Path):
    with ServerAnchors(Path("model.gguf"), 2, 4, ["server", "server_ngram_simple"], str(binary)) as anchors:
        victim = anchors.servers["server_ngram_simple"].proc

        def kill_after_first_repeat(rep: int) -> None:
            if rep == 0:
                os.kill(victim.pid, signal.SIGKILL)
                victim.wait()

        got = _run(anchors, between=kill_after_first_repeat)
    assert "request failed" in got["configs"]["server_ngram_simple"]["skipped"]
    assert {s: len(v) for s, v in got["configs"]["server"]["runs"].items()} == {"grounded": 2, "open": 2}


def test_waves_of_c_requests_give_one_sample_of_aggregate_tok_s_per_call(binary: Path):
    ids = [[1, 2], [3, 4], [5, 6]]
    with ServerWaves(Path("model.gguf"), ids, 2, 4, 2, str(binary)) as waves:
        for _ in range(2):
            waves.wave(1)
            waves.wave(2)
    got = waves.result()
    assert got["slots"] == 2 and got["gguf"] == "model.gguf" and "interleaved" in got["order"]
    assert {c: len(v) for c, v in got["runs"].items()} == {"1": 2, "2": 2}
    assert all(v > 0 for v in got["tokens_per_s"].values())


def test_anchors_without_a_gguf_say_why(binary: Path):
    with ServerAnchors(None, 2, 4, binary=str(binary)) as anchors:
        anchors.warm_up([1])
        anchors.measure(PROMPTS[0])
    assert anchors.result() == {"skipped": "the target is not a GGUF file: llama-server needs one"}


def test_waves_without_a_gguf_or_after_the_server_died_say_why(binary: Path):
    with ServerWaves(None, [], 1, 4, 2, str(binary)) as waves:
        waves.wave(1)
    assert waves.result() == {"skipped": "the target is not a GGUF file: llama-server needs one"}
    with ServerWaves(Path("model.gguf"), [[1, 2]], 1, 4, 2, str(binary)) as waves:
        assert waves.server is not None
        waves.server.proc.kill()
        waves.server.proc.wait()
        waves.wave(1)
    assert "request failed" in waves.result()["skipped"]


def test_a_difference_where_ours_ends_a_generation_is_told_apart_from_a_near_tie():
    from specdec.bench.llama_server import difference_line, server_identity
    from specdec.bench.plan import RunRecord

    prompts = [Prompt("grounded", "g1", [5, 6]), Prompt("grounded", "g2", [7]), Prompt("open", "o1", [8])]
    theirs = {"grounded/g1": [10, 11, 30, 12], "grounded/g2": [20, 21, 22, 23], "open/o1": [1, 2, 3, 4]}
    ours = {"g1": [10, 11, 2, 12], "g2": [20, 21, 24, 23], "o1": [1, 2, 3, 4]}  # 2 ends a generation
    records = [RunRecord(p.set, p.id, "k0", 0, ours[p.id], 1.0, []) for p in prompts]
    gaps = {"g1": 1.37, "g2": 0.2}
    got = server_identity(
        records,
        prompts,
        {"configs": {"server": {"tokens": theirs}}},
        gap=lambda ids, prefix: (gaps["g1" if ids == [5, 6] else "g2"], 1.2),
        is_eog=lambda token: token == 2,
    )["k0"]
    assert got["identical"] == 1 and got["prompts"] == 3
    eos, tie = got["differences"]
    assert (eos["position"], eos["ends_generation"], eos["near_tie"]) == (2, True, False)
    assert (tie["position"], tie["ends_generation"], tie["near_tie"]) == (2, False, True)
    assert "ours ends a generation there" in difference_line(eos)
    assert difference_line(tie) == "grounded/g2 at position 2: top-2 logit gap 0.200, near-tie (<= 1.2)"
