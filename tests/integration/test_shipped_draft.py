"""The shipped trained draft for SmolLM2-135M-Instruct (embedded:smollm2-draft).

It loads through the ordinary model spec syntax, shares the target's tokenizer
fingerprint (Info), greedy speculative output with it equals the target alone, and its
mean accepted length on a few held-out chat prompts (never trained on) is what its report
measured. The full measurement (all 30 held-out prompts, 128 tokens each: minutes on 2 cores)
is `specdec distill`'s report (report.json next to the draft, checked here) and `make bench`.
"""

from __future__ import annotations

import json

import pytest
import torch

from specdec.distill.corpus import build_corpus
from specdec.distill.data import chat_ids
from specdec.distill.evaluate import decode
from specdec.models.draft_format import read_draft_config
from specdec.models.loader import load_causal_lm
from specdec.models.spec import EMBEDDED_DRAFTS, SHIPPED_DRAFTS_DIR, parse_model_spec
from specdec.v1 import orchestrator_pb2 as pb
from tests.fork_map import InBackground, fork_map
from tests.support import InProcessStack, target_greedy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SPEC = "embedded:smollm2-draft"
SHIPPED = SHIPPED_DRAFTS_DIR / EMBEDDED_DRAFTS["smollm2-draft"]
MAX_SIZE_BYTES = 20 * 1024 * 1024
IDENTITY_PROMPTS = 3
IDENTITY_TOKENS = 48
MEASURE_TOKENS = 128   # as the report: the few-prompt check reproduces its per-prompt rows
FLOOR_PROMPTS = 4      # the first held-out prompts: 396 tokens, mean accepted length 1.82 alone as all 30 (1.818)
#: The issue's floor for the mean accepted length at k = 4 (greedy, all 30 held-out chat prompts) is 2.0. The
#: shipped draft reaches it combined with prompt lookup (the `combined` kind: 2.037 in report.json) but not
#: alone (1.818). Greedy acceptance is deterministic up to near-ties: on the few prompts the draft alone repeats
#: the report's per-prompt rounds (68, 85, 8, 57 at 1 and 2 threads), and both kinds must hold their measured
#: value minus a margin.
ISSUE_FLOOR = 2.0
REPORT_MAL = 1.818
FEW_MAL = 396 / 218            # report.json's rows of the first FLOOR_PROMPTS prompts
COMBINED_FEW_MAL = 1.960      # measured: 396 tokens in 202 rounds, prompt lookup on a hit, the draft otherwise
MARGIN = 0.1
TIE_EPSILON = 1e-4


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


def _top2_gap(model, ids):
    with torch.inference_mode():
        top = torch.topk(model(torch.tensor([ids])).logits[0, -1], 2).values
    return float(top[0] - top[1])


def test_shares_tokenizer_and_greedy_output_equals_target(stack):
    target_info, draft_info = stack.target_bundle.info, stack.draft_bundle.info  # what Info reports
    assert draft_info["tokenizer_fingerprint"] == target_info["tokenizer_fingerprint"]
    assert draft_info["logits_width"] == target_info["logits_width"]
    assert draft_info["draft_kind"] == "model"
    model = load_causal_lm("embedded").model
    tok = stack.tokenizer
    eos = sorted(stack.deps.eos_ids)
    channel, stub = stack.stub()
    drafted = 0
    prompts = build_corpus().held_out[:IDENTITY_PROMPTS]
    prompt_ids = [chat_ids(tok, prompt) for prompt in prompts]
    # the target alone, computed by a fork of this process while the stack generates (tests/fork_map.py)
    with InBackground(lambda ids: target_greedy(model, ids, IDENTITY_TOKENS, eos), prompt_ids) as refs:
        responses = [stub.Generate(pb.GenerateRequest(messages=pb.ChatMessages(messages=[
            pb.ChatMessage(role="user", content=prompt)]), k=4, max_new_tokens=IDENTITY_TOKENS), timeout=300)
            for prompt in prompts]
        for prompt, ids, resp, want in zip(prompts, prompt_ids, responses, refs.results()):
            got = list(resp.token_ids)
            if got != want:  # only a near-tie between a batched and a one-token forward may differ
                j = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                assert _top2_gap(model, ids + want[:j]) < TIE_EPSILON, f"{prompt!r} diverged at {j}"
            drafted += resp.stats.draft_tokens
    channel.close()
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


def _mean_accepted_lengths(stack, kinds: tuple[str, ...], prompts: list[str], rounds_hint: list[int]) -> dict:
    """Greedy k = 4 rounds of the served engines over `prompts` (the report's own decode loop), per draft kind:
    {kind: (mean accepted length, rounds per prompt)}. The (kind, prompt) runs are split across forks of this
    process (tests/fork_map.py), dealt by the report's rounds per prompt."""
    target, eos = stack.target_bundle.engines["target"], set(stack.target_bundle.info["eos_token_ids"])
    items = [(kind, i) for kind in kinds for i in range(len(prompts))]
    prompt_ids = [chat_ids(stack.tokenizer, p) for p in prompts]   # here: a tokenizer does not survive a fork

    def run(item: tuple[str, int]) -> tuple[int, int]:
        kind, i = item
        out = decode(target, stack.draft_bundle.engines[kind], prompt_ids[i], 4, MEASURE_TOKENS, eos, f"floor-{kind}-{i}")
        return len(out["tokens"]), out["rounds"]

    done = dict(zip(items, fork_map(run, items, weights=[rounds_hint[i] for _, i in items])))
    result = {}
    for kind in kinds:
        tokens, rounds = zip(*(done[kind, i] for i in range(len(prompts))))
        result[kind] = (sum(tokens) / sum(rounds), list(rounds))
    return result


def test_held_out_mean_accepted_length_holds_on_a_few_prompts(stack):
    report = json.loads((SHIPPED / "report.json").read_text())
    prompts = build_corpus().held_out[:FLOOR_PROMPTS]
    assert [r["prompt"] for r in report["per_prompt"][:FLOOR_PROMPTS]] == prompts
    hint = [row["rounds"] for row in report["per_prompt"][:FLOOR_PROMPTS]]
    runs = _mean_accepted_lengths(stack, ("model", "combined"), prompts, hint)
    (alone, rounds), (both, _) = runs["model"], runs["combined"]
    print(f"\nheld-out x{FLOOR_PROMPTS}: mean accepted length {alone:.3f} alone (report rows {FEW_MAL:.3f}), "
          f"{both:.3f} combined; rounds per prompt {rounds}")
    assert alone >= FEW_MAL - MARGIN
    assert both >= COMBINED_FEW_MAL - MARGIN and both > alone
