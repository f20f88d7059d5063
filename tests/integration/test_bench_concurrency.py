"""`specdec bench-concurrency`: batched and unbatched targets side by side, identical greedy output.

Small on purpose (c = 1 and 3, k = 3, 12 tokens, one repeat, the embedded SmolLM2 target, the prompt sets
taken open first, so the three sessions are o1, g1, o2: one long grounded prefill, not two; k = 0's
batches are the same code path with one token a session, and the unit and chunked-prefill tests cover them):
it checks the JSON's shape, that every session's tokens equal the same prompt run alone (also behind a second
batched target whose every forward runs on its event loop, --compare-env SPECDEC_LOOP_FORWARDS=1), that the batched target really put several sessions in
one forward pass while the unbatched one never did.
The throughput figures are for `make bench`, not for a test.
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


def test_bench_concurrency_small_run(tmp_path: Path) -> None:
    out = tmp_path / "concurrency.json"
    cmd = [
        str(SPECDEC_BIN),
        "bench-concurrency",
        "--concurrency",
        "1,3",
        "--k",
        "3",
        "--max-new-tokens",
        "12",
        "--repeats",
        "1",
        "--no-progress",
        "--compare-env",
        "SPECDEC_LOOP_FORWARDS=1",
        "--dtype",
        "float32",
        "--prompts",
        "open,grounded",
        "--out",
        str(out),
    ]  # torch fp32, as before the llama.cpp engine (exact batched rows)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(proc.stdout)
    result = json.loads(out.read_text())
    assert result["settings"]["max_batch"] == 8 and result["settings"]["threads"]["target_service"] == 1
    batched_means = []
    assert set(result["throughput"]) == {"k3"}
    for k_name in ("k3",):
        for stack in ("batched", "batched_env", "unbatched"):
            for c in ("1", "3"):
                cell = result["throughput"][k_name][stack][c]
                assert cell["tokens_per_s"] > 0, (k_name, stack, c)
                assert cell["mismatched_sessions"] == 0, (k_name, stack, c)
        assert result["throughput"][k_name]["unbatched"]["3"]["mean_batch"] == 1.0
        assert result["throughput"][k_name]["batched"]["1"]["mean_batch"] == 1.0
        batched_means.append(result["throughput"][k_name]["batched"]["3"]["mean_batch"])
        assert "batched_3_vs_1" in result["ratios"][k_name]
        assert set(result["ratios"][k_name]["batched_vs_env"]) == {"1", "3"}
        batched_means.append(result["throughput"][k_name]["batched_env"]["3"]["mean_batch"])
    assert result["settings"]["compare_env"] == {"SPECDEC_LOOP_FORWARDS": "1"}
    assert [p[0] for p in result["settings"]["prompts"]] == ["o", "g", "o"]  # the sets taken in turn
    assert max(batched_means) > 1.0, batched_means
    server = result["llama_server"]  # llama.cpp's own server on the same waves, or why not
    assert set(server.get("tokens_per_s", {})) == {"1", "3"} or "make llama-server" in server["skipped"], server
