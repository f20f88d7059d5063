"""A trained draft for a target: a few decoder layers of the target's architecture that reuse the
target's input embedding, final norm and LM head (loaded from the target at start, never stored),
with an FR-Spec restricted output head.

The head scores only the N most frequent tokens of the target's own outputs (ids stored with
the draft); every other logit is -inf, so the draft's distribution lives on that subset.
Sampling stays exact: q' is what the draft sampled from. The logits keep the target's full
width, so nothing is remapped in the accept rule.

On disk (``save_draft``): the format of specdec/models/draft_format.py, its own layer weights keyed
``layers.I...``. ``load_causal_lm`` (specdec/models/loader.py) loads the target named in any
directory holding a ``draft_config.json`` through the normal spec machinery (cached GGUF conversion
included) and assembles the draft around its shared tensors (:func:`assemble`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.modeling_outputs import CausalLMOutputWithPast

from specdec.models.compat import cache_argument, causal_lm_output, returned_cache
from specdec.models.draft_format import (
    HEAD_KEY,
    WEIGHTS,
    cfg_layers,
    init_layer_indices,
    read_draft_config,
    write_draft,
)
from specdec.models.layout import head_logits, input_major_head, use_input_major_linears

LAYER_PREFIX = "layers."
SUPPORTED_MODEL_TYPES = ("llama",)


class DraftForCausalLM(LlamaForCausalLM):
    """A Llama causal LM of `config.num_hidden_layers` layers whose embedding, final norm and
    LM head are a target's modules (shared), with a restricted output head.

    Build with :func:`build_draft`; forward returns logits [B, n, V_full] (-inf outside the head set),
    exactly what ``CausalLMRunner`` expects of any causal LM.
    """

    head_ids: torch.Tensor  # registered buffers
    head_weight: torch.Tensor

    def attach(self, target: Any, head_ids: Sequence[int] | torch.Tensor | None) -> None:
        """Share the target's embedding, final norm and LM head; set the restricted head."""
        self.model.embed_tokens = target.get_input_embeddings()
        self.model.norm = target.model.norm
        self.lm_head = target.get_output_embeddings()
        width = self.lm_head.weight.shape[0]
        ids = torch.arange(width) if head_ids is None else torch.as_tensor(head_ids, dtype=torch.long)
        ids = torch.unique(ids)  # sorted, distinct
        if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= width:
            raise ValueError(f"head token ids must lie in [0, {width})")
        self.register_buffer("head_ids", ids.to(self.lm_head.weight.device), persistent=False)
        self.refresh_head()

    def refresh_head(self) -> None:
        """Recompute the restricted head weight [N, H] from the (shared) LM head."""
        with torch.no_grad():
            weight = self.lm_head.weight.index_select(0, self.head_ids)
        self.register_buffer("head_weight", weight, persistent=False)
        if getattr(self, "head_weight_t", None) is not None:
            input_major_head(self)

    def input_major(self) -> tuple[int, int]:
        """Store its decoder layers and the restricted head input-major for the CPU forward
        (specdec/models/layout.py); the shared embedding and LM head stay as they are.
        Returns (layers replaced, extra bytes)."""
        replaced, _ = use_input_major_linears(self.model.layers)
        return replaced + 1, input_major_head(self)

    def kernel_root(self) -> nn.Module:
        """What the CPU kernel plan applies to (specdec/models/kernels.py): its own decoder layers."""
        return self.model.layers

    @property
    def logits_width(self) -> int:
        return self.lm_head.weight.shape[0]

    def hidden(self, input_ids: torch.Tensor, **kwargs: Any) -> Any:
        return self.model(input_ids=input_ids, **kwargs)

    def restricted_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] final hidden states -> [..., N] logits over the head set (training uses these)."""
        return head_logits(hidden, self.head_weight, getattr(self, "head_weight_t", None))

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: Any = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        past_key_values: Any = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        """Logits [B, n, V] of the last `logits_to_keep` positions (all when 0); the cache comes as `cache`
        (the engine, transformers >= 5.2x) or `past_key_values` (generate in earlier releases)."""
        cache = cache if cache is not None else past_key_values
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **{cache_argument(self.model): cache},
            **kwargs,
        )
        hidden = out.last_hidden_state  # [B, T, H]
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            hidden = hidden[:, -logits_to_keep:]
        elif not isinstance(logits_to_keep, int):
            hidden = hidden[:, logits_to_keep]
        sub = self.restricted_logits(hidden)  # [B, n, N]
        logits = sub.new_full((*sub.shape[:-1], self.logits_width), float("-inf"))  # [B, n, V]
        logits[..., self.head_ids] = sub
        return causal_lm_output(logits, returned_cache(out))


def draft_config_for(target_config: Any, layers: int) -> LlamaConfig:
    """The target's config with `layers` decoder layers (same hidden size, heads, rope, vocabulary)."""
    text = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    if getattr(text, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"trained drafts support {SUPPORTED_MODEL_TYPES} targets, not {text.model_type!r}")
    cfg = copy.deepcopy(text)
    cfg.num_hidden_layers = layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = list(cfg.layer_types[:layers])
    cfg.architectures = ["DraftForCausalLM"]
    return cfg


def build_draft(
    target: Any, layers: int, head_ids: Sequence[int] | torch.Tensor | None, init_from_target: bool = True
) -> DraftForCausalLM:
    """A draft around `target`'s shared modules; its layers copied from the target's (see init_layer_indices)."""
    cfg = draft_config_for(target.config, layers)
    with torch.random.fork_rng(devices=[]):  # default init draws from the global RNG; keep it untouched
        draft = DraftForCausalLM(cfg)
    draft.to(dtype=target.dtype, device=target.device)  # type: ignore[call-arg]  # transformers' wraps-decorated to
    draft.attach(target, head_ids)
    if init_from_target:
        src = init_layer_indices(cfg_layers(target.config), layers)
        for i, j in enumerate(src):
            draft.model.layers[i].load_state_dict(target.model.layers[j].state_dict())
    draft.generation_config = copy.deepcopy(target.generation_config)
    return draft.eval()


def own_state_dict(draft: DraftForCausalLM) -> dict[str, torch.Tensor]:
    """Only the draft's own weights (its decoder layers), keyed layers.I...."""
    return {LAYER_PREFIX + k: v for k, v in draft.model.layers.state_dict().items()}


def save_draft(
    directory: str | Path,
    draft: DraftForCausalLM,
    target_spec: str,
    meta: dict[str, Any] | None = None,
    card: str | None = None,
) -> Path:
    """Write draft_config.json + model.safetensors (own layers in fp16, head ids) [+ MODEL_CARD.md]."""
    config = {
        "target": target_spec,
        "architecture": draft.config.model_type,
        "layers": draft.config.num_hidden_layers,
        "hidden_size": draft.config.hidden_size,
        "logits_width": draft.logits_width,
    }
    return write_draft(
        directory, own_state_dict(draft), draft.head_ids, config, ["embed_tokens", "norm", "lm_head"], meta, card
    )


def load_draft_weights(draft: DraftForCausalLM, directory: str | Path) -> None:
    from safetensors.torch import load_file

    tensors = load_file(str(Path(directory) / WEIGHTS))
    tensors.pop(HEAD_KEY, None)
    own = {k[len(LAYER_PREFIX) :]: v for k, v in tensors.items() if k.startswith(LAYER_PREFIX)}
    missing, unexpected = draft.model.layers.load_state_dict(own, strict=False)
    if missing or unexpected:
        raise ValueError(f"draft weights do not match: missing {missing[:3]}, unexpected {unexpected[:3]}")


def assemble(target: Any, directory: str | Path) -> DraftForCausalLM:
    """Build the draft stored in `directory` around an already loaded target."""
    from safetensors import safe_open

    config = read_draft_config(directory)
    with safe_open(str(Path(directory) / WEIGHTS), framework="pt") as f:
        head_ids = f.get_tensor(HEAD_KEY).long()
    draft = build_draft(target, int(config["layers"]), head_ids, init_from_target=False)
    load_draft_weights(draft, directory)
    draft.to(dtype=target.dtype)  # type: ignore[call-arg]  # transformers' wraps-decorated to
    draft.refresh_head()
    return draft.eval()
