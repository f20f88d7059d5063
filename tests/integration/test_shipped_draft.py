"""The shipped trained draft for SmolLM2-135M-Instruct (embedded:smollm2-draft).

It loads through the ordinary model spec syntax, shares the target's tokenizer
fingerprint (Info), greedy speculative output with it equals the target alone, and its
mean accepted length on a few held-out chat prompts (never trained on) is what its report
measured. The full measurement (all 30 held-out prompts, 128 tokens each: minutes on 2 cores)
is `specdec distill`'s report (report.json next to the draft, checked here) and `make bench`.
"""

from __future__ import annotations

import functools
import json

import pytest

from specdec.config import ModelServiceConfig
from specdec.distill.corpus import build_corpus
from specdec.distill.data import chat_ids
from specdec.distill.evaluate import decode
from specdec.engine.loading import load_draft, load_target
from specdec.models.draft_format import read_draft_config
from specdec.models.spec import EMBEDDED_DRAFTS, SHIPPED_DRAFTS_DIR, parse_model_spec
from specdec.v1 import orchestrator_pb2 as pb
from tests.llamacpp_support import LlamaCppReference
from tests.support import InProcessStack
from tests.worker_pool import lend, per_process, pool_map

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SPEC = "embedded:smollm2-draft"
SHIPPED = SHIPPED_DRAFTS_DIR / EMBEDDED_DRAFTS["smollm2-draft"]
MAX_SIZE_BYTES = 20 * 1024 * 1024
IDENTITY_PROMPTS = 3
IDENTITY_TOKENS = 48
MEASURE_TOKENS = 128  # as the report: the few-prompt check reproduces its per-prompt rows
FLOOR_PROMPTS = 4  # the first held-out prompts: 396 tokens, mean accepted length 1.82 alone as all 30 (1.818)
#: The issue's floor for the mean accepted length at k = 4 (greedy, all 30 held-out chat prompts) is 2.0. The
#: shipped draft reaches it combined with prompt lookup (the `combined` kind: 2.037 in report.json) but not
#: alone (1.818). Greedy acceptance is deterministic up to near-ties: on the few prompts the draft alone repeats
#: the report's per-prompt rounds (68, 85, 8, 57 at 1 and 2 threads), and both kinds must hold their measured
#: value minus a margin.
ISSUE_FLOOR = 2.0
REPORT_MAL = 1.818
FEW_MAL = 396 / 218  # report.json's rows of the first FLOOR_PROMPTS prompts
COMBINED_FEW_MAL = 1.960  # measured: 396 tokens in 202 rounds, prompt lookup on a hit, the draft otherwise
MARGIN = 0.1


def test_shipped_draft_is_small_and_names_its_target():
    config = read_draft_config(SHIPPED)
    assert config["target"] == "embedded"
    assert (SHIPPED / "model.safetensors").stat().st_size <= MAX_SIZE_BYTES
    assert (SHIPPED / "MODEL_CARD.md").is_file()
    assert parse_model_spec(SPEC).name == str(SHIPPED)


@pytest.fixture(scope="module")
def stack(redis_server):
    s = InProcessStack(target_model="embedded", draft_model=SPEC, redis_url=redis_server.url).start()
    yield s
    s.stop()


def test_shares_tokenizer_and_greedy_output_equals_target(stack):
    target_info, draft_info = stack.target_bundle.info, stack.draft_bundle.info  # what Info reports
    assert draft_info["tokenizer_fingerprint"] == target_info["tokenizer_fingerprint"]
    assert draft_info["logits_width"] == target_info["logits_width"]
    assert draft_info["draft_kind"] == "model"
    assert stack.target_bundle.engine == "llamacpp"  # the default engine for the embedded GGUF
    reference = LlamaCppReference("embedded", threads=1)  # llama.cpp's own decoding of it, alone
    tok = stack.tokenizer
    eos = sorted(stack.deps.eos_ids)
    channel, stub = stack.stub()
    drafted = 0
    for prompt in build_corpus().held_out[:IDENTITY_PROMPTS]:
        req = pb.GenerateRequest(
            messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=prompt)]),
            k=4,
            max_new_tokens=IDENTITY_TOKENS,
        )
        resp = stub.Generate(req, timeout=300)
        ids = chat_ids(tok, prompt)
        want = reference.greedy(ids, IDENTITY_TOKENS, eos)
        # only a near-tie between a multi-token verify and a one-token step may differ
        assert reference.divergence(ids, list(resp.token_ids), want) in ("", "tie"), prompt
        drafted += resp.stats.draft_tokens
    channel.close()
    reference.close()
    assert drafted > 0


def test_the_report_measured_all_held_out_prompts_and_the_floor():
    """The shipped draft's report.json (written by `specdec distill`) covers every held-out prompt and the
    combined kind reaches the issue's floor there."""
    report = json.loads((SHIPPED / "report.json").read_text())
    assert report["held_out_prompts"] == len(build_corpus().held_out) == len(report["per_prompt"])
    assert report["k"] == 4 and report["max_new_tokens"] == MEASURE_TOKENS and report["greedy"]
    assert report["all_outputs_identical"] and report["combined"]["all_outputs_identical"]
    assert report["mean_accepted_length"] == pytest.approx(REPORT_MAL, abs=1e-3)
    assert report["combined"]["mean_accepted_length"] >= ISSUE_FLOOR


SERVED = "shipped draft: served bundles"  # tests.worker_pool.per_process: the test lends its stack's


def _load_served() -> tuple:
    """The target and draft bundles as the stack's services load them (what a pool worker decodes with)."""
    target = load_target(ModelServiceConfig(role="target", model="embedded", threads=1, cache_budget_bytes=1 << 30))
    draft = load_draft(ModelServiceConfig(role="draft", model=SPEC, threads=1, cache_budget_bytes=1 << 30))
    return target, draft


def accepted_run(kind: str, item: tuple[int, list[int]]) -> tuple[int, int]:
    """(tokens, rounds) of greedy k = 4 rounds of the served engines over one prompt (the report's decode loop)."""
    i, prompt_ids = item
    target, draft = per_process(SERVED, _load_served)
    eos = set(target.info["eos_token_ids"])
    run = decode(target.engines["target"], draft.engines[kind], prompt_ids, 4, MEASURE_TOKENS, eos, f"floor-{kind}-{i}")
    return len(run["tokens"]), run["rounds"]


def _mean_accepted_length(kind: str, prompt_ids: list[list[int]], rounds_hint: list[int]) -> tuple[float, list[int]]:
    """Mean accepted length and rounds per prompt, the prompts shared by this process and a worker (dealt by the
    report's rounds per prompt)."""
    runs = pool_map(functools.partial(accepted_run, kind), list(enumerate(prompt_ids)), weights=rounds_hint)
    return sum(t for t, _ in runs) / sum(r for _, r in runs), [r for _, r in runs]


def test_held_out_mean_accepted_length_holds_on_a_few_prompts(stack):
    report = json.loads((SHIPPED / "report.json").read_text())
    prompts = build_corpus().held_out[:FLOOR_PROMPTS]
    assert [r["prompt"] for r in report["per_prompt"][:FLOOR_PROMPTS]] == prompts
    hint = [row["rounds"] for row in report["per_prompt"][:FLOOR_PROMPTS]]
    prompt_ids = [chat_ids(stack.tokenizer, prompt) for prompt in prompts]
    with lend(SERVED, (stack.target_bundle, stack.draft_bundle)):
        alone, rounds = _mean_accepted_length("model", prompt_ids, hint)
        both, _ = _mean_accepted_length("combined", prompt_ids, hint)
    print(
        f"\nheld-out x{FLOOR_PROMPTS}: mean accepted length {alone:.3f} alone (report rows {FEW_MAL:.3f}), "
        f"{both:.3f} combined; rounds per prompt {rounds}"
    )
    assert alone >= FEW_MAL - MARGIN
    assert both >= COMBINED_FEW_MAL - MARGIN and both > alone
