"""What `specdec generate` prints, without a server: JSON numbers, --help, a reader that goes away."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from specdec import cli
from specdec.proto_json import message_to_dict
from specdec.v1 import orchestrator_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
BIG_OUTPUT_LINES = 200_000  # far more than a pipe buffer holds
READ_TIMEOUT_S = 60


def test_int64_counters_print_as_numbers_like_the_http_api():
    resp = pb.GenerateResponse(text="hi", token_ids=[5, 6])
    resp.stats.wire_bytes = 123_456
    resp.stats.target_computed_tokens = 42
    resp.stats.rounds = 3
    resp.trace.add(index=0, target_computed_tokens=7)
    data = message_to_dict(resp)
    assert data["stats"]["wire_bytes"] == 123_456 and data["stats"]["target_computed_tokens"] == 42
    assert data["stats"]["rounds"] == 3 and data["trace"][0]["target_computed_tokens"] == 7
    assert data["token_ids"] == [5, 6] and data["text"] == "hi"
    assert message_to_dict(pb.Stats(), all_fields=True)["wire_bytes"] == 0


def _generate_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec")
    sub = parser.add_subparsers(dest="command")
    cli._generate_parser(sub)
    return sub.choices["generate"]


def test_generate_help_describes_every_flag():
    parser = _generate_parser()
    undocumented = [a.dest for a in parser._actions if not (a.help or "").strip()]
    assert not undocumented, f"flags without a description in `specdec generate --help`: {undocumented}"
    text = parser.format_help()
    for flag in ("--k", "--trace", "--json", "--stream", "--seed", "--max-new-tokens", "--draft-kind"):
        assert flag in text


def _run_into_closed_pipe(handler_source: str) -> subprocess.CompletedProcess:
    """`specdec generate x | head -1` with cmd_generate replaced by `handler_source` (no server needed)."""
    script = (
        "import sys, time\n"
        "from specdec import cli\n"
        f"{handler_source}\n"
        "cli.cmd_generate = handler\n"
        "sys.exit(cli.main(['generate', 'x']))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()  # what `head -1` does after its line
    stderr = proc.stderr.read().decode()
    code = proc.wait(timeout=READ_TIMEOUT_S)
    return subprocess.CompletedProcess(proc.args, code, first.decode(), stderr)


def test_a_reader_that_leaves_mid_output_gets_no_traceback():
    done = _run_into_closed_pipe(
        f"def handler(args):\n    print('first', flush=True)\n    time.sleep(0.5)\n"
        f"    for i in range({BIG_OUTPUT_LINES}):\n        print('line', i)\n    return 0"
    )
    assert done.stdout == "first\n"
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == cli.EXIT_BROKEN_PIPE


def test_a_reader_that_leaves_before_the_final_flush_gets_no_traceback():
    done = _run_into_closed_pipe(
        "def handler(args):\n    print('first', flush=True)\n    time.sleep(0.5)\n    print('stats')\n    return 0"
    )
    assert done.stdout == "first\n"
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == cli.EXIT_BROKEN_PIPE


class _FakeStub:
    """Stands in for OrchestratorStub: answers Generate with a canned response."""

    response = pb.GenerateResponse()

    def __init__(self, channel) -> None:
        pass

    def Generate(self, request, timeout=None, metadata=()):
        return self.response


def _generate_json(monkeypatch, capsys, resp: pb.GenerateResponse) -> dict:
    """What `specdec generate x --json` prints for `resp` (no server: the stub is replaced)."""
    import contextlib
    import json

    from specdec import healthcheck
    from specdec.v1 import orchestrator_pb2_grpc

    monkeypatch.setattr(healthcheck, "channel_for", lambda address, tls: contextlib.nullcontext(None))
    monkeypatch.setattr(orchestrator_pb2_grpc, "OrchestratorStub", _FakeStub)
    monkeypatch.setattr(_FakeStub, "response", resp)
    assert cli.main(["generate", "x", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_output_keeps_zero_stats_and_uses_the_openai_finish_names(monkeypatch, capsys):
    """One stats shape and one set of finish names in `--json`, the HTTP extension and the Python client."""
    from http_gateway.openai_schema import extension
    from specdec.client import result_from_response

    resp = pb.GenerateResponse(
        text="hi", token_ids=[5, 6], finish_reason=pb.FINISH_REASON_LENGTH, stats=pb.Stats(rounds=2, wire_bytes=9)
    )
    out = _generate_json(monkeypatch, capsys, resp)
    assert list(out["stats"]) == [f.name for f in pb.Stats.DESCRIPTOR.fields]  # zeros too
    assert out["stats"]["draft_tokens"] == 0 and out["stats"]["wire_bytes"] == 9
    assert (out["finish_reason"], out["finish_detail"]) == ("length", "length")
    http = extension(resp.session_id, resp.request_id, resp.finish_reason, stats=resp.stats)
    client = result_from_response(resp)
    assert out["stats"] == http["stats"] == client.stats
    assert out["finish_reason"] == http["finish_reason"] == client.finish_reason
    assert out["finish_detail"] == http["finish_detail"] == client.finish_detail


def test_an_eos_is_the_openai_stop_everywhere(monkeypatch, capsys):
    from http_gateway.openai_schema import extension
    from specdec.client import result_from_response

    resp = pb.GenerateResponse(text="hi", finish_reason=pb.FINISH_REASON_EOS)
    out = _generate_json(monkeypatch, capsys, resp)
    http = extension("", "", resp.finish_reason)
    client = result_from_response(resp)
    assert out["finish_reason"] == http["finish_reason"] == client.finish_reason == "stop"
    assert out["finish_detail"] == http["finish_detail"] == client.finish_detail == "eos"
