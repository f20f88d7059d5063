"""The torch engine's model loading: weights, linear kernels or quantization, KV pool, runner and Info.

Imported by specdec.engine.loading only for a service that runs torch (transformers' model code is heavy).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from specdec.config import KernelConfig, ModelServiceConfig
from specdec.engine.cuda_graphs import GraphCacheOps
from specdec.engine.kernel_select import default_plan, plan_model
from specdec.engine.kvcache import KVCachePool, kv_bytes_per_token
from specdec.engine.torch_runner import CausalLMRunner
from specdec.models.architecture import check_cache_truncatable
from specdec.models.compat import cache_argument
from specdec.models.feature_draft import FeatureDraftModel
from specdec.models.int4 import quantize_linears_int4, wants_int4
from specdec.models.int8 import quantize_linears, wants_int8
from specdec.models.kernels import INPUT_MAJOR, KERNELS, KernelPlan
from specdec.models.layout import input_major_head
from specdec.models.load_config import load_config
from specdec.models.loader import load_causal_lm
from specdec.models.spec import parse_model_spec
from specdec.models.tokenizer_info import describe_tokenizer, eos_token_ids

log = logging.getLogger("specdec.engine")


def graph_cache_ops(cfg: ModelServiceConfig, model: Any, feature: bool) -> GraphCacheOps | None:
    """SPECDEC_CUDA_GRAPHS: the static KV slots whose passes replay CUDA graphs (specdec/engine/cuda_graphs.py),
    or None when off. Refused, naming why, where graphs cannot run."""
    if not cfg.cuda_graphs:
        return None
    if model.device.type != "cuda":
        raise ValueError(f"SPECDEC_CUDA_GRAPHS needs a CUDA device; {cfg.model} is on {model.device}")
    if feature:
        raise ValueError("SPECDEC_CUDA_GRAPHS runs causal LMs; a feature draft runs without graphs")
    context = int(getattr(model.config.get_text_config(), "max_position_embeddings", 0) or cfg.cuda_graph_tokens)
    tokens = min(cfg.cuda_graph_tokens, context)
    log.info("%s: CUDA graphs over %d static KV slots of %d positions", cfg.model, cfg.cuda_graph_slots, tokens)
    return GraphCacheOps(model, cache_argument(model), cfg.cuda_graph_slots, tokens, cfg.max_k + 1)


def is_feature_draft(model: Any) -> bool:
    """A trained feature (EAGLE-style) draft, fed the target's hidden rows, rather than a causal LM."""
    return isinstance(model, FeatureDraftModel)


# Tokens of the forward that checks the chosen kernels' logits against nn.Linear's at load.
KERNEL_PROBE_TOKENS = 8


def _plan_kernels(cfg: ModelServiceConfig, model: Any, cache_root: Any) -> KernelPlan:
    """Time and apply the CPU linear kernels (specdec/engine/kernel_select.py) for the part of the
    model it owns (a trained draft: its own layers, not the target's shared head)."""
    if model.device.type != "cpu" or model.dtype not in (torch.float32, torch.bfloat16):
        return default_plan()
    root = model.kernel_root() if hasattr(model, "kernel_root") else model
    probe = None
    if not isinstance(model, FeatureDraftModel):  # a causal LM: check its logits too
        width = model.get_output_embeddings().weight.shape[0]
        probe = (torch.arange(1, KERNEL_PROBE_TOKENS + 1) * 7 % width).unsqueeze(0)
    plan = plan_model(model, root, cfg.kernels, cache_root, probe)
    if root is not model and KERNELS[plan.kernel_for(1)] == INPUT_MAJOR:
        input_major_head(model)  # the restricted head of a draft step (one row)
    log.info("%s: linear kernels %s, chosen in %.2fs", cfg.model, plan.describe(), plan.seconds)
    return plan


# The kernel a quantized dtype runs every band on (Info metadata, metrics).
QUANTIZED_KERNELS = {"int8": "int8_fbgemm", "int4": "int4_weight_only"}


def weight_quantization(dtype: str) -> str | None:
    """ "int8" or "int4" where a service's dtype option asks for quantized weights, else None."""
    return "int8" if wants_int8(dtype) else "int4" if wants_int4(dtype) else None


def quantize_weights(model: Any, quant: str, int4_max_rows: int | None = None) -> tuple[int, int, str]:
    """Put the linears of the part of `model` a service owns on torch's int8 GEMM (float32
    activations) or its weight-only int4 GEMM (bfloat16 activations; the LM head stays bfloat16
    dense, specdec/models/int4.py): what a model service does at load, and what the bench does to its
    in-process Hugging Face target so that both run the same weights.
    Returns (layers replaced, quantized weight bytes, the activations' dtype)."""
    if model.device.type != "cpu":
        raise ValueError(f"dtype {quant} runs on CPU only (the model is on {model.device})")
    if quant == "int8":
        root = model.kernel_root() if hasattr(model, "kernel_root") else model
        return (*quantize_linears(root), "float32")
    if hasattr(model, "kernel_root"):
        raise ValueError(
            "dtype int4 is for a whole causal LM (a target or a plain model draft), "
            "not a trained draft that shares the target's tensors"
        )
    max_rows = KernelConfig().int4_max_rows if int4_max_rows is None else int4_max_rows
    return (*quantize_linears_int4(model, max_rows, keep=(model.get_output_embeddings(),)), "bfloat16")


def _quantized_plan(cfg: ModelServiceConfig, model: Any, quant: str) -> KernelPlan:
    """--dtype int8 / int4: the service's linears quantized (quantize_weights), as a fixed plan."""
    replaced, nbytes, activations = quantize_weights(model, quant, cfg.kernels.int4_max_rows)
    log.info(
        "%s: %d linear layers with %s weights (%d bytes; activations %s)",
        cfg.model,
        replaced,
        quant,
        nbytes,
        activations,
    )
    bands = default_plan().band_rows
    return KernelPlan(bands, (QUANTIZED_KERNELS[quant],) * len(bands), {}, "dtype")


ROW_INVARIANT_CHOICES = ("auto", "on", "off")


def wants_row_invariant(setting: str, quantized: bool) -> bool:
    """SPECDEC_ROW_INVARIANT: auto (on for int8 / int4 weights), on or off."""
    value = setting.strip().lower()
    if value not in ROW_INVARIANT_CHOICES:
        raise ValueError(f"row_invariant must be one of {ROW_INVARIANT_CHOICES}, got {setting!r}")
    return quantized if value == "auto" else value == "on"


def load_torch(
    cfg: ModelServiceConfig, batching: bool = False, keep_hidden: bool = False
) -> tuple[Any, Any, CausalLMRunner, dict[str, Any], float, KernelPlan]:
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    quant = weight_quantization(cfg.dtype)
    load_cfg = load_config(cfg.device, "float32" if quant else cfg.dtype, cfg.cache_dir, cfg.offline)
    loaded = load_causal_lm(parse_model_spec(cfg.model), load_cfg)
    model, tokenizer = loaded.model, loaded.tokenizer
    check_cache_truncatable(model.config)
    plan = _quantized_plan(cfg, model, quant) if quant else _plan_kernels(cfg, model, load_cfg.cache_root())
    dtype_bytes = torch.finfo(model.dtype).bits // 8
    feature = isinstance(model, FeatureDraftModel)
    per_token = kv_bytes_per_token(model.config, dtype_bytes)
    if keep_hidden or feature:  # the hidden rows kept beside the KV (a feature draft keeps them in fp32)
        per_token += model.config.get_text_config().hidden_size * (4 if feature else dtype_bytes)
    share = 0 if feature else cfg.prefix_share_min_tokens  # a feature draft's cache is keyed apart
    graphs = graph_cache_ops(cfg, model, feature)
    pool = KVCachePool(cfg.cache_budget_bytes, per_token, model.config, share_min_tokens=share, ops=graphs)
    row_invariant = graphs is None and not feature and wants_row_invariant(cfg.row_invariant, quant is not None)
    if graphs is not None and keep_hidden:
        log.info("%s: CUDA graphs keep no hidden rows (feature drafts are refused by this target)", cfg.model)
    runner = CausalLMRunner(
        model,
        pool,
        batching=batching and not feature and graphs is None,
        keep_hidden=keep_hidden and graphs is None,
        row_invariant=row_invariant,
    )
    if row_invariant:
        log.info("%s: row-invariant attention (returned rows attend one at a time)", cfg.model)
    if batching and not runner.batching:
        log.warning("%s: attention cannot be switched to ragged batching; verifying one session per pass", cfg.model)
    tok = describe_tokenizer(tokenizer)
    text_cfg = model.config.get_text_config()
    info = dict(
        model_id=cfg.model,
        vocab_size=tok.vocab_size,
        logits_width=model.get_output_embeddings().weight.shape[0],
        tokenizer_fingerprint=tok.fingerprint,
        eos_token_ids=eos_token_ids(model, tokenizer),
        max_context=int(getattr(text_cfg, "max_position_embeddings", 0) or 0),
        special_tokens=tok.special_tokens,
        device=str(runner.device),
        dtype=quant or str(model.dtype).replace("torch.", ""),
        hidden_size=text_cfg.hidden_size,
        cache_budget_bytes=cfg.cache_budget_bytes,
        max_k=cfg.max_k,
    )
    return model, tokenizer, runner, info, loaded.load_seconds, plan
