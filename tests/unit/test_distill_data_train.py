"""`specdec distill` building blocks without a server: the work-item order that lets a run extend an
earlier run's data, the chunk check that regenerates a partial last chunk, and the training step in
fp32 and bf16 autocast."""

from __future__ import annotations

import torch

from specdec.distill import data as data_mod
from specdec.distill.data import CHUNK_PROMPTS, Record, chunk_path, work_items
from specdec.distill.train import autocast_dtype, make_batch, train_step
from specdec.models.draft_model import build_draft
from specdec.models.tiny import build_tiny_causal_lm
from tests.support import smollm2_tokenizer


def test_work_items_append_each_group_after_the_earlier_ones():
    prompts, chat, own = ["a", "b", "c", "o1", "o2"], ["a", "b"], ["o1", "o2"]
    before = work_items(prompts, 3, chat)
    after = work_items(prompts, 3, chat, extra_sampled=(own, 3))
    assert after[: len(before)] == before  # an earlier run's chunks keep their items
    assert after[len(before) :] == [("o1", 1), ("o2", 1), ("o1", 2), ("o2", 2)]
    assert work_items(prompts, 3, chat, extra_sampled=(own, 1)) == before
    assert before[:5] == [(p, 0) for p in prompts] and before[5:] == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]


def _record(n_prompt: int = 2, n_gen: int = 3) -> Record:
    return Record(
        torch.arange(n_prompt + n_gen, dtype=torch.int32),
        n_prompt,
        torch.zeros((n_gen, 8), dtype=torch.int32),
        torch.zeros((n_gen, 8), dtype=torch.float16),
    )


def test_a_partial_last_chunk_is_regenerated_when_more_items_follow(tmp_path):
    torch.save([_record().__dict__ for _ in range(CHUNK_PROMPTS)], chunk_path(tmp_path, 0))
    torch.save([_record().__dict__ for _ in range(5)], chunk_path(tmp_path, 1))
    assert data_mod._chunk_complete(tmp_path, 0, CHUNK_PROMPTS)
    assert data_mod._chunk_complete(tmp_path, 1, 5)  # the same run: complete
    assert not data_mod._chunk_complete(tmp_path, 1, CHUNK_PROMPTS)  # more items now fall into it
    assert not data_mod._chunk_complete(tmp_path, 2, 3)  # never written


def _tiny_setup():
    target = build_tiny_causal_lm(smollm2_tokenizer(), layers=2, seed=5)
    for p in target.parameters():
        p.requires_grad_(False)
    width = target.lm_head.weight.shape[0]
    head_ids = list(range(0, 600))
    head_index = torch.full((width,), -1, dtype=torch.long)
    head_index[torch.tensor(head_ids)] = torch.arange(len(head_ids))
    g = torch.Generator().manual_seed(0)
    records = []
    for n in (9, 12, 7):
        ids = torch.randint(0, 600, (n,), generator=g, dtype=torch.int32)
        top = torch.randint(0, 600, (n - 3, 8), generator=g, dtype=torch.int32)
        records.append(Record(ids, 3, top, torch.randn((n - 3, 8), generator=g).half()))
    batch = make_batch(records, [0, 1, 2], head_index, pad=0)
    return target, head_ids, batch


def test_train_step_lowers_the_loss_in_fp32_and_bf16_autocast():
    assert autocast_dtype("float32") is None and autocast_dtype("bfloat16") is torch.bfloat16
    for dtype in (None, torch.bfloat16):
        target, head_ids, batch = _tiny_setup()
        draft = build_draft(target, 1, head_ids).train()
        own = list(draft.model.layers.parameters())
        for p in own:
            p.requires_grad_(True)
        opt = torch.optim.AdamW(own, lr=3e-3)
        losses = [train_step(draft, opt, own, batch, 3e-3, 1.0, dtype)[0] for _ in range(8)]
        assert losses[-1] < losses[0] - 0.1, (dtype, losses)
        assert all(p.dtype == torch.float32 for p in own)  # master weights stay fp32 under autocast
        assert target.model.layers[0].mlp.up_proj.weight.grad is None  # the shared target is untouched


def test_a_resumed_run_sees_the_batches_an_unbroken_run_would():
    from itertools import islice

    from specdec.distill.train import batches_from, plan_epoch

    lengths = [5, 9, 3, 12, 7, 7, 2, 11, 4]
    unbroken = list(islice(batches_from(lengths, 20, 3, 0), 25))
    per_epoch = len(plan_epoch(lengths, 20, 3, 0))
    assert [e for e, _ in unbroken[:per_epoch]] == [0] * per_epoch and unbroken[per_epoch][0] == 1
    assert sorted(i for _, b in unbroken[:per_epoch] for i in b) == list(range(len(lengths)))  # each once
    assert unbroken[:per_epoch] != unbroken[per_epoch : 2 * per_epoch]  # reshuffled per epoch
    for start in (1, per_epoch, per_epoch + 2, 17):
        assert list(islice(batches_from(lengths, 20, 3, start), 25 - start)) == unbroken[start:]


def test_training_reads_only_the_chunks_of_the_last_data_stage(tmp_path):
    import json

    for i, n in enumerate((CHUNK_PROMPTS, CHUNK_PROMPTS, 7)):
        torch.save([_record().__dict__ for _ in range(n)], chunk_path(tmp_path, i))
    assert len(data_mod.load_records(tmp_path)) == 2 * CHUNK_PROMPTS + 7  # no manifest: every chunk
    (tmp_path / data_mod.MANIFEST_FILE).write_text(json.dumps({"chunks": 2, "items": 2 * CHUNK_PROMPTS}))
    assert len(data_mod.load_records(tmp_path)) == 2 * CHUNK_PROMPTS  # chunk 2 is a leftover
