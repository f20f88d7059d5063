"""The on-disk format of a trained draft, shared by the token draft (specdec/models/draft_model.py), the
feature draft (specdec/models/feature_draft.py) and the loader (specdec/models/loader.py)::

    DIR/draft_config.json   {"kind": "specdec-draft", "target": SPEC, "architecture": ..., "layers": L, ...}
    DIR/model.safetensors   the draft's own weights (fp16) + "head_token_ids" (int32)
    DIR/MODEL_CARD.md

Nothing here knows a draft architecture; the two draft modules build on it and never import each other.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

DRAFT_CONFIG = "draft_config.json"
WEIGHTS = "model.safetensors"
HEAD_KEY = "head_token_ids"
KIND = "specdec-draft"
FORMAT_VERSION = 1
STORE_DTYPE = torch.float16


def is_draft_dir(path: str | Path) -> bool:
    """True for a directory holding a trained draft (a ``draft_config.json``)."""
    return (Path(path) / DRAFT_CONFIG).is_file()


def init_layer_indices(target_layers: int, layers: int) -> list[int]:
    """Which target layers initialise the draft's: the first ones, and the last as the draft's last."""
    if layers == 1:
        return [0]
    return list(range(layers - 1)) + [target_layers - 1]


def cfg_layers(config: Any) -> int:
    """Decoder layers of a (possibly multimodal) transformers config."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text.num_hidden_layers)


def read_draft_config(directory: str | Path) -> dict[str, Any]:
    """DIR/draft_config.json; ValueError when it is not a specdec draft's."""
    path = Path(directory) / DRAFT_CONFIG
    config = json.loads(path.read_text())
    if config.get("kind") != KIND:
        raise ValueError(f"{path} is not a specdec draft (kind={config.get('kind')!r})")
    return config


def target_spec_of(directory: str | Path, config: dict[str, Any]) -> str:
    """The target's spec; a relative local path is taken relative to the draft directory."""
    spec = str(config["target"])
    if spec.startswith(("./", "../")):
        return str((Path(directory) / spec).resolve())
    return spec


def write_draft(
    directory: str | Path,
    own: dict[str, torch.Tensor],
    head_ids: torch.Tensor,
    config: dict[str, Any],
    shared: list[str],
    meta: dict[str, Any] | None = None,
    card: str | None = None,
) -> Path:
    """Write model.safetensors (``own`` weights in STORE_DTYPE, head ids [N] int32), then draft_config.json:
    kind, format version, ``config`` (target, architecture, sizes), head and dtype fields, the target
    modules it shares, then ``meta`` (e.g. the training summary) [+ MODEL_CARD.md]. Returns the directory."""
    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", STORE_DTYPE).contiguous() for k, v in own.items()}
    tensors[HEAD_KEY] = head_ids.detach().to("cpu", torch.int32).contiguous()
    tmp = out / (WEIGHTS + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt", "kind": KIND})
    tmp.replace(out / WEIGHTS)
    full = {
        "kind": KIND,
        "format_version": FORMAT_VERSION,
        **config,
        "head_tokens": int(head_ids.numel()),
        "head_token_ids_file": f"{WEIGHTS}:{HEAD_KEY}",
        "dtype": str(STORE_DTYPE).replace("torch.", ""),
        "shared_from_target": shared,
        **(meta or {}),
    }
    (out / DRAFT_CONFIG).write_text(json.dumps(full, indent=2) + "\n")
    if card is not None:
        (out / "MODEL_CARD.md").write_text(card)
    return out
