"""Train the draft's own layers on the target's next-token distributions (embedding / head frozen).

Loss at every generated position t (the target produced token t+1 there):
  CE(draft restricted logits, target's argmax)  +  kl_weight * CE(draft, softmax(target top-k logits))
both over the FR-Spec head set (targets outside it are dropped / renormalised away).
AdamW, linear warmup then cosine decay, gradient clipping. Batches are packed from records
shuffled by a torch.Generator seeded with (seed, epoch), so a resumed run sees the same batches.
Checkpoints (layers + optimizer + step) go to DIR/checkpoint.pt every `checkpoint_every` steps.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from specdec.distill.data import Record, load_records
from specdec.models.draft_format import cfg_layers, init_layer_indices
from specdec.models.draft_model import build_draft, save_draft

CHECKPOINT = "checkpoint.pt"
WARMUP_STEPS = 30
MIN_LR_FRACTION = 0.1
WEIGHT_DECAY = 0.01
CLIP_NORM = 1.0


def choose_head_ids(records: list[Record], n: int, width: int, eos: list[int]) -> list[int]:
    """FR-Spec: the n most frequent tokens of the target's outputs (+ EOS), then prompt tokens, then low ids."""
    if n <= 0 or n >= width:
        return list(range(width))
    gen: Counter[int] = Counter()
    prompt: Counter[int] = Counter()
    for r in records:
        ids = r.ids.tolist()
        gen.update(ids[r.n_prompt :])
        gen.update(r.top_ids[:, 0].tolist())
        prompt.update(ids[: r.n_prompt])
    chosen: list[int] = []
    seen: set[int] = set()
    for t in [*eos, *(t for t, _ in gen.most_common()), *(t for t, _ in prompt.most_common()), *range(width)]:
        if t not in seen and 0 <= t < width:
            seen.add(t)
            chosen.append(t)
        if len(chosen) >= n:
            break
    return sorted(chosen)


def text_records(target: Any, tokenizer: Any, out: Path, args: Any, progress: bool) -> list[Record]:
    """`--text-tokens` of teacher-forced reference text (specdec/distill/corpus.py:reference_texts) as
    records labelled at every position by the target's top-k (one prefill each, cached in data/)."""
    from specdec.distill.corpus import reference_texts
    from specdec.distill.features import TEXT_FEATURES_FILE, extract_text_features

    tokens = getattr(args, "text_tokens", 0)
    data = extract_text_features(
        target,
        tokenizer,
        reference_texts(args.seed) if tokens else [],
        out / "data" / TEXT_FEATURES_FILE,
        tokens,
        progress=progress,
    )
    if data is None:
        return []
    out_records = []
    for start, n in zip(data.starts.tolist(), data.lengths.tolist()):
        out_records.append(
            Record(
                data.ids[start : start + n],
                1,
                data.top_ids[start : start + n - 1],
                data.top_logits[start : start + n - 1],
            )
        )
    return out_records


def plan_epoch(lengths: list[int], batch_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """Shuffle records (seeded per epoch) and pack them into batches of <= batch_tokens padded tokens."""
    g = torch.Generator().manual_seed(seed * 100_003 + epoch)
    order = torch.randperm(len(lengths), generator=g).tolist()
    batches: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        n = lengths[i]
        if cur and max(longest, n) * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        batches.append(cur)
    return batches


def make_batch(records: list[Record], idx: list[int], head_index: torch.Tensor, pad: int) -> dict[str, torch.Tensor]:
    """Right-padded inputs and, per loss position, the target's top-k over head indices."""
    seqs = [records[i].ids[:-1].long() for i in idx]  # the last token predicts nothing we store
    T = max(len(s) for s in seqs)
    input_ids = torch.full((len(idx), T), pad, dtype=torch.long)  # [B, T]
    mask = torch.zeros((len(idx), T), dtype=torch.long)  # [B, T]
    rows, cols, top_ids, top_logits = [], [], [], []
    for b, (i, s) in enumerate(zip(idx, seqs)):
        r = records[i]
        input_ids[b, : len(s)] = s
        mask[b, : len(s)] = 1
        n_gen = r.top_ids.shape[0]
        rows.append(torch.full((n_gen,), b, dtype=torch.long))
        cols.append(torch.arange(r.n_prompt - 1, r.n_prompt - 1 + n_gen))
        top_ids.append(r.top_ids.long())
        top_logits.append(r.top_logits.float())
    tid = torch.cat(top_ids)  # [P, K] vocabulary ids
    return dict(
        input_ids=input_ids,
        attention_mask=mask,
        rows=torch.cat(rows),
        cols=torch.cat(cols),
        head_top=head_index[tid],
        top_logits=torch.cat(top_logits),
    )


def loss_fn(
    logits: torch.Tensor, head_top: torch.Tensor, top_logits: torch.Tensor, kl_weight: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [P, N]; head_top [P, K] head indices (-1 = outside the head); top_logits [P, K].

    Returns (loss, top-1 agreement with the target's argmax)."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # [P, N]
    inside = head_top >= 0  # [P, K]
    hard = head_top[:, 0]
    ok = hard >= 0
    ce = -(logp[ok].gather(1, hard[ok, None]).squeeze(1)).mean() if ok.any() else logp.sum() * 0
    loss = ce
    if kl_weight > 0:
        soft = torch.softmax(top_logits.masked_fill(~inside, float("-inf")), dim=-1).nan_to_num(0.0)  # [P, K]
        soft_ce = -(soft * logp.gather(1, head_top.clamp(min=0))).sum(-1)  # [P]
        loss = loss + kl_weight * soft_ce[inside.any(-1)].mean()
    agree = (logits.argmax(-1) == hard).float().mean()
    return loss, agree


def batches_from(lengths: list[int], batch_tokens: int, seed: int, step: int) -> Iterator[tuple[int, list[int]]]:
    """(epoch, record indices) of every batch from global step `step` on, endlessly: the same batches a run
    that never stopped would have seen (epochs planned by plan_epoch), so a resumed run continues exactly."""
    epoch, position = 0, 0
    while True:
        plan = plan_epoch(lengths, batch_tokens, seed, epoch)
        for index in range(max(0, step - position), len(plan)):
            yield epoch, plan[index]
        position += len(plan)
        epoch += 1


def lr_at(step: int, total: int, base: float) -> float:
    if step < WARMUP_STEPS:
        return base * (step + 1) / WARMUP_STEPS
    t = (step - WARMUP_STEPS) / max(1, total - WARMUP_STEPS)
    return base * (MIN_LR_FRACTION + (1 - MIN_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def autocast_dtype(name: str) -> torch.dtype | None:
    """The dtype the draft's forward/backward autocasts to (None: full fp32). Master weights, the optimizer
    state and the loss stay fp32 either way."""
    return None if name == "float32" else getattr(torch, name)


def train_step(
    draft: Any,
    opt: Any,
    own: list[torch.Tensor],
    batch: dict[str, torch.Tensor],
    lr: float,
    kl_weight: float,
    dtype: torch.dtype | None,
) -> tuple[float, float]:
    """One optimizer step on one batch (see make_batch); returns (loss, top-1 agreement)."""
    with torch.autocast(batch["input_ids"].device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        hidden = draft.model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
        ).last_hidden_state  # [B, T, H]
        picked = hidden[batch["rows"], batch["cols"]]  # [P, H]
        logits = draft.restricted_logits(picked)  # [P, N]
    loss, agree = loss_fn(logits, batch["head_top"], batch["top_logits"], kl_weight)
    optimizer_step(opt, own, loss, lr)
    return loss.item(), agree.item()


def optimizer_step(opt: Any, params: Sequence[torch.Tensor], loss: torch.Tensor, lr: float) -> None:
    """Backward `loss`, clip the gradient norm of `params` to CLIP_NORM and step `opt` at learning rate `lr`."""
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, CLIP_NORM)
    opt.step()


def train(target: Any, tokenizer: Any, out: Path, args: Any, progress: bool = True) -> dict[str, Any]:
    """Train (or resume) and save the draft into `out`; returns the training summary."""
    from tqdm import tqdm

    from specdec.models.tokenizer_info import eos_token_ids

    records = load_records(out / "data")
    if not records:
        raise RuntimeError(f"no training data in {out / 'data'}")
    width = target.get_output_embeddings().weight.shape[0]
    eos = eos_token_ids(target, tokenizer)
    ckpt_path = out / CHECKPOINT
    ckpt = torch.load(ckpt_path, weights_only=False) if ckpt_path.exists() else None
    head_ids = ckpt["head_ids"] if ckpt else choose_head_ids(records, args.head_tokens, width, eos)
    extra = text_records(target, tokenizer, out, args, progress)
    text_tokens = sum(r.top_ids.shape[0] for r in extra)
    records = records + extra
    head_index = torch.full((width,), -1, dtype=torch.long)
    head_index[torch.tensor(head_ids)] = torch.arange(len(head_ids))
    for p in target.parameters():
        p.requires_grad_(False)
    draft = build_draft(target, args.layers, head_ids, init_from_target=True)
    own = list(draft.model.layers.parameters())
    device = own[0].device
    for p in own:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(own, lr=args.lr, weight_decay=WEIGHT_DECAY)
    step = 0
    if ckpt:
        draft.model.layers.load_state_dict(ckpt["layers"])
        opt.load_state_dict(ckpt["optimizer"])
        step = ckpt["step"]
    lengths = [len(r.ids) - 1 for r in records]
    gen_tokens = sum(r.top_ids.shape[0] for r in records)
    covered = sum(int((head_index[r.top_ids[:, 0].long()] >= 0).sum()) for r in records)
    print(
        f"train: {len(records)} sequences, {gen_tokens} target tokens, head {len(head_ids)} ids covers "
        f"{covered / gen_tokens:.1%} of the target's choices; {args.layers} layer(s) from target layers "
        f"{init_layer_indices(cfg_layers(target.config), args.layers)}; step {step}/{args.steps}",
        flush=True,
    )
    pad = eos[0]
    bar = tqdm(total=args.steps, initial=step, desc="train", unit="step", disable=not progress, mininterval=10)
    draft.train()
    ema_loss, ema_agree = (ckpt.get("ema_loss"), ckpt.get("ema_agree")) if ckpt else (None, None)
    started = time.time()
    epoch = 0
    for epoch, idx in batches_from(lengths, args.batch_tokens, args.seed, step):
        if step >= args.steps:
            break
        batch = {k: v.to(device) for k, v in make_batch(records, idx, head_index, pad).items()}
        lv, av = train_step(
            draft,
            opt,
            own,
            batch,
            lr_at(step, args.steps, args.lr),
            args.kl_weight,
            autocast_dtype(getattr(args, "train_dtype", "float32")),
        )
        step += 1
        ema_loss = lv if ema_loss is None else 0.95 * ema_loss + 0.05 * lv
        ema_agree = av if ema_agree is None else 0.95 * ema_agree + 0.05 * av
        bar.set_postfix(loss=f"{ema_loss:.3f}", top1=f"{ema_agree:.3f}", epoch=epoch)
        bar.update(1)
        if step % args.checkpoint_every == 0 or step == args.steps:
            _checkpoint(ckpt_path, draft, opt, step, head_ids, ema_loss, ema_agree)
            if not progress:
                print(f"step {step}/{args.steps} loss {ema_loss:.3f} top1 {ema_agree:.3f}", flush=True)
    bar.close()
    draft.eval()
    summary = {
        "steps": args.steps,
        "epochs_seen": epoch + 1,
        "sequences": len(records),
        "target_tokens": gen_tokens - text_tokens,
        "text_tokens": text_tokens,
        "head_coverage_train": round(covered / gen_tokens, 4),
        "final_loss_ema": ema_loss,
        "final_top1_agreement_ema": ema_agree,
        "seed": args.seed,
        "lr": args.lr,
        "batch_tokens": args.batch_tokens,
        "kl_weight": args.kl_weight,
        "train_dtype": getattr(args, "train_dtype", "float32"),
        "init_from_target_layers": init_layer_indices(cfg_layers(target.config), args.layers),
        "train_seconds_this_run": round(time.time() - started, 1),
    }
    save_draft(out, draft, args.target, meta={"training": summary})
    return summary


def _checkpoint(
    path: Path, draft: Any, opt: Any, step: int, head_ids: list[int], ema_loss: float | None, ema_agree: float | None
) -> None:
    """Layers, optimizer, step and the running loss/agreement (a resumed run reports them, not None)."""
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "layers": draft.model.layers.state_dict(),
            "optimizer": opt.state_dict(),
            "step": step,
            "head_ids": list(head_ids),
            "ema_loss": ema_loss,
            "ema_agree": ema_agree,
        },
        tmp,
    )
    os.replace(tmp, path)
