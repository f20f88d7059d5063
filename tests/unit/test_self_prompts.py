"""Self-written prompts (specdec/distill/self_prompts.py): the pre-query prefix, the keep rule, resume."""

from __future__ import annotations

import json

import torch

from specdec.distill.corpus import is_held_out
from specdec.distill.self_prompts import MIN_WORDS, generate_self_prompts, keep, pre_query_ids, read_self_prompts
from specdec.models.tiny import build_tiny_causal_lm
from tests.support import smollm2_tokenizer


def test_pre_query_prefix_is_the_template_up_to_the_user_message():
    tok = smollm2_tokenizer()
    prefix = pre_query_ids(tok)
    full = tok.apply_chat_template(
        [{"role": "user", "content": "Hello there"}], tokenize=True, add_generation_prompt=False, return_dict=False
    )
    assert prefix and list(full[: len(prefix)]) == prefix
    assert tok.decode(prefix).endswith("user\n")


def test_no_template_means_no_self_prompts():
    class Bare:
        chat_template = None

    assert pre_query_ids(Bare()) is None
    assert generate_self_prompts(None, Bare(), 10, None, eos=[0], seed=0, batch=4, progress=False) == []


def test_keep_rule_drops_short_repeated_and_held_out_messages():
    held = next(
        f"Tell me about topic number {i}." for i in range(1000) if is_held_out(f"Tell me about topic number {i}.")
    )
    fresh = next(
        f"Tell me about topic number {i}." for i in range(1000) if not is_held_out(f"Tell me about topic number {i}.")
    )
    assert keep(fresh, set())
    assert not keep(fresh, {fresh})
    assert not keep(held, set())
    assert not keep(" ".join(["word"] * (MIN_WORDS - 1)), set())


def test_rounds_resume_and_a_cut_line_is_redone(tmp_path):
    path = tmp_path / "self_prompts.jsonl"
    path.write_text(
        json.dumps({"round": 0, "prompts": ["a b c d"]})
        + "\n"
        + json.dumps({"round": 1, "prompts": ["e f g h", "i j k l"]})
        + "\n"
        + '{"round": 2, "pro'
    )
    prompts, rounds = read_self_prompts(path)
    assert prompts == ["a b c d", "e f g h", "i j k l"] and rounds == 2


def test_generation_is_seeded_resumable_and_leaves_the_global_rng_alone(tmp_path):
    tok = smollm2_tokenizer()
    model = build_tiny_causal_lm(tok, seed=0).eval()
    eos = list(range(1000, 3000))  # 4 % of the vocabulary ends a message, so a tiny random model ends some
    before = torch.random.get_rng_state()
    first = generate_self_prompts(model, tok, 3, tmp_path / "a.jsonl", eos=eos, seed=1, batch=8, progress=False)
    assert len(first) == 3 and torch.equal(before, torch.random.get_rng_state())
    again = generate_self_prompts(model, tok, 3, tmp_path / "b.jsonl", eos=eos, seed=1, batch=8, progress=False)
    assert first == again
    _, rounds = read_self_prompts(tmp_path / "a.jsonl")
    resumed = generate_self_prompts(model, tok, 3, tmp_path / "a.jsonl", eos=eos, seed=1, batch=8, progress=False)
    assert resumed == first and read_self_prompts(tmp_path / "a.jsonl")[1] == rounds  # nothing redone
