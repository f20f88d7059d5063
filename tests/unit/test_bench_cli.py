"""`specdec bench`'s command line: --llama-server-configs (no models, no processes)."""

from __future__ import annotations

import argparse

import pytest

from specdec.bench.bench_cli import add_parser, args_from_cli
from specdec.bench.llama_server import SPEC_CONFIGS


def _args(*argv: str):
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    return args_from_cli(parser.parse_args(["bench", *argv]))


def test_every_llama_server_configuration_runs_unless_some_are_named():
    assert _args().llama_server_configs is None  # the anchor runs all of SPEC_CONFIGS
    assert _args("--llama-server-configs", "server").llama_server_configs == ["server"]
    named = _args("--llama-server-configs", " server_ngram_mod, server ").llama_server_configs
    assert named == ["server_ngram_mod", "server"] and set(named) <= set(SPEC_CONFIGS)


def test_an_unknown_llama_server_configuration_is_refused_with_the_known_ones():
    with pytest.raises(SystemExit, match="got bogus") as refused:
        _args("--llama-server-configs", "server,bogus")
    assert all(name in str(refused.value) for name in SPEC_CONFIGS)
