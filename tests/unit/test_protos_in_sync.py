"""The generated code in specdec/v1 is exactly what scripts/gen_protos.py makes from protos/."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_matches_protos(tmp_path):
    gen = _load_generator()
    fresh = {p.name: p.read_text() for p in gen.generate(tmp_path)}
    committed_dir = ROOT / "specdec" / "v1"
    committed = {p.name: p.read_text() for p in committed_dir.iterdir() if p.suffix in {".py", ".pyi"}}
    assert sorted(fresh) == sorted(committed), "generated file set differs: run `make protos`"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"generated code is out of date for {stale}: run `make protos` (never edit by hand)"


def test_every_proto_has_a_versioned_package():
    for proto in (ROOT / "protos" / "specdec" / "v1").glob("*.proto"):
        assert "package specdec.v1;" in proto.read_text(), proto
