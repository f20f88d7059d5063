"""Prompts the target writes itself (Magpie, Xu et al. 2024): an instruction-tuned model given only
its chat template up to where a user's message begins continues with a plausible user message.

That is an unlimited, offline source of chat prompts in the target's own distribution; the data
stage then answers them like any other training prompt. Rounds are seeded by (seed, round) and
appended to DIR/data/self_prompts.jsonl one line per round, so an interrupted run resumes where
it stopped and a rerun with the same seed writes the same prompts. A message is kept when it
ended (the target emitted EOS within PROMPT_MAX_TOKENS), has at least MIN_WORDS words, is new, and
is not held out (the corpus's hash rule: a generated prompt equal to a held-out one is dropped).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from specdec.distill.corpus import is_held_out

SELF_PROMPTS_FILE = "self_prompts.jsonl"
PROMPT_TEMPERATURE = 1.0
PROMPT_TOP_P = 0.95
PROMPT_MAX_TOKENS = 40
MIN_WORDS = 4
MAX_ROUNDS_PER_BATCH_NEEDED = 4  # give up after 4x the rounds that n prompts would need at 100 % yield
BATCH_FACTOR = 2  # messages are short: sample twice the answer stage's batch per round
_SENTINEL = "\x00specdec-user-message\x00"


def pre_query_ids(tokenizer: Any) -> list[int] | None:
    """The chat template rendered up to where the user's message begins (None: no usable template)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": _SENTINEL}], tokenize=False, add_generation_prompt=False
    )
    if _SENTINEL not in text:
        return None
    return list(tokenizer(text.split(_SENTINEL)[0], add_special_tokens=False)["input_ids"])


def read_self_prompts(path: Path) -> tuple[list[str], int]:
    """(prompts kept so far, rounds done) from DIR/data/self_prompts.jsonl."""
    prompts: list[str] = []
    rounds = 0
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by an interruption: that round runs again
                continue
            prompts += row["prompts"]
            rounds = max(rounds, int(row["round"]) + 1)
    return prompts, rounds


def keep(text: str, seen: set[str]) -> bool:
    """A generated user message worth answering (see the module docstring)."""
    return len(text.split()) >= MIN_WORDS and text not in seen and not is_held_out(text)


@torch.inference_mode()
def _sample_round(
    model: Any, tokenizer: Any, prefix: list[int], batch: int, eos: list[int], seed: int, round_index: int
) -> list[str]:
    """One batch of user messages sampled after `prefix`; only those that ended with EOS."""
    x = torch.tensor([prefix] * batch, dtype=torch.long, device=model.device)  # [B, T]
    with torch.random.fork_rng(devices=[]):  # generate() samples from the global RNG; keep it untouched
        torch.manual_seed(seed * 1_000_003 + round_index)
        out = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            do_sample=True,
            temperature=PROMPT_TEMPERATURE,
            top_p=PROMPT_TOP_P,
            top_k=0,
            max_new_tokens=PROMPT_MAX_TOKENS,
            eos_token_id=eos,
            pad_token_id=eos[0],
        )
    texts = []
    for row in out[:, len(prefix) :].tolist():
        end = next((j for j, t in enumerate(row) if t in eos), None)
        if end is not None:
            texts.append(tokenizer.decode(row[:end], skip_special_tokens=True).strip())
    return texts


def generate_self_prompts(
    model: Any, tokenizer: Any, n: int, path: Path, *, eos: list[int], seed: int, batch: int, progress: bool = True
) -> list[str]:
    """Up to `n` user prompts written by the target, BATCH_FACTOR x `batch` sampled per round (resumable;
    see the module docstring)."""
    from tqdm import tqdm

    batch *= BATCH_FACTOR
    prefix = pre_query_ids(tokenizer) if n > 0 else None
    if prefix is None:
        return []
    prompts, rounds = read_self_prompts(path)
    seen = set(prompts)
    limit = MAX_ROUNDS_PER_BATCH_NEEDED * max(1, -(-n // batch))
    bar = tqdm(
        total=n, initial=min(n, len(prompts)), desc="self-prompts", unit="prompt", disable=not progress, mininterval=5
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    while len(prompts) < n and rounds < limit:
        new = []
        for text in _sample_round(model, tokenizer, prefix, batch, eos, seed, rounds):
            if keep(text, seen):
                seen.add(text)
                new.append(text)
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"round": rounds, "prompts": new}, ensure_ascii=False) + "\n")
        prompts += new
        rounds += 1
        bar.update(min(len(new), max(0, n - bar.n)))
    bar.close()
    return prompts[:n]
