"""A feature draft (EAGLE-style): drafts from the target's own last hidden states.

Notation: x_j is the token at position j, f_j the target's final (normed) hidden state at
position j, the vector the target's LM head turns into its distribution for token j+1.

The draft runs one (or a few) Llama decoder layer(s) over the sequence of inputs

    u_j = fc([embed(x_{j+1}); f_j])                                    # [2H] -> [H]

and its (normed) output is a prediction f^_{j+1} of the target's next feature; the target's
own LM head (restricted to an FR-Spec head set) turns it into the draft's logits for x_{j+2}.
After a round the draft knows f_j for every context position but the last (the recovered or
bonus token x_{L-1} was produced from f_{L-2}, and the target has not run it yet), so:

  step 1: u_{L-2} = fc([embed(x_{L-1}); f_{L-2}])  -> f^_{L-1}, d1
  step i: u_{L-3+i} = fc([embed(d_{i-1}); f^_{L-3+i}]) -> d_i

Positions computed from predicted features are rolled back (KV `truncate`) before the next
round, so the draft's cache only ever holds positions fed with the target's real features.
The draft's embedding and LM head are the target's tensors (shared, not stored); it stores its
fc, its decoder layer and its final norm (fp16) and the head token ids.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import GenerationConfig, LlamaConfig, LlamaModel

from specdec.models.compat import cache_argument
from specdec.models.draft_format import (
    HEAD_KEY,
    WEIGHTS,
    cfg_layers,
    init_layer_indices,
    read_draft_config,
    write_draft,
)
from specdec.models.layout import head_logits, input_major_head, use_input_major_linears

ARCHITECTURE = "eagle"
FEATURE = "target_final_hidden_normed"  # what f_j is (the input of the target's LM head)


def feature_config_for(target_config: Any, layers: int = 1) -> LlamaConfig:
    """The target's (Llama) config reduced to `layers` decoder layers; no vocabulary of its own."""
    text = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    if getattr(text, "model_type", None) != "llama":
        raise ValueError(f"feature drafts support llama targets, not {getattr(text, 'model_type', None)!r}")
    cfg = copy.deepcopy(text)
    cfg.num_hidden_layers = layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = list(cfg.layer_types[:layers])
    cfg.vocab_size = 1  # inputs arrive as embeddings; the target's embedding is shared
    cfg.pad_token_id = None
    return cfg


def _weight(linear: nn.Module) -> torch.Tensor:
    """A shared linear's [out, in] weight (nn.Linear's parameter, or the property of its layout drop-ins)."""
    weight = linear.weight
    assert isinstance(weight, torch.Tensor), "the shared LM head is a linear"
    return weight


class FeatureDraftModel(nn.Module):
    """fc + one Llama decoder layer (+ its norm) around a target's shared embedding and LM head.

    Args:
        config: from :func:`feature_config_for`.
        embed: the target's input embedding (shared).
        lm_head: the target's LM head (shared).
        head_ids: FR-Spec head set (vocabulary ids; None = the whole vocabulary).
    """

    head_ids: torch.Tensor  # registered buffers
    head_weight: torch.Tensor
    generation_config: GenerationConfig | None  # the target's, for callers that read it

    def __init__(
        self, config: LlamaConfig, embed: nn.Module, lm_head: nn.Module, head_ids: Sequence[int] | torch.Tensor | None
    ) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.config = config
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        with torch.random.fork_rng(devices=[]):  # default init draws from the global RNG; keep it untouched
            self.model = LlamaModel(config)
        self.model.register_module("embed_tokens", None)  # the target's embedding is shared
        self._shared = {"embed": embed, "lm_head": lm_head}  # not submodules: never saved, never trained
        width = _weight(lm_head).shape[0]
        ids = torch.arange(width) if head_ids is None else torch.unique(torch.as_tensor(head_ids, dtype=torch.long))
        if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= width:
            raise ValueError(f"head token ids must lie in [0, {width})")
        self.register_buffer("head_ids", ids, persistent=False)
        self.refresh_head()

    @property
    def logits_width(self) -> int:
        return _weight(self._shared["lm_head"]).shape[0]

    @property
    def layers(self) -> nn.ModuleList:
        return self.model.layers

    def refresh_head(self) -> None:
        """Recompute the restricted head weight [N, H] from the (shared) LM head."""
        with torch.no_grad():
            head = _weight(self._shared["lm_head"])
            weight = head.index_select(0, self.head_ids.to(head.device))
        self.register_buffer("head_weight", weight, persistent=False)
        if getattr(self, "head_weight_t", None) is not None:
            input_major_head(self)

    def input_major(self) -> tuple[int, int]:
        """Store fc and its decoder layers and the restricted head input-major for the CPU forward
        (specdec/models/layout.py); the shared embedding and LM head stay as they are.
        Returns (layers replaced, extra bytes)."""
        replaced, _ = use_input_major_linears(self)  # the shared modules are not submodules
        return replaced + 1, input_major_head(self)

    def kernel_root(self) -> nn.Module:
        """What the CPU kernel plan applies to (specdec/models/kernels.py): fc and its decoder layers
        (the shared embedding and LM head are not submodules)."""
        return self

    def own_state_dict(self) -> dict[str, torch.Tensor]:
        """What the draft stores: fc, its decoder layer and its final norm."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("model.embed_tokens")}

    def init_from_target(self, target: Any) -> None:
        """Start as the token-only draft of specdec/models/draft_model.py: layers copied from the
        target's (its first ones and its last), the target's final norm, and fc passing the token
        embedding through with the feature weighted 0 (training learns how much of f to take)."""
        for mine, theirs in zip(self.layers, init_layer_indices(cfg_layers(target.config), len(self.layers))):
            mine.load_state_dict(target.model.layers[theirs].state_dict())
        self.model.norm.load_state_dict(target.model.norm.state_dict())
        hidden = self.config.hidden_size
        with torch.no_grad():
            self.fc.weight.zero_()
            self.fc.weight[:, :hidden] = torch.eye(hidden)
            self.fc.bias.zero_()

    def inputs(self, next_ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """next_ids [B, t] (x_{j+1}), features [B, t, H] (f_j) -> layer inputs u [B, t, H]."""
        emb = self._shared["embed"](next_ids).to(features.dtype)
        return self.fc(torch.cat([emb, features], dim=-1))

    def restricted_logits(self, features: torch.Tensor) -> torch.Tensor:
        """[..., H] predicted features -> [..., N] logits over the head set."""
        return head_logits(features, self.head_weight, getattr(self, "head_weight_t", None))

    def full_logits(self, features: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., V] logits, -inf outside the head set (what the accept rule sees)."""
        sub = self.restricted_logits(features)
        logits = sub.new_full((*sub.shape[:-1], self.logits_width), float("-inf"))
        logits[..., self.head_ids] = sub
        return logits

    def forward(
        self, next_ids: torch.Tensor, features: torch.Tensor, position_ids: torch.Tensor, cache: Any = None
    ) -> torch.Tensor:
        """One pass: next_ids [B, t], features [B, t, H], position_ids [B, t] -> predicted features [B, t, H]."""
        out = self.model(
            inputs_embeds=self.inputs(next_ids, features),
            position_ids=position_ids,
            use_cache=cache is not None,
            **{cache_argument(self.model): cache},
        )
        return out.last_hidden_state

    # -- what the services' loading code asks of any model --------------------------------

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    def get_output_embeddings(self) -> nn.Module:
        return self._shared["lm_head"]

    def get_input_embeddings(self) -> nn.Module:
        return self._shared["embed"]


def build_feature_draft(
    target: Any, head_ids: Sequence[int] | torch.Tensor | None, layers: int = 1
) -> FeatureDraftModel:
    """A feature draft around `target`'s shared embedding and LM head, in the target's dtype and device."""
    draft = FeatureDraftModel(
        feature_config_for(target.config, layers),
        target.get_input_embeddings(),
        target.get_output_embeddings(),
        head_ids,
    )
    draft.to(dtype=target.dtype, device=target.device)
    draft.head_ids = draft.head_ids.to(target.device)
    draft.refresh_head()
    draft.generation_config = copy.deepcopy(getattr(target, "generation_config", None))
    return draft


def save_feature_draft(
    directory: str | Path,
    draft: FeatureDraftModel,
    target_spec: str,
    meta: dict[str, Any] | None = None,
    card: str | None = None,
) -> Path:
    """Write draft_config.json (architecture "eagle") + model.safetensors (own weights fp16, head ids)."""
    config = {
        "target": target_spec,
        "architecture": ARCHITECTURE,
        "feature": FEATURE,
        "layers": draft.config.num_hidden_layers,
        "hidden_size": draft.config.hidden_size,
        "logits_width": draft.logits_width,
    }
    return write_draft(
        directory, draft.own_state_dict(), draft.head_ids, config, ["embed_tokens", "lm_head"], meta, card
    )


def assemble_feature_draft(target: Any, directory: str | Path) -> FeatureDraftModel:
    """Build the feature draft stored in `directory` around an already loaded target."""
    from safetensors.torch import load_file

    tensors = load_file(str(Path(directory) / WEIGHTS))
    head_ids = tensors.pop(HEAD_KEY).long()
    draft = build_feature_draft(target, head_ids, int(read_draft_config(directory).get("layers", 1)))
    missing, unexpected = draft.load_state_dict({k: v.to(draft.dtype) for k, v in tensors.items()}, strict=False)
    missing = [k for k in missing if not k.startswith("model.embed_tokens")]
    if missing or unexpected:
        raise ValueError(f"feature draft weights do not match: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return draft.eval()
