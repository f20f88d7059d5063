"""Are the tokens identical? Every configuration's token ids against our k = 0 (repeat 0); a difference
is classified as a near-tie or not by the target's top-2 logit gap at the first differing position."""

from __future__ import annotations

from typing import Any

from specdec.bench.plan import K0, Config, Prompt, RunRecord

TIE_EPSILON = 1e-4
TIE_ULPS = 2  # 16-bit dtypes: a top-2 gap within 2 units in the last place of the top logit is a tie


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def top2_gap(hf: Any, prompt_ids: list[int], prefix: list[int]) -> tuple[float, float]:
    """The target's top-2 logit gap after prompt + prefix (one in-process forward), and the tie
    threshold at that position: TIE_EPSILON in float32; in a 16-bit dtype, TIE_ULPS units in the
    last place of the top logit (a one-token and a k+1-token forward round differently there)."""
    import torch

    with torch.inference_mode():
        logits = hf.model(input_ids=torch.tensor([prompt_ids + prefix])).logits[0, -1]
    top = torch.topk(logits.float(), 2).values
    eps = TIE_EPSILON
    if logits.dtype in (torch.bfloat16, torch.float16):
        eps = max(eps, TIE_ULPS * torch.finfo(logits.dtype).eps * abs(float(top[0])))
    return float(top[0] - top[1]), eps


def identity_report(
    records: list[RunRecord], prompts: list[Prompt], configs: list[Config], hf: Any, gap: Any = None
) -> dict:
    """Per set and configuration: how many prompts give exactly the tokens of our k = 0 (repeat 0). `gap(prompt_ids,
    prefix)` gives the top-2 logit gap and tie threshold at a difference (default: the in-process HF model's)."""
    if gap is None and hf is not None:
        gap = lambda prompt_ids, prefix: top2_gap(hf, prompt_ids, prefix)  # noqa: E731
    by = {(r.set, r.prompt, r.config): r for r in records if r.repeat == 0}
    ids = {(p.set, p.id): p.ids for p in prompts}
    out: dict[str, Any] = {}
    for set_name in dict.fromkeys(p.set for p in prompts):
        per: dict[str, Any] = {}
        for cfg in configs:
            if cfg.name == K0:
                continue
            same, total, diffs = 0, 0, []
            for p in (p for p in prompts if p.set == set_name):
                ref, got = by.get((set_name, p.id, K0)), by.get((set_name, p.id, cfg.name))
                if ref is None or got is None:
                    continue
                total += 1
                pos = first_divergence(ref.tokens, got.tokens)
                if pos is None:
                    same += 1
                    continue
                logit_gap, eps = gap(ids[(set_name, p.id)], ref.tokens[:pos]) if gap is not None else (None, 0.0)
                diffs.append(
                    {
                        "prompt": p.id,
                        "position": pos,
                        "top2_logit_gap": logit_gap,
                        "tie_threshold": eps,
                        "near_tie": logit_gap is not None and logit_gap <= eps,
                    }
                )
            per[cfg.name] = {"identical": same, "prompts": total, "differences": diffs}
        out[set_name] = per
    return out
