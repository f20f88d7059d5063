"""Held-out report: greedy speculative decoding at k with a draft vs the target alone, through specdec.engine.

The same engines the services run (TargetEngine + ModelDraft, per-session KV caches), in one
process, the round loop of the orchestrator reduced to greedy: propose k, verify once,
append the accepted tokens + the recovered/bonus token. Reports

* mean accepted length per round (emitted tokens / rounds, counting the recovered/bonus token),
* acceptance rate (accepted draft tokens / proposed draft tokens),
* draft step / target step: mean draft forward time per proposed token vs the target's
  mean one-token decode forward (and its (k+1)-token verify forward),
* end-to-end speed-up vs the target alone (k = 0 through the same engine),
* whether every speculative output equals the target-alone output.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from specdec.config import ModelServiceConfig
from specdec.core.sampling import SamplingConfig
from specdec.distill.data import chat_ids
from specdec.engine.draft import COMBINED, MODEL
from specdec.engine.loading import load_draft, load_target
from specdec.engine.types import ProposeInput, VerifyInput
from specdec.models.feature_draft import ARCHITECTURE as FEATURE_ARCHITECTURE

GREEDY = SamplingConfig()
CACHE_BYTES = 1 << 30
COMBINED_KEYS = (
    "mean_accepted_length",
    "acceptance_rate",
    "speedup_vs_target_alone",
    "all_outputs_identical",
    "identical_outputs",
    "rounds",
    "generated_tokens",
)


def decode(
    target: Any, draft: Any, prompt_ids: list[int], k: int, max_new: int, eos: set[int], session: str
) -> dict[str, Any]:
    """One greedy generation; k = 0 is the target alone."""
    ids = list(prompt_ids)
    out: list[int] = []
    rounds = proposed = accepted = 0
    feature = getattr(draft, "needs_target_hidden", False)
    rows, hidden_from = None, -1  # a feature draft's relay (orchestrator/features.py, without the wire)
    draft_ms: list[float] = []  # per proposed token, after the first round (no prefill)
    target_ms: list[float] = []  # per verify forward, after the first round
    started = time.perf_counter()
    while len(out) < max_new:
        kk = min(k, max_new - len(out) - 1)
        draft_ids: list[int] = []
        if kk > 0:
            prop = draft.propose(ProposeInput(session, ids, kk, GREEDY, target_hidden=rows))
            draft_ids, hidden_from = prop.draft_ids, prop.target_hidden_from
            if rounds > 0 and draft_ids:
                draft_ms.append(prop.stats.forward_ms / len(draft_ids))
        ver = target.verify(VerifyInput(session, ids, draft_ids, GREEDY, hidden_from=hidden_from if feature else -1))
        rows = ver.hidden
        if rounds > 0:
            target_ms.append(ver.stats.forward_ms)
        m = ver.result.num_accepted
        new = ver.result.emitted(draft_ids)
        rounds += 1
        stop = next((i for i, t in enumerate(new) if t in eos), None)
        if stop is not None:
            new = new[: stop + 1]
        new = new[: max_new - len(out)]
        # count only what was emitted, as the orchestrator's stats do (orchestrator/stats.py: count_emitted)
        proposed += len(draft_ids) if len(new) > m else len(new)
        accepted += min(m, len(new))
        out += new
        ids += new
        if stop is not None:
            break
    wall = time.perf_counter() - started
    target.runner.pool.release(session)
    runner = getattr(getattr(draft, "model", draft), "runner", None)  # a combined draft's model part holds the cache
    if runner is not None:
        runner.pool.release(session)
    return dict(
        tokens=out,
        rounds=rounds,
        proposed=proposed,
        accepted=accepted,
        wall_s=wall,
        draft_ms=draft_ms,
        target_ms=target_ms,
    )


def evaluate(
    draft_model: str,
    target_model: str,
    prompts: list[str],
    *,
    max_new: int = 128,
    k: int = 4,
    threads: int = 1,
    progress: bool = True,
    combined: bool = True,
) -> dict[str, Any]:
    """Run the held-out comparison; returns the report dict (the model draft's), with the same measures for
    the combined draft (prompt lookup on a hit, the model otherwise) under "combined" when asked and the
    draft offers it (token-only drafts)."""
    from tqdm import tqdm

    tb = load_target(
        ModelServiceConfig(role="target", model=target_model, threads=threads, cache_budget_bytes=CACHE_BYTES)
    )
    db = load_draft(
        ModelServiceConfig(
            role="draft", model=draft_model, draft_kind="model", threads=threads, cache_budget_bytes=CACHE_BYTES
        )
    )
    target = tb.engines["target"]
    kinds = [MODEL] + ([COMBINED] if combined and COMBINED in db.engines else [])
    tokenizer_ok = tb.info["tokenizer_fingerprint"] == db.info["tokenizer_fingerprint"]
    eos = set(tb.info["eos_token_ids"])
    from specdec.models.loader import load_tokenizer

    tok = load_tokenizer(target_model)
    rows: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    for i, prompt in enumerate(tqdm(prompts, desc="evaluate", unit="prompt", disable=not progress)):
        pids = chat_ids(tok, prompt)
        base = decode(target, None, pids, 0, max_new, eos, f"base-{i}")
        for kind in kinds:
            spec = decode(target, db.engines[kind], pids, k, max_new, eos, f"{kind}-{i}")
            rows[kind].append(
                dict(
                    prompt=prompt,
                    identical=spec["tokens"] == base["tokens"],
                    tokens=len(spec["tokens"]),
                    rounds=spec["rounds"],
                    proposed=spec["proposed"],
                    accepted=spec["accepted"],
                    mean_accepted_length=round(len(spec["tokens"]) / spec["rounds"], 3),
                    spec_s=round(spec["wall_s"], 3),
                    base_s=round(base["wall_s"], 3),
                    draft_ms=spec["draft_ms"],
                    verify_ms=spec["target_ms"],
                    target_step_ms=base["target_ms"],
                )
            )
    report = summarize(rows[MODEL], draft_model, target_model, k, max_new, tokenizer_ok)
    if COMBINED in rows:
        both = summarize(rows[COMBINED], draft_model, target_model, k, max_new, tokenizer_ok)
        report[COMBINED] = {key: both[key] for key in COMBINED_KEYS}
    return report


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def summarize(
    rows: list[dict[str, Any]], draft_model: str, target_model: str, k: int, max_new: int, tokenizer_ok: bool
) -> dict[str, Any]:
    tokens = sum(r["tokens"] for r in rows)
    rounds = sum(r["rounds"] for r in rows)
    proposed = sum(r["proposed"] for r in rows)
    accepted = sum(r["accepted"] for r in rows)
    draft_ms = _mean([x for r in rows for x in r["draft_ms"]])
    step_ms = _mean([x for r in rows for x in r["target_step_ms"]])
    verify_ms = _mean([x for r in rows for x in r["verify_ms"]])
    spec_s, base_s = sum(r["spec_s"] for r in rows), sum(r["base_s"] for r in rows)
    per_prompt = [{key: (round(_mean(v), 3) if isinstance(v, list) else v) for key, v in r.items()} for r in rows]
    return {
        "draft": draft_model,
        "target": target_model,
        "k": k,
        "max_new_tokens": max_new,
        "greedy": True,
        "held_out_prompts": len(rows),
        "generated_tokens": tokens,
        "rounds": rounds,
        "mean_accepted_length": round(tokens / max(1, rounds), 3),
        "acceptance_rate": round(accepted / max(1, proposed), 4),
        "draft_step_ms": round(draft_ms, 3),
        "target_step_ms": round(step_ms, 3),
        "target_verify_ms": round(verify_ms, 3),
        "draft_to_target_step_ratio": round(draft_ms / step_ms, 4) if step_ms == step_ms else None,
        "speedup_vs_target_alone": round(base_s / spec_s, 3) if spec_s else None,
        "all_outputs_identical": all(r["identical"] for r in rows),
        "identical_outputs": sum(r["identical"] for r in rows),
        "tokenizer_fingerprint_match": tokenizer_ok,
        "per_prompt": per_prompt,
    }


LAYERS_HEAD = """# {name}

A trained draft model for speculative decoding with **{target}** (specdec).

* Architecture: {layers} Llama decoder layer(s) of the target's shape (hidden {hidden}); the
  input embedding, final RMSNorm and LM head are the **target's own tensors**, loaded from the
  target at start and not stored here. Output head restricted (FR-Spec) to the {head} most
  frequent tokens of the target's own outputs (ids in `model.safetensors:head_token_ids`);
  other logits are -inf. Logits keep the target's full width ({width}).
* Stored: only the draft's layers, fp16 (`model.safetensors`, {size_mb:.1f} MB).
* Load: `--draft-kind model --draft-model DIR` (any model spec syntax for a directory works: a
  bare path or `local:DIR`; the copy shipped with specdec for SmolLM2 is `embedded:smollm2-draft`).
  The target named in `draft_config.json` is loaded first (cached conversion) and supplies the
  shared tensors and the tokenizer.

## Training (self-distillation)

`{command}`

* Data: the target's own continuations (max {max_new} new tokens, generated by a {data_dtype} copy of
  the target) of {train_prompts} training prompts (the chat prompts in `specdec/distill/prompts.jsonl`
  minus a fixed 10 % held out by hash, prompts built from Python standard-library docstrings) and
  {self_prompts} prompts the target wrote itself from its bare chat template (Magpie; held-out texts
  excluded); greedy for every prompt plus {sampled} sampled (T = 0.8) continuation(s) per shipped chat
  prompt and {self_sampled} per self-written prompt; the target's top-8 logits stored at every generated
  position. {target_tokens} target tokens.
* Objective: cross-entropy to the target's argmax + {kl_weight} x cross-entropy to the softmax of its top-8
  logits, over the restricted head. Layers initialised from target layer(s) {init}; AdamW lr {lr},
  {steps} steps of ~{batch_tokens} tokens, {train_mode}, seed {seed}.
* Wall time on a shared 2-core CPU ({threads} torch thread(s)): self-written prompts {prompts_s:.0f} s, data
  {data_s:.0f} s, training {train_s:.0f} s, report {eval_s:.0f} s.

"""


FEATURE_HEAD = """# {name}

A trained **feature draft** (EAGLE-style) for speculative decoding with **{target}** (specdec).

* Architecture: fc([embed(x_(j+1)); f_j]) -> {layers} Llama decoder layer(s) of the target's shape (hidden
  {hidden}) -> its own RMSNorm = a prediction of the target's next final hidden state, scored by the
  **target's own LM head** restricted (FR-Spec) to the {head} most frequent tokens of the target's
  outputs; f_j is the target's final normed hidden state, which the target returns with each Verify
  (the orchestrator relays it to the draft: `specdec/engine/feature.py`, `orchestrator/features.py`).
  The target must keep its hidden states (`SPECDEC_KEEP_HIDDEN`, on by default). Logits keep the
  target's full width ({width}).
* Stored: fc, the layer(s) and the norm, fp16 (`model.safetensors`, {size_mb:.1f} MB); the embedding and
  LM head are the target's, loaded from it at start.
* Load: `--draft-kind model --draft-model DIR` (any model spec syntax for a directory works).

## Training (self-distillation on the target's hidden states)

`{command}`

* Data: the target's own continuations (max {max_new} new tokens) of {train_prompts} training prompts
  and {self_prompts} prompts the target wrote itself (greedy + {sampled} sampled per shipped chat prompt,
  {target_tokens} generated tokens) plus {text_tokens}
  teacher-forced tokens of reference text (standard-library docstrings, package descriptions) framed as
  chat answers; one target
  prefill per sequence gives f_j and the target's top-8 logits at every position.
* Objective, with training-time test (depth {depth}: step d is fed step d-1's predicted feature and
  attends exactly as at inference): per depth, CE to the target's argmax + {kl_weight} x CE to its
  top-8 distribution + {feature_weight} x smooth-L1 to the target's feature, weights 0.8^(d-1). AdamW
  lr {lr}, {steps} steps of ~{batch_tokens} tokens, bf16 autocast, seed {seed}.
* Wall time on a shared 2-core CPU: data {data_s:.0f} s, features + training {train_s:.0f} s, report {eval_s:.0f} s.

"""


MEASURED = """## Measured on {held_out} held-out chat prompts (never trained on), greedy, k = {k}

| metric | value |
|---|---|
| mean accepted length per round (incl. recovered/bonus token) | {mal} |
| acceptance rate (accepted / proposed draft tokens) | {acc} |
| draft step / target step (one-token forwards) | {ratio} ({draft_ms} ms / {step_ms} ms) |
| end-to-end speed-up vs the target alone (same engine, in-process) | {speedup}x |
| speculative output identical to the target alone | {identical}/{held_out} |
| combined draft (prompt lookup on a hit, else this draft): mean accepted length | {combined_mal} |
| combined draft: end-to-end speed-up vs the target alone | {combined_speedup} |

Numbers from `report.json` (written by `specdec distill`); the draft step is its forward time per
proposed token (a feature draft's includes catching up on the round's accepted positions).
Training-set top-1 agreement with the target at the end of training: {train_top1}. {verdict}
"""
FLOOR = 2.0


def _verdict(report: dict[str, Any]) -> str:
    """Whether the draft (alone, or combined with prompt lookup) reaches FLOOR tokens per round at the report's k."""
    alone = report["mean_accepted_length"] >= FLOOR
    combined = report.get(COMBINED, {}).get("mean_accepted_length", 0.0) >= FLOOR
    if alone:
        return f"It reaches the issue's floor of {FLOOR} tokens per round at k = {report['k']}."
    if combined:
        return (
            f"Alone it does NOT reach the issue's floor of {FLOOR} tokens per round at k = {report['k']}; combined "
            f"with prompt lookup (draft kind `combined`) it does."
        )
    return f"It does NOT reach the issue's floor of {FLOOR} tokens per round at k = {report['k']}, alone or combined."


def _times(value: float | None) -> str:
    return "n/a" if value is None else f"{value}x"


def update_card(out: Path, report: dict[str, Any]) -> None:
    """Write MODEL_CARD.md from draft_config.json + report.json."""
    import json

    cfg = json.loads((out / "draft_config.json").read_text())
    tr = cfg.get("training", {})
    t = report.get("training", {})
    a = t.get("args", {})
    sec = t.get("seconds", {})
    feature = cfg.get("architecture") == FEATURE_ARCHITECTURE
    arch = (
        f"--arch eagle --depth {a.get('depth')} --feature-weight {a.get('feature_weight')} --text-tokens "
        f"{a.get('text_tokens')}"
        if feature
        else f"--arch layers --layers {a.get('layers')}"
    )
    cmd = (
        f"specdec distill --target {a.get('target')} --out DIR {arch} --head-tokens "
        f"{a.get('head_tokens')} --steps {a.get('steps')} --max-new-tokens {a.get('max_new_tokens')} "
        f"--variants {a.get('variants')} --self-prompts {a.get('self_prompts', 0)} --self-variants "
        f"{a.get('self_variants', 1)} --train-dtype {a.get('train_dtype', 'float32')} --data-dtype "
        f"{a.get('data_dtype', 'float32')} --docstrings {a.get('docstrings')} --kl-weight {a.get('kl_weight')} "
        f"--lr {a.get('lr')} --batch-tokens {a.get('batch_tokens')} --seed {a.get('seed')}"
    )
    top1 = (
        tr.get("final_top1_agreement_ema_per_depth") if feature else round(tr.get("final_top1_agreement_ema") or 0, 3)
    )
    text = ((FEATURE_HEAD if feature else LAYERS_HEAD) + MEASURED).format(
        name=out.name,
        target=cfg["target"],
        layers=cfg["layers"],
        hidden=cfg["hidden_size"],
        head=cfg["head_tokens"],
        width=cfg["logits_width"],
        size_mb=(out / "model.safetensors").stat().st_size / 1e6,
        command=cmd,
        max_new=a.get("max_new_tokens"),
        train_prompts=t.get("train_prompts"),
        sampled=max(0, (a.get("variants") or 1) - 1),
        target_tokens=tr.get("target_tokens"),
        text_tokens=tr.get("text_tokens"),
        depth=a.get("depth"),
        feature_weight=a.get("feature_weight"),
        kl_weight=a.get("kl_weight"),
        init=tr.get("init_from_target_layers"),
        lr=a.get("lr"),
        steps=a.get("steps"),
        batch_tokens=a.get("batch_tokens"),
        seed=a.get("seed"),
        data_s=sec.get("data", 0),
        prompts_s=sec.get("self_prompts", 0),
        threads=a.get("threads", 1),
        data_dtype=a.get("data_dtype", "float32"),
        self_prompts=t.get("self_prompts", 0),
        self_sampled=max(0, (a.get("self_variants") or 1) - 1),
        train_mode=(
            "fp32"
            if a.get("train_dtype", "float32") == "float32"
            else f"{a['train_dtype']} autocast (fp32 master weights)"
        ),
        train_s=sec.get("train", 0),
        eval_s=sec.get("eval", 0),
        held_out=report["held_out_prompts"],
        k=report["k"],
        mal=report["mean_accepted_length"],
        acc=report["acceptance_rate"],
        ratio=report["draft_to_target_step_ratio"],
        draft_ms=report["draft_step_ms"],
        step_ms=report["target_step_ms"],
        speedup=report["speedup_vs_target_alone"],
        identical=report["identical_outputs"],
        train_top1=top1,
        combined_mal=report.get(COMBINED, {}).get("mean_accepted_length", "n/a (feature draft)"),
        combined_speedup=_times(report.get(COMBINED, {}).get("speedup_vs_target_alone")),
        verdict=_verdict(report),
    )
    (out / "MODEL_CARD.md").write_text(text)
