"""`specdec distill` end to end on a tiny target, in seconds; the result loads in the draft service
and greedy speculative output with it equals the target alone."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from specdec.cli import main
from specdec.config import ModelServiceConfig
from specdec.distill.corpus import is_held_out
from specdec.engine.loading import load_draft
from specdec.models.draft_format import is_draft_dir
from specdec.v1 import orchestrator_pb2 as pb
from tests.prompts import IDENTITY_PROMPTS
from tests.support import InProcessStack, make_tiny_pair, target_greedy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CANDIDATES = [f"Tell me about topic number {i}." for i in range(200)]


def _prompts() -> list[str]:
    held = [p for p in CANDIDATES if is_held_out(p)][:2]
    train = [p for p in CANDIDATES if not is_held_out(p)][:10]
    return train + held


ARCH_ARGS = {"eagle": ["--arch", "eagle", "--depth", "2", "--text-tokens", "2000"], "layers": ["--arch", "layers"]}
# Sized for the suite (each fixture well under a minute on 2 cores): the tiny target rarely ends a
# self-written message, so self-prompt rounds run to their limit (4 rounds of 2 x --data-batch messages).
COMMON_ARGS = [
    "--docstrings",
    "0",
    "--variants",
    "2",
    "--self-prompts",
    "2",
    "--data-batch",
    "4",
    "--layers",
    "1",
    "--head-tokens",
    "3000",
    "--steps",
    "6",
    "--batch-tokens",
    "256",
    "--checkpoint-every",
    "3",
    "--max-new-tokens",
    "8",
    "--eval-max-new-tokens",
    "8",
    "--quiet",
]


@pytest.fixture(scope="module")
def data_stage(tmp_path_factory):
    """The data stage once (a fresh run, --stop-after data): both architectures train on the same data."""
    root = tmp_path_factory.mktemp("distill-data")
    target_dir, _ = make_tiny_pair(root / "pair", IDENTITY_PROMPTS)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in _prompts()))
    out = root / "data-run"
    assert (
        main(
            [
                "distill",
                "--target",
                str(target_dir),
                "--out",
                str(out),
                "--prompts",
                str(prompts),
                *COMMON_ARGS,
                "--stop-after",
                "data",
            ]
        )
        == 0
    )
    return target_dir, prompts, out / "data"


@pytest.fixture(scope="module", params=sorted(ARCH_ARGS))
def distilled(data_stage, tmp_path_factory, request):
    """Train and report with the shared data, resumed in a new output directory (the data stage finds its
    chunks and self-written prompts complete and generates nothing)."""
    target_dir, prompts, data = data_stage
    out = tmp_path_factory.mktemp(f"distill-{request.param}") / "draft"
    shutil.copytree(data, out / "data")
    argv = [
        "distill",
        "--target",
        str(target_dir),
        "--out",
        str(out),
        "--prompts",
        str(prompts),
        *COMMON_ARGS,
        *ARCH_ARGS[request.param],
    ]
    chunks = {p.name: p.stat().st_mtime_ns for p in (out / "data").glob("chunk-*.pt")}
    assert main(argv + ["--resume"]) == 0
    assert {p.name: p.stat().st_mtime_ns for p in (out / "data").glob("chunk-*.pt")} == chunks  # reused as is
    return target_dir, out, argv, request.param


def test_distill_writes_a_draft_and_a_report(distilled):
    _, out, argv, arch = distilled
    assert is_draft_dir(out)
    report = json.loads((out / "report.json").read_text())
    assert report["held_out_prompts"] == 2
    assert report["all_outputs_identical"] is True
    assert report["tokenizer_fingerprint_match"] is True
    assert report["mean_accepted_length"] >= 1.0
    assert 0.0 <= report["acceptance_rate"] <= 1.0
    assert (out / "MODEL_CARD.md").is_file()
    assert len(list((out / "data").glob("chunk-*.pt"))) >= 1
    assert (out / "data" / "self_prompts.jsonl").is_file()  # rounds recorded even when few messages ended
    config = json.loads((out / "draft_config.json").read_text())
    assert config["layers"] == 1 and config["head_tokens"] == 3000 and config["training"]["steps"] == 6
    assert config["architecture"] == ("eagle" if arch == "eagle" else "llama")
    if arch == "eagle":
        assert config["training"]["text_tokens"] >= 2000 and (out / "data" / "features.pt").is_file()
    # a second run without --resume refuses; with --resume everything is already done and is reused
    assert main(argv) == 2
    assert main(argv + ["--resume"]) == 0
    if arch == "layers":  # a resumed run still reports what training measured
        assert json.loads((out / "draft_config.json").read_text())["training"]["final_top1_agreement_ema"] is not None


def test_distilled_draft_loads_and_greedy_output_equals_target(distilled, redis_server):
    target_dir, out, _, arch = distilled
    bundle = load_draft(ModelServiceConfig(role="draft", model=str(out), draft_kind="model"))
    assert bundle.default_kind == "model"
    assert bundle.info["logits_width"] == 49152
    assert bool(bundle.info.get("needs_target_hidden")) == (arch == "eagle")
    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    stack = InProcessStack(target_model=str(target_dir), draft_model=f"local:{out}", redis_url=redis_server.url).start()
    try:
        channel, stub = stack.stub()
        eos = sorted(stack.deps.eos_ids)
        drafted = 0
        for prompt in IDENTITY_PROMPTS[:6]:
            resp = stub.Generate(pb.GenerateRequest(prompt=prompt, k=4, max_new_tokens=16), timeout=120)
            want = target_greedy(model, stack.tokenizer.encode(prompt), 16, eos)
            assert list(resp.token_ids) == want, prompt
            drafted += resp.stats.draft_tokens
        channel.close()
        assert drafted > 0
    finally:
        stack.stop()
