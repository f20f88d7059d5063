"""Self-distillation data: the target continues the chat-templated prompts; we keep its choices.

Each work item is (prompt, variant): variant 0 is the greedy continuation, variant v > 0 a
sampled one (temperature DATA_TEMPERATURE, seed derived from (seed, v)); in every case the
target's top-k logits at every generated position are stored, so training targets are the
target's own next-token distributions (its argmax is the greedy choice).

Work is cut into fixed chunks of CHUNK_PROMPTS items; each chunk is written atomically to
DIR/data/chunk-NNNNN.pt and skipped when present, so an interrupted run resumes.
Batched generation with left padding and an attention mask is fine here (offline data,
not serving).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

CHUNK_PROMPTS = 128
DEFAULT_BATCH = 64
TOP_K = 8
DATA_TEMPERATURE = 0.8
TIMING_FILE = "timing.json"  # chunk index -> seconds it took to generate
MANIFEST_FILE = "manifest.json"  # {"chunks": N, "items": M} of the last data stage: training reads chunks < N


@dataclass
class Record:
    ids: torch.Tensor  # [n_prompt + n_gen] int32: prompt then the target's tokens
    n_prompt: int
    top_ids: torch.Tensor  # [n_gen, TOP_K] int32: target's top-k at generated positions
    top_logits: torch.Tensor  # [n_gen, TOP_K] float16


def chat_ids(tokenizer: Any, prompt: str) -> list[int]:
    """The prompt as the orchestrator renders a one-turn chat (template + generation prompt)."""
    if getattr(tokenizer, "chat_template", None):
        return list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
    return list(tokenizer.encode(prompt))


def work_items(
    prompts: list[str],
    variants: int,
    sampled_prompts: list[str] | None = None,
    extra_sampled: tuple[list[str], int] = ([], 1),
) -> list[tuple[str, int]]:
    """Greedy (variant 0) for every prompt, then sampled variants 1..variants-1 for `sampled_prompts`, then
    sampled variants 1..n-1 for the prompts of `extra_sampled` = (prompts, n). Each group is appended after
    the ones before it, so adding a group leaves the items (and the data chunks) of the earlier ones as
    they were: only the last, partial chunk of a previous run is regenerated."""
    sampled = prompts if sampled_prompts is None else sampled_prompts
    extra, extra_variants = extra_sampled
    return (
        [(p, 0) for p in prompts]
        + [(p, v) for v in range(1, variants) for p in sampled]
        + [(p, v) for v in range(1, extra_variants) for p in extra]
    )


def chunk_path(data_dir: Path, index: int) -> Path:
    return data_dir / f"chunk-{index:05d}.pt"


@torch.inference_mode()
def _generate_batch(
    model: Any, tokenizer: Any, items: list[tuple[str, int]], max_new: int, eos: list[int], seed: int
) -> list[Record]:
    encoded = [chat_ids(tokenizer, p) for p, _ in items]
    width = max(len(e) for e in encoded)
    pad = eos[0]
    input_ids = torch.full((len(items), width), pad, dtype=torch.long)  # [B, T] left padded
    mask = torch.zeros((len(items), width), dtype=torch.long)  # [B, T]
    for i, e in enumerate(encoded):
        input_ids[i, width - len(e) :] = torch.tensor(e)
        mask[i, width - len(e) :] = 1
    variant = items[0][1]
    kwargs: dict[str, Any] = dict(do_sample=False, top_k=None, top_p=None, temperature=None)
    if variant > 0:
        kwargs = dict(do_sample=True, temperature=DATA_TEMPERATURE, top_k=0, top_p=1.0)
    with torch.random.fork_rng(devices=[]):  # generate() samples from the global RNG; keep it untouched
        torch.manual_seed(seed * 1000 + variant)
        out = model.generate(
            input_ids.to(model.device),
            attention_mask=mask.to(model.device),
            max_new_tokens=max_new,
            eos_token_id=eos,
            pad_token_id=pad,
            return_dict_in_generate=True,
            output_logits=True,
            **kwargs,
        )
    gen = out.sequences[:, width:]  # [B, S]
    logits = torch.stack(out.logits, dim=1).float()  # [B, S, V]
    top = torch.topk(logits, TOP_K, dim=-1)
    records = []
    for i, e in enumerate(encoded):
        toks = gen[i].tolist()
        n = next((j + 1 for j, t in enumerate(toks) if t in eos), len(toks))  # keep the EOS itself
        records.append(
            Record(
                torch.tensor(e + toks[:n], dtype=torch.int32),
                len(e),
                top.indices[i, :n].to(torch.int32).clone(),
                top.values[i, :n].half().clone(),
            )
        )
    return records


def generation_model(model: Any, dtype: torch.dtype) -> Any:
    """The model data generation runs: `model` itself, or a copy in `dtype` (bfloat16 generates ~2x faster
    on CPUs with AVX512-BF16; its choices differ from float32 only at near-ties). Never casts `model` in
    place: rounding its weights would change the target the draft is trained against."""
    if model.dtype == dtype:
        return model
    import copy

    return copy.deepcopy(model).to(dtype).eval()


def generate_data(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    data_dir: Path,
    *,
    variants: int,
    max_new: int,
    eos: list[int],
    seed: int,
    sampled_prompts: list[str] | None = None,
    extra_sampled: tuple[list[str], int] = ([], 1),
    batch: int = DEFAULT_BATCH,
    progress: bool = True,
) -> None:
    """Generate every missing chunk (resumable), `batch` sequences per generate call; the items are
    `work_items(prompts, variants, sampled_prompts, extra_sampled)`."""
    from tqdm import tqdm

    data_dir.mkdir(parents=True, exist_ok=True)
    items = work_items(prompts, variants, sampled_prompts, extra_sampled)
    chunks = [items[i : i + CHUNK_PROMPTS] for i in range(0, len(items), CHUNK_PROMPTS)]
    todo = [i for i in range(len(chunks)) if not _chunk_complete(data_dir, i, len(chunks[i]))]
    (data_dir / MANIFEST_FILE).write_text(json.dumps({"chunks": len(chunks), "items": len(items)}) + "\n")
    bar = tqdm(
        total=len(items),
        initial=(len(chunks) - len(todo)) * CHUNK_PROMPTS,
        desc="generate",
        unit="prompt",
        disable=not progress,
        mininterval=5,
    )
    timing_path = data_dir / TIMING_FILE
    timing = json.loads(timing_path.read_text()) if timing_path.exists() else {}
    for ci in todo:
        started = time.time()
        chunk = sorted(chunks[ci], key=lambda it: (it[1], len(it[0])))  # same variant, similar lengths per batch
        records: list[Record] = []
        for b in range(0, len(chunk), batch):
            part = chunk[b : b + batch]
            for v in sorted({it[1] for it in part}):
                records += _generate_batch(model, tokenizer, [it for it in part if it[1] == v], max_new, eos, seed)
            bar.update(len(part))
        tmp = chunk_path(data_dir, ci).with_suffix(".tmp")
        torch.save([r.__dict__ for r in records], tmp)
        os.replace(tmp, chunk_path(data_dir, ci))
        timing[str(ci)] = round(time.time() - started, 1)
        timing_path.write_text(json.dumps(timing, indent=0) + "\n")
    bar.close()


def _chunk_complete(data_dir: Path, index: int, n_items: int) -> bool:
    """A chunk file holding `n_items` records (a run with more work items regenerates its last, partial chunk)."""
    path = chunk_path(data_dir, index)
    return path.exists() and len(torch.load(path)) == n_items


def data_seconds(data_dir: Path) -> float:
    """Total generation time of the chunks present (over every run that made them)."""
    path = data_dir / TIMING_FILE
    return float(sum(json.loads(path.read_text()).values())) if path.exists() else 0.0


def load_records(data_dir: Path) -> list[Record]:
    """The records of the chunks the last data stage asked for (its manifest; without one, every chunk):
    chunks an earlier run with more work items left behind are not read."""
    manifest = data_dir / MANIFEST_FILE
    paths = sorted(data_dir.glob("chunk-*.pt"))
    if manifest.exists():
        paths = [chunk_path(data_dir, i) for i in range(json.loads(manifest.read_text())["chunks"])]
    out = []
    for path in paths:
        out += [Record(**r) for r in torch.load(path)]
    return out


def iter_tokens(records: list[Record]) -> Iterator[int]:
    for r in records:
        yield from r.ids[r.n_prompt :].tolist()
