"""`specdec bench --quick`: the benchmark runs end to end and writes the JSON and the PNG.

One prompt per set, 12 tokens (--quick's 24 halved by --max-new-tokens), one repeat, and a k sweep of {4}
alone (k = 0, k = 4, k unset, adaptive k <= 4, HF target-only, HF prompt lookup: 12 generations), so it
stays under a minute on 2 cores. llama.cpp's server runs its target-alone configuration only
(--llama-server-configs server: one server start, not one per speculation type; the anchor's code is the same
for each). It checks the shape of the result (keys naming the prompt set and the measure), that every
configuration produced the same number of tokens, and that greedy output is token-identical
to k = 0; the numbers themselves are for `make bench`, not for a test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SPECDEC_BIN = Path(sys.executable).with_name("specdec")
TIMEOUT_S = 600
MAX_NEW_TOKENS = 12  # a flag overrides --quick's size; 12 tokens are still several rounds of k = 4
SETS = ("grounded", "open")
CONFIGS = ("k0", "k4", "kdefault", "adaptive", "hf_target", "hf_assisted")
MEASURES = (
    "speedup",
    "vs_hf",
    "overhead_ms_p50",
    "tokens_per_s",
    "acceptance_rate",
    "mean_accepted_length",
    "per_position_acceptance",
    "target_passes_per_token",
    "itl_ms_p50",
    "itl_ms_p95",
    "draft_ms_per_round",
    "verify_ms_per_round",
    "bound",
    "memory",
    "identity",
)


def test_bench_quick_writes_json_and_plot(tmp_path: Path) -> None:
    out, png = tmp_path / "latest.json", tmp_path / "latest.png"
    cmd = [
        str(SPECDEC_BIN),
        "bench",
        "--quick",
        "--k",
        "4",
        "--max-new-tokens",
        str(MAX_NEW_TOKENS),
        "--threads",
        "1",
        "--llama-server-configs",
        "server",
        "--no-progress",
        "--out",
        str(out),
        "--plot",
        str(png),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "== grounded" in proc.stdout and "== open" in proc.stdout
    assert png.is_file() and png.stat().st_size > 10_000

    result = json.loads(out.read_text())
    for key in ("machine", "settings", "hf_settings", "memory", "verify_cost", "runs"):
        assert key in result, key
    assert result["settings"]["threads"]["target_service"] == 1
    assert result["settings"]["threads"]["hf_in_process"] == 1
    assert result["hf_settings"]["prompt_lookup_num_tokens"] > 0
    assert result["machine"]["cores"] >= 1 and result["machine"]["torch"]
    for s in SETS:
        for m in MEASURES:
            assert m in result[s], (s, m)
        for c in CONFIGS:
            assert result[s]["tokens_per_s"][c]["median"] > 0, (s, c)
            assert result[s]["vs_hf"][c]["median"] > 0, (s, c)
        assert result[s]["speedup"]["k0"]["median"] == pytest.approx(1.0)
        assert result[s]["mean_accepted_length"]["k4"] >= 1.0
        assert result[s]["overhead_ms_p50"]["k4"]["median"] >= 0
        assert result[s]["memory"]["target_kv_bytes_per_session"] > 0
        assert result[s]["memory"]["redis_bytes_per_session"] > 0
        for c, ident in result[s]["identity"].items():
            # greedy: identical to k = 0, or differing only at a near-tie of the target's logits
            assert all(d["near_tie"] for d in ident["differences"]), (s, c, ident)
    assert {r["tokens"] for r in result["runs"]} == {MAX_NEW_TOKENS}
    rss = result["memory"]["peak_rss_bytes"]
    assert rss["target"] > 100 * 2**20 and rss["orchestrator"] > 0
    assert result["memory"]["kv_bytes_per_token"]["target"] > 0
    assert result["verify_cost"]["ratio"]["1"] == pytest.approx(1.0)
    assert set(result["verify_cost"]["ratio"]) >= {"1", "5"}
    # the bound uses v(n) of the target as served (the default engine: llama.cpp on the GGUF), HF's beside it
    assert result["settings"]["engine"] == "llamacpp"
    assert result["settings"]["target_weight_layout"].startswith("llama.cpp Q4_1")
    assert result["settings"]["dtype"] == "Q4_1" and result["settings"]["hf_dtype"] == "float32"
    if "verify_cost_hf_layout" in result:
        assert result["verify_cost_hf_layout"]["ratio"]["1"] == pytest.approx(1.0)
    server = result["llama_server"]  # llama.cpp's own server, the one configuration asked for, or why not
    if "skipped" in server:
        assert "make llama-server" in server["skipped"], server
    else:
        assert set(server["configs"]) == {"server"}, server
        assert {len(t) for t in server["configs"]["server"]["tokens"].values()} == {MAX_NEW_TOKENS}, server
        assert set(result["identity_vs_llama_server"]) == set(CONFIGS), result["identity_vs_llama_server"]
