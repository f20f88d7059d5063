"""scripts/verify_cost.py, the prepared GPU measurement: runs on CPU with the tiny shape and writes its JSON."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "verify_cost.py"


def load():
    spec = importlib.util.spec_from_file_location("verify_cost", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_cpu_smoke_run_writes_v_of_n_and_rolls_the_cache_back_every_pass(tmp_path):
    """main() raises if a rollback leaves the cache longer than the context."""
    script = load()
    out = tmp_path / "v.json"
    assert (
        script.main(
            ["--shapes", "tiny", "--device", "cpu", "--n-max", "3", "--reps", "2", "--context", "20", "--out", str(out)]
        )
        == 0
    )
    result = json.loads(out.read_text())
    tiny = result["shapes"]["tiny"]
    assert set(tiny["ms"]) == {"1", "2", "3"} and tiny["ratio"]["1"] == 1.0
    assert all(v > 0 for v in tiny["ms"].values()) and result["dtype"] == "float32"
    model = script.build("tiny", torch.device("cpu"), torch.float32, 0)
    assert sum(p.numel() for p in model.parameters()) == tiny["parameters"]


def test_the_named_shapes_are_the_article_s_pair():
    shapes = load().SHAPES
    assert shapes["qwen1.5-0.5b"]["hidden_size"] == 1024 and shapes["qwen1.5-1.8b"]["hidden_size"] == 2048
    assert shapes["qwen1.5-0.5b"]["vocab_size"] == shapes["qwen1.5-1.8b"]["vocab_size"] == 151936


def test_the_script_needs_neither_grpc_nor_redis(tmp_path):
    """The GPU machine has torch and transformers only: the script must run with those imports blocked."""
    import subprocess
    import sys

    code = (
        "import sys, runpy; sys.modules['grpc'] = None; sys.modules['redis'] = None; "
        f"sys.argv = ['verify_cost.py', '--shapes', 'tiny', '--device', 'cpu', '--n-max', '2', '--reps', '1', "
        f"'--context', '8', '--out', {str(tmp_path / 'v.json')!r}]; runpy.run_path({str(SCRIPT)!r}, run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "v.json").read_text())["shapes"]["tiny"]["ratio"]["1"] == 1.0


def test_v_of_n_fills_and_rolls_back_a_trained_drafts_cache():
    """The bench's draft step cost c measures a trained draft (DraftForCausalLM), whose forward takes its
    cache only under transformers' new name: passing the old one measured a forward without any cache
    and, once the rollback check came, made `specdec bench --draft-kind combined` fail at its very end."""
    from specdec.bench.verify_cost import measure_verify_costs
    from specdec.models.compat import cache_argument
    from specdec.models.draft_model import build_draft
    from specdec.models.tiny import build_tiny_causal_lm
    from tests.support import smollm2_tokenizer

    target = build_tiny_causal_lm(smollm2_tokenizer(), layers=2, seed=1)
    draft = build_draft(target, 1, list(range(500)))
    for model in (target, draft):
        result = measure_verify_costs(model, None, 2, context_tokens=12, reps=1, vocab=500)
        assert set(result["ms"]) == {"1", "2"}
        assert result["kv_bytes_per_token_measured"] > 0  # the 12 context positions are in the cache
    assert cache_argument(draft) in ("cache", "past_key_values")
