"""The llama.cpp anchor runs in a child process of its own: a native crash there (SIGSEGV in llama.cpp's
AMX matmul on an Intel Xeon VM) costs the column with a reason, never the bench run. A stand-in
`llama_cpp` package on sys.path (the spawned child gets the parent's sys.path) plays the library."""

from __future__ import annotations

import sys
from collections import namedtuple

import pytest

from specdec.bench.llamacpp import LibraryAnchor

Prompt = namedtuple("Prompt", "set ids")
PROMPTS = [Prompt("grounded", [1, 2, 3]), Prompt("open", [4, 5])]

FAKE = """
import os, signal
__version__ = "0.0-stand-in"

class Llama:
    def __init__(self, model_path, **options):
        if os.environ.get("STAND_IN_LLAMA_CRASH"):
            os.kill(os.getpid(), signal.SIGSEGV)
        self.options = options

    def reset(self):
        pass

    def generate(self, ids, **sampling):
        while True:
            yield 7
"""


def llamacpp_anchor(target_model: str, prompts: list, max_new: int, repeats: int, threads: int) -> dict:
    """The prompts back to back on a LibraryAnchor (the bench interleaves them with its configurations)."""
    with LibraryAnchor(target_model, threads, max_new) as anchor:
        if prompts:
            anchor.warm_up(prompts[0].ids)
        for _ in range(repeats):
            for p in prompts:
                anchor.measure(p)
        return anchor.result()


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    (tmp_path / "llama_cpp").mkdir()
    (tmp_path / "llama_cpp" / "__init__.py").write_text(FAKE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "llama_cpp", raising=False)
    return tmp_path


def test_the_anchor_measures_each_prompt_set_in_a_child_process(stand_in):
    got = llamacpp_anchor("embedded", PROMPTS, max_new=5, repeats=2, threads=1)
    assert got["version"] == "0.0-stand-in" and got["gguf"].endswith(".gguf") and got["threads"] == 1
    assert set(got["tok_s"]) == {"grounded", "open"} and all(v > 0 for v in got["tok_s"].values())
    assert [len(v) for v in got["runs"].values()] == [2, 2]


def test_a_crash_of_the_library_costs_the_column_not_the_run(stand_in, monkeypatch):
    monkeypatch.setenv("STAND_IN_LLAMA_CRASH", "1")
    got = llamacpp_anchor("embedded", PROMPTS, max_new=5, repeats=1, threads=1)
    assert set(got) == {"skipped"} and "crashed" in got["skipped"] and "CMAKE_ARGS" in got["skipped"]
