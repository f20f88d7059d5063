"""Train a feature (EAGLE-style) draft on the target's own hidden states, with training-time test.

Data: for every training sequence, one target prefill gives f_j (the target's final normed
hidden state) and its top-k logits at EVERY position (`extract_features`). The draft's input at
position j pairs x_{j+1} with f_j (specdec/models/feature_draft.py).

Training-time test (as EAGLE-3 / HASS): at inference, draft step i >= 2 is fed the draft's own
predicted feature, and attends to real-feature positions plus its own earlier predicted steps.
`unrolled_features` reproduces exactly that for every base position at once: depth d's query at
base r sits at position r+d-1, is fed depth d-1's prediction, and attends to depth-1 keys at
bases <= r plus the keys of depths 2..d at base r (never to another base's predictions).

Loss per depth d (weight DEPTH_DECAY^(d-1)), at position r+d (the target's choice for x_{r+d+1}):
  CE(draft logits, target argmax) + kl_weight * CE(draft, softmax(target top-k))
  + feature_weight * smooth-L1(f^, f)
over the FR-Spec head set (specdec/distill/train.py's loss).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, apply_rotary_pos_emb, repeat_kv

from specdec.distill.data import TOP_K
from specdec.distill.features import (
    FEATURES_FILE,
    TEXT_FEATURES_FILE,
    FeatureData,
    concat,
    extract_features,
    extract_text_features,
)
from specdec.distill.train import WEIGHT_DECAY, batches_from, choose_head_ids, loss_fn, lr_at, optimizer_step
from specdec.models.feature_draft import FeatureDraftModel, feature_config_for

CHECKPOINT = "feature_checkpoint.pt"
DEPTH_DECAY = 0.8


def _project(
    attn: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [B, n, H] -> q [B, h, n, d], k and v [B, h, n, d] (rotated, kv heads repeated)."""
    B, n, _ = x.shape
    shape = (B, n, -1, attn.head_dim)
    q = attn.q_proj(x).view(shape).transpose(1, 2)
    k = attn.k_proj(x).view(shape).transpose(1, 2)
    v = attn.v_proj(x).view(shape).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    return q, repeat_kv(k, attn.num_key_value_groups), repeat_kv(v, attn.num_key_value_groups)


def _attend_unrolled(
    q: torch.Tensor, k1: torch.Tensor, v1: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor], scale: float
) -> torch.Tensor:
    """Depth >= 2 attention: causal over depth-1 keys, plus each later depth's key at the same base.

    q, k1, v1: [B, h, n, d]; ks, vs: depths 2..d, each [B, h, n, d]. Returns [B, h, n, d]."""
    n = q.shape[2]
    s1 = (q @ k1.transpose(-1, -2)) * scale  # [B, h, n, n]
    s1 = s1.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    sd = torch.stack([(q * k).sum(-1) for k in ks], dim=-1) * scale  # [B, h, n, D-1]
    w = torch.softmax(torch.cat([s1, sd], dim=-1).float(), dim=-1).to(q.dtype)
    out = w[..., :n] @ v1
    for i, v in enumerate(vs):
        out = out + w[..., n + i, None] * v
    return out


def unrolled_features(
    draft: FeatureDraftModel, ids: torch.Tensor, feats: torch.Tensor, depth: int
) -> list[torch.Tensor]:
    """Predicted features of depths 1..depth for every base r in 0..T-2 (training-time test).

    ids [B, T] tokens; feats [B, T, H] the target's f. Returns `depth` tensors [B, T-1, H];
    entry r of depth d predicts f_{r+d} (and through the head, x_{r+d+1}).
    """
    B, T = ids.shape
    n = T - 1
    base = torch.arange(n, device=ids.device)
    feats_in = feats[:, :n]
    first: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer: depth-1 keys and values
    later: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = [([], []) for _ in draft.layers]
    outs = []
    for d in range(1, depth + 1):
        x = draft.inputs(ids[:, (base + d).clamp(max=T - 1)], feats_in)  # [B, n, H]
        cos, sin = draft.model.rotary_emb(x, (base + d - 1).unsqueeze(0).expand(B, n))
        for i, layer in enumerate(draft.layers):
            assert isinstance(layer, LlamaDecoderLayer), "a feature draft stacks Llama decoder layers"
            attn = layer.self_attn
            q, k, v = _project(attn, layer.input_layernorm(x), cos, sin)
            if d == 1:
                first.append((k, v))
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=attn.scaling)
            else:
                later[i][0].append(k)
                later[i][1].append(v)
                a = _attend_unrolled(q, *first[i], *later[i], attn.scaling)
            x = x + attn.o_proj(a.transpose(1, 2).reshape(B, n, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        feats_in = draft.model.norm(x)
        outs.append(feats_in)
    return outs


@dataclass
class FeatureTrainConfig:
    steps: int = 1500
    batch_tokens: int = 2048
    lr: float = 1e-3
    depth: int = 3  # unrolled draft steps per position (training-time test)
    layers: int = 1  # decoder layers of the draft
    kl_weight: float = 1.0
    feature_weight: float = 0.2
    head_tokens: int = 8192
    seed: int = 0
    checkpoint_every: int = 100
    bf16: bool = True  # bf16 autocast (fp32 master weights): ~2x on CPUs with native bf16
    log_every: int = 25


def make_batch(data: FeatureData, idx: list[int], head_index: torch.Tensor, pad: int) -> dict[str, torch.Tensor]:
    """Right-padded ids [B, T], feats [B, T, H], head-index top-k [B, T, K], top logits, valid mask [B, T]."""
    T = int(max(data.lengths[i] for i in idx))
    B = len(idx)
    ids = torch.full((B, T), pad, dtype=torch.long)
    feats = torch.zeros((B, T, data.feats.shape[1]), dtype=torch.float32)
    top = torch.full((B, T, TOP_K), -1, dtype=torch.long)
    logits = torch.zeros((B, T, TOP_K), dtype=torch.float32)
    valid = torch.zeros((B, T), dtype=torch.bool)
    for b, i in enumerate(idx):
        s, n = int(data.starts[i]), int(data.lengths[i])
        ids[b, :n] = data.ids[s : s + n]
        feats[b, :n] = data.feats[s : s + n].float()
        top[b, :n] = head_index[data.top_ids[s : s + n].long()]
        logits[b, :n] = data.top_logits[s : s + n].float()
        valid[b, :n] = True
    return dict(ids=ids, feats=feats, head_top=top, top_logits=logits, valid=valid)


def batch_loss(
    draft: FeatureDraftModel, batch: dict[str, torch.Tensor], cfg: FeatureTrainConfig
) -> tuple[torch.Tensor, list[float]]:
    """Weighted loss over depths; returns (loss, top-1 agreement per depth)."""
    outs = unrolled_features(draft, batch["ids"], batch["feats"], cfg.depth)
    T = batch["ids"].shape[1]
    total: torch.Tensor | float = 0.0
    agree: list[float] = []
    for d, pred in enumerate(outs, start=1):
        n = T - 1 - (d - 1)  # bases whose label position r+d is inside the sequence
        pred = pred[:, :n]  # [B, n, H]
        ok = batch["valid"][:, d : d + n]  # [B, n]
        target_f = batch["feats"][:, d : d + n][ok]  # [P, H]
        p = pred[ok]
        loss, top1 = loss_fn(
            draft.restricted_logits(p),
            batch["head_top"][:, d : d + n][ok],
            batch["top_logits"][:, d : d + n][ok],
            cfg.kl_weight,
        )
        loss = loss + cfg.feature_weight * F.smooth_l1_loss(p, target_f)
        total = total + DEPTH_DECAY ** (d - 1) * loss
        agree.append(float(top1))
    assert isinstance(total, torch.Tensor), "depth >= 1 adds a loss"
    return total, agree


def train_feature_draft(
    target: Any,
    data: FeatureData,
    head_ids: list[int],
    out: Path,
    cfg: FeatureTrainConfig,
    pad: int,
    progress: bool = True,
) -> tuple[FeatureDraftModel, dict[str, Any]]:
    """Train (or resume from out/feature_checkpoint.pt) a feature draft; returns it and a summary."""
    from tqdm import tqdm

    width = target.get_output_embeddings().weight.shape[0]
    head_index = torch.full((width,), -1, dtype=torch.long)
    head_index[torch.tensor(head_ids)] = torch.arange(len(head_ids))
    for p in target.parameters():
        p.requires_grad_(False)
    draft = FeatureDraftModel(
        feature_config_for(target.config, cfg.layers),
        target.get_input_embeddings(),
        target.get_output_embeddings(),
        head_ids,
    ).to(target.dtype)
    draft.init_from_target(target)
    own = [p for n, p in draft.named_parameters()]
    opt = torch.optim.AdamW(own, lr=cfg.lr, weight_decay=WEIGHT_DECAY)
    ckpt_path, step = out / CHECKPOINT, 0
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path, weights_only=False)
        draft.load_state_dict(ckpt["draft"], strict=False)
        opt.load_state_dict(ckpt["optimizer"])
        step = ckpt["step"]
    bar = tqdm(total=cfg.steps, initial=step, desc="train", unit="step", disable=not progress, mininterval=10)
    draft.train()
    ema: list[float] | None = None
    started = time.time()
    epoch = 0
    for epoch, idx in batches_from(data.lengths.tolist(), cfg.batch_tokens, cfg.seed, step):
        if step >= cfg.steps:
            break
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            loss, agree = batch_loss(draft, make_batch(data, idx, head_index, pad), cfg)
        optimizer_step(opt, own, loss, lr_at(step, cfg.steps, cfg.lr))
        step += 1
        ema = agree if ema is None else [0.95 * e + 0.05 * a for e, a in zip(ema, agree)]
        bar.set_postfix(loss=f"{loss.item():.3f}", top1="/".join(f"{e:.2f}" for e in ema), epoch=epoch)
        bar.update(1)
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            _checkpoint(ckpt_path, draft, opt, step)
        if not progress and (step % cfg.log_every == 0 or step == cfg.steps):
            print(
                f"step {step}/{cfg.steps} {time.time() - started:.0f}s loss {loss.item():.3f} "
                f"top1 {[round(e, 3) for e in ema]}",
                flush=True,
            )
    bar.close()
    summary = {
        "steps": cfg.steps,
        "epochs_seen": epoch + 1,
        "sequences": int(data.lengths.numel()),
        "tokens": int(data.lengths.sum()),
        "depth": cfg.depth,
        "lr": cfg.lr,
        "seed": cfg.seed,
        "batch_tokens": cfg.batch_tokens,
        "kl_weight": cfg.kl_weight,
        "feature_weight": cfg.feature_weight,
        "layers": cfg.layers,
        "final_top1_agreement_ema_per_depth": [round(e, 4) for e in (ema or [])],
        "train_seconds_this_run": round(time.time() - started, 1),
    }
    return draft.eval(), summary


def _checkpoint(path: Path, draft: FeatureDraftModel, opt: Any, step: int) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"draft": draft.own_state_dict(), "optimizer": opt.state_dict(), "step": step}, tmp)
    os.replace(tmp, path)


def train(target: Any, tokenizer: Any, out: Path, args: Any, progress: bool = True) -> dict[str, Any]:
    """`specdec distill --arch eagle`: features of the data (one target prefill per sequence), train, save."""
    from specdec.distill.data import load_records
    from specdec.models.feature_draft import save_feature_draft
    from specdec.models.tokenizer_info import eos_token_ids

    records = load_records(out / "data")
    if not records:
        raise RuntimeError(f"no training data in {out / 'data'}")
    eos = eos_token_ids(target, tokenizer)
    width = target.get_output_embeddings().weight.shape[0]
    started = time.time()
    data = extract_features(target, records, out / "data" / FEATURES_FILE, progress)
    from specdec.distill.corpus import reference_texts

    text = extract_text_features(
        target,
        tokenizer,
        reference_texts(args.seed) if args.text_tokens else [],
        out / "data" / TEXT_FEATURES_FILE,
        args.text_tokens,
        progress=progress,
    )
    data = concat([data, text])
    features_s = time.time() - started
    head_ids = choose_head_ids(records, args.head_tokens, width, eos)
    cfg = FeatureTrainConfig(
        steps=args.steps,
        batch_tokens=args.batch_tokens,
        lr=args.lr,
        depth=args.depth,
        layers=args.layers,
        kl_weight=args.kl_weight,
        feature_weight=args.feature_weight,
        head_tokens=args.head_tokens,
        seed=args.seed,
        checkpoint_every=args.checkpoint_every,
        bf16=getattr(args, "train_dtype", "bfloat16") == "bfloat16",
    )
    print(
        f"train: {len(records)} sequences, {int(data.lengths.sum())} tokens with target features, head "
        f"{len(head_ids)} ids, depth {cfg.depth}",
        flush=True,
    )
    draft, summary = train_feature_draft(target, data, head_ids, out, cfg, eos[0], progress)
    summary["features_seconds_this_run"] = round(features_s, 1)
    summary["target_tokens"] = sum(r.top_ids.shape[0] for r in records)
    summary["text_tokens"] = int(text.lengths.sum()) if text is not None else 0
    save_feature_draft(out, draft, args.target, meta={"training": summary})
    return summary
