"""The target's features for feature-draft training: one target prefill per sequence gives f_j (its final
normed hidden state) and its top-k logits at every position (specdec/models/feature_draft.py's notation).

Shared by the feature trainer (specdec/distill/feature_train.py) and the token trainer
(specdec/distill/train.py, whose teacher-forced reference text is labelled with these prefills).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdec.distill.data import TOP_K, Record

FEATURES_FILE = "features.pt"
TEXT_FEATURES_FILE = "text_features.pt"


@dataclass
class FeatureData:
    """Flat per-token arrays over all sequences (`starts[i]` = offset of sequence i)."""

    ids: torch.Tensor  # [N] int32 tokens
    feats: torch.Tensor  # [N, H] float16: f_j
    top_ids: torch.Tensor  # [N, K] int32: the target's top-k at j (its choice for x_{j+1})
    top_logits: torch.Tensor  # [N, K] float16
    starts: torch.Tensor  # [S] int64
    lengths: torch.Tensor  # [S] int64


@torch.inference_mode()
def extract_features(target: Any, records: list[Record], path: Path, progress: bool = True) -> FeatureData:
    """One target prefill per record: f_j and top-k at every position (cached in `path`)."""
    from tqdm import tqdm

    if path.exists():
        return FeatureData(**torch.load(path))
    feats, top_ids, top_logits, ids, lengths = [], [], [], [], []
    for r in tqdm(records, desc="features", unit="seq", disable=not progress, mininterval=10):
        x = r.ids.long().unsqueeze(0)  # [1, T]
        h = target.model(input_ids=x).last_hidden_state[0]  # [T, H] (after the final norm)
        top = torch.topk(target.lm_head(h).float(), TOP_K, dim=-1)  # [T, K]
        feats.append(h.half())
        top_ids.append(top.indices.int())
        top_logits.append(top.values.half())
        ids.append(r.ids.int())
        lengths.append(len(r.ids))
    lengths_t = torch.tensor(lengths)
    data = FeatureData(
        torch.cat(ids),
        torch.cat(feats),
        torch.cat(top_ids),
        torch.cat(top_logits),
        torch.cumsum(lengths_t, 0) - lengths_t,
        lengths_t,
    )
    tmp = path.with_suffix(".tmp")
    torch.save(data.__dict__, tmp)
    os.replace(tmp, path)
    return data


@torch.inference_mode()
def extract_text_features(
    target: Any,
    tokenizer: Any,
    texts: list[tuple[str, str]],
    path: Path,
    max_tokens: int,
    max_len: int = 384,
    progress: bool = True,
) -> FeatureData | None:
    """Teacher-forced data: each (question, answer) as a one-turn chat, one target prefill each, until
    `max_tokens` tokens (cached in `path`). None when max_tokens is 0."""
    from tqdm import tqdm

    from specdec.distill.data import chat_ids

    if max_tokens <= 0:
        return None
    if path.exists():
        return FeatureData(**torch.load(path))
    records, total = [], 0
    bar = tqdm(total=max_tokens, desc="text features", unit="tok", disable=not progress, mininterval=10)
    for question, answer in texts:
        ids = (chat_ids(tokenizer, question) + list(tokenizer.encode(answer, add_special_tokens=False)))[:max_len]
        records.append(
            Record(torch.tensor(ids, dtype=torch.int32), len(ids), torch.empty(0, TOP_K), torch.empty(0, TOP_K))
        )
        total += len(ids)
        bar.update(len(ids))
        if total >= max_tokens:
            break
    bar.close()
    return extract_features(target, records, path, progress)


def concat(parts: list[FeatureData | None]) -> FeatureData:
    """One FeatureData of several (None parts skipped)."""
    present = [p for p in parts if p is not None]
    offsets = torch.cumsum(torch.tensor([0] + [int(p.ids.numel()) for p in present[:-1]]), 0)
    return FeatureData(
        torch.cat([p.ids for p in present]),
        torch.cat([p.feats for p in present]),
        torch.cat([p.top_ids for p in present]),
        torch.cat([p.top_logits for p in present]),
        torch.cat([p.starts + o for p, o in zip(present, offsets)]),
        torch.cat([p.lengths for p in present]),
    )
