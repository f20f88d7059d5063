"""`specdec --version`, the address `specdec up` and `specdec generate` agree on, and what generate says when
nothing listens there."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import specdec
from specdec import cli, up
from specdec.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
CLI_TIMEOUT_S = 120


def test_version_flag_prints_the_package_version():
    out = subprocess.run(
        [sys.executable, "-m", "specdec.cli", "--version"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"specdec {specdec.__version__}"


def test_the_fallback_version_is_the_one_pyproject_declares():
    declared = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert specdec.__version__ == declared


def test_up_listens_where_generate_looks_by_default():
    up_args = cli.build_parser().parse_args(["up"])
    generate = cli.build_parser().parse_args(["generate", "hi"])
    assert generate.address == f"127.0.0.1:{cli.DEFAULT_ORCHESTRATOR_PORT}"
    assert up_args.port is None  # unset: the default port when free
    assert up_args.log_dir == "" and cli.build_parser().parse_args(["up", "--log-dir", "logs"]).log_dir == "logs"
    free = free_port()
    assert up.orchestrator_port(None, default=free) == free
    assert up.orchestrator_port(0, default=free) not in (0, free)  # 0: any free port
    assert up.orchestrator_port(4321, default=free) == 4321


def test_up_takes_another_port_when_the_default_is_taken(capsys):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        port = up.orchestrator_port(None, default=taken)
    assert port != taken and port > 0
    assert f"{taken} is taken" in capsys.readouterr().err


def test_generate_without_a_stack_says_how_to_start_one(capsys):
    port = free_port()  # nothing listens there
    code = cli.main(["generate", "--address", f"127.0.0.1:{port}", "--timeout", "10", "hello"])
    err = capsys.readouterr().err
    assert code == 1
    assert f"no orchestrator answers at 127.0.0.1:{port}" in err
    assert "specdec up" in err


@pytest.mark.parametrize("flag", ["--help"])
def test_up_help_names_the_default_port(flag, capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["up", flag])
    assert str(cli.DEFAULT_ORCHESTRATOR_PORT) in capsys.readouterr().out
