"""Input-major linear weights for the CPU forward (target and drafts): same logits, tied copies counted."""

from __future__ import annotations

import torch
from torch import nn

from specdec.models import layout
from specdec.models.draft_model import build_draft
from specdec.models.feature_draft import build_feature_draft
from specdec.models.layout import InputMajorLinear, use_input_major_linears, wants_input_major
from tests.tiny_llama import tiny_llama, tiny_runner


def test_input_major_model_gives_the_logits_of_the_standard_one_through_the_runner():
    standard, lean = tiny_llama(tied=True), tiny_llama(tied=True)
    replaced, extra = use_input_major_linears(lean)
    assert replaced == 2 * 7 + 1  # q k v o gate up down per layer, LM head
    assert extra == 96 * 32 * 4  # the tied LM head now exists twice
    assert isinstance(lean.get_output_embeddings(), InputMajorLinear)
    assert lean.get_output_embeddings().weight.shape == (96, 32)
    a, b = tiny_runner(standard), tiny_runner(lean)
    ids = [5, 9, 11, 3, 70, 2, 8]
    for cut in (4, 5, 7):  # grow, then a verify-sized step and a rollback
        left, right = a.extend("s", ids[:cut], cut - 3), b.extend("s", ids[:cut], cut - 3)
        assert torch.allclose(left.logits, right.logits, rtol=0, atol=1e-5)
    left, right = a.extend("s", ids[:5] + [1, 2], 4), b.extend("s", ids[:5] + [1, 2], 4)
    assert torch.allclose(left.logits, right.logits, rtol=0, atol=1e-5)


def test_untied_weights_cost_nothing_extra_and_only_cpu_fp32_asks_for_it():
    _, extra = use_input_major_linears(tiny_llama(tied=False))
    assert extra == 0
    assert wants_input_major(torch.device("cpu"), torch.float32)
    assert not wants_input_major(torch.device("cpu"), torch.bfloat16)
    assert not wants_input_major(torch.device("cuda", 0), torch.float32)


def test_a_trained_draft_converts_its_own_layers_and_head_but_not_the_shared_ones():
    target = tiny_llama(tied=True)
    draft = build_draft(target, 2, list(range(10, 60)))
    ids = torch.tensor([[5, 9, 11, 3, 70]])
    with torch.inference_mode():
        before = draft(input_ids=ids).logits
    replaced, extra = draft.input_major()
    assert replaced == 2 * 7 + 1 and extra == 50 * 32 * 4  # layers + the restricted head's copy
    assert type(draft.lm_head) is nn.Linear  # the target's LM head, still shared
    assert draft.lm_head.weight.data_ptr() == target.lm_head.weight.data_ptr()
    with torch.inference_mode():
        after = draft(input_ids=ids).logits
    assert torch.equal(torch.isinf(before), torch.isinf(after))
    finite = torch.isfinite(before)
    assert torch.allclose(before[finite], after[finite], rtol=0, atol=1e-5)


def test_a_feature_draft_gives_the_same_features_and_logits_input_major():
    target = tiny_llama(tied=False)
    draft = build_feature_draft(target, head_ids=list(range(0, 96, 2)))
    draft.init_from_target(target)
    gen = torch.Generator().manual_seed(1)
    next_ids, feats = torch.tensor([[4, 8, 15]]), torch.randn(1, 3, 32, generator=gen)
    pos = torch.arange(3).unsqueeze(0)
    with torch.inference_mode():
        before = draft.restricted_logits(draft(next_ids, feats, pos))
        draft.input_major()
        after = draft.restricted_logits(draft(next_ids, feats, pos))
    assert isinstance(draft.fc, InputMajorLinear)
    assert torch.allclose(before, after, rtol=0, atol=1e-5)


def test_the_kernel_rule_sends_several_rows_and_multithreaded_single_rows_to_onednn():
    assert layout.onednn_available() == torch.backends.mkldnn.is_available()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert [layout.use_onednn(r) for r in (0, 1, 2, 9)] == [False, False, True, True]
        torch.set_num_threads(2)
        assert [layout.use_onednn(r) for r in (0, 1, 2)] == [False, True, True]
    finally:
        torch.set_num_threads(threads)


def test_both_kernels_give_the_standard_linear_s_output():
    gen = torch.Generator().manual_seed(4)
    linear = nn.Linear(48, 40, bias=True)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(40, 48, generator=gen))
        linear.bias.copy_(torch.randn(40, generator=gen))
    lean = InputMajorLinear(linear)
    threads = torch.get_num_threads()
    try:
        for n_threads in (1, 2):
            torch.set_num_threads(n_threads)
            for rows in (1, 2, 5, 17):
                x = torch.randn(1, rows, 48, generator=gen)
                with torch.inference_mode():
                    assert torch.allclose(lean(x), linear(x), rtol=1e-5, atol=1e-4), (n_threads, rows)
    finally:
        torch.set_num_threads(threads)
