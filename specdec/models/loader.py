"""Load tokenizers and causal LMs from any :mod:`specdec.models.spec` source.

The pieces: where and how (:mod:`specdec.models.load_config`), finding the files, hub downloads
included (:mod:`specdec.models.resolve`), the converted-GGUF cache (:mod:`specdec.models.gguf_cache`),
which architectures can be served (:mod:`specdec.models.architecture`), the trained-draft format
(:mod:`specdec.models.draft_format`). This module puts them together; every failure is a
:class:`~specdec.models.spec.ModelLoadError` subclass with a one-line message (the CLI prints it and
exits 2).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from specdec.models.architecture import check_cache_truncatable
from specdec.models.draft_format import is_draft_dir, read_draft_config, target_spec_of
from specdec.models.gguf_cache import conversion_complete, converted_gguf_dir, ensure_converted_gguf
from specdec.models.load_config import LoadConfig, LoadConfigError, LoadedModel, as_spec, one_line
from specdec.models.resolve import resolve_gguf_file, resolve_spec
from specdec.models.spec import (
    SOURCE_LOCAL,
    HubUnreachableError,
    ModelLoadError,
    ModelNotCachedError,
    ModelNotFoundError,
    ModelOutOfMemoryError,
    ModelSpec,
    ModelSpecError,
    UnsupportedModelError,
)

__all__ = [
    "HubUnreachableError",
    "LoadConfig",
    "LoadConfigError",
    "LoadedModel",
    "ModelLoadError",
    "ModelNotCachedError",
    "ModelNotFoundError",
    "ModelOutOfMemoryError",
    "ModelSpecError",
    "UnsupportedModelError",
    "load_causal_lm",
    "load_tokenizer",
    "load_trained_draft",
]

logger = logging.getLogger("specdec.models")

_MILLION = 1_000_000
_OOM_PHRASES = ("out of memory", "can't allocate memory", "cannot allocate memory")


def _is_oom(exc: BaseException) -> bool:
    """True for torch / host out-of-memory errors raised while loading."""
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(p in str(exc).lower() for p in _OOM_PHRASES)


def _wrap_load_error(exc: BaseException, spec: ModelSpec, what: str, where: str) -> ModelLoadError:
    """Turn a transformers/torch exception during loading into a one-line ModelLoadError."""
    if isinstance(exc, ModelLoadError):
        return exc
    if _is_oom(exc):
        return ModelOutOfMemoryError(f"out of memory loading {spec} on {where}: {one_line(exc)}")
    text = one_line(exc)
    if isinstance(exc, (KeyError, ValueError)) and ("model type" in text or "architecture" in text):
        return UnsupportedModelError(f"model {spec} has an unsupported architecture: {text}")
    return ModelLoadError(f"cannot load {what} of {spec}: {type(exc).__name__}: {text}")


def _tokenizer_source(spec: ModelSpec, cfg: LoadConfig) -> tuple[str, dict[str, Any]]:
    """Return (path, from_pretrained kwargs) to read a tokenizer from, without loading weights."""
    if spec.is_gguf:
        gguf_path, _ = resolve_gguf_file(spec, cfg)
        converted = converted_gguf_dir(gguf_path, cfg)
        if conversion_complete(converted):
            return str(converted), {}
        return str(gguf_path.parent), {"gguf_file": gguf_path.name}
    directory, _ = resolve_spec(spec, cfg, need_weights=False)
    return str(directory), {}


def _is_trained_draft(spec: ModelSpec) -> bool:
    """A local directory holding a specdec draft (draft_config.json, specdec/models/draft_format.py)."""
    return spec.source == SOURCE_LOCAL and is_draft_dir(Path(spec.name).expanduser())


def load_tokenizer(spec: ModelSpec | str, cfg: LoadConfig | None = None) -> Any:
    """Load only the tokenizer of a model (no weights; hub specs fetch tokenizer files only).

    GGUF specs read the converted copy's tokenizer when it exists, else the GGUF itself.
    """
    spec, cfg = as_spec(spec), cfg or LoadConfig()
    if _is_trained_draft(spec):  # a specdec draft uses its target's tokenizer
        return load_tokenizer(target_spec_of(spec.name, read_draft_config(spec.name)), cfg)
    from transformers import AutoTokenizer  # noqa: PLC0415

    started = time.perf_counter()
    path, kwargs = _tokenizer_source(spec, cfg)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, **kwargs)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise _wrap_load_error(exc, spec, "the tokenizer", path) from exc
    logger.info("loaded tokenizer of %s in %.2f s", spec, time.perf_counter() - started)
    return tokenizer


def _weights_dir(spec: ModelSpec, cfg: LoadConfig) -> tuple[Path, bool]:
    """Return (directory with config + weights + tokenizer, from cache)."""
    if spec.is_gguf:
        return ensure_converted_gguf(spec, cfg)
    directory, cached = resolve_spec(spec, cfg, need_weights=True)
    if not (directory / "config.json").is_file():
        raise ModelNotFoundError(f"model directory {directory} of {spec} has no config.json")
    return directory, cached


def _read_model(directory: Path, spec: ModelSpec, device: torch.device, dtype: torch.dtype) -> tuple[Any, Any]:
    """Load (model, tokenizer) from a local directory onto ``device`` as ``dtype``, in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

    try:
        config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
        check_cache_truncatable(config, str(spec))
        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        device_map = None if device.type == "cpu" else str(device)  # load straight onto the GPU
        model = AutoModelForCausalLM.from_pretrained(
            str(directory), config=config, dtype=dtype, device_map=device_map, local_files_only=True
        )
        model = model.to(device).eval()  # type: ignore[arg-type]  # transformers' wraps-decorated to
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, MemoryError) as exc:
        raise _wrap_load_error(exc, spec, "the model", f"{device} as {dtype}") from exc
    return model, tokenizer


def load_causal_lm(spec: ModelSpec | str, cfg: LoadConfig | None = None) -> LoadedModel:
    """Resolve, (download/convert,) and load a causal LM and its tokenizer for inference.

    The model is loaded with an explicit torch dtype (transformers 5 would default to
    ``dtype="auto"``), put in eval mode and moved to ``cfg``'s device. Architectures
    whose KV cache cannot be truncated exactly are refused (:func:`check_cache_truncatable`).

    Raises:
        ModelLoadError: (or a subclass) with a one-line message for every failure.
    """
    spec, cfg = as_spec(spec), cfg or LoadConfig()
    if _is_trained_draft(spec):  # a specdec draft: target's shared tensors + its own layers
        return load_trained_draft(Path(spec.name), cfg)
    started = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = cfg.torch_device()
    dtype = cfg.torch_dtype(device)
    logger.info("loading %s on %s as %s", spec, device, dtype)
    directory, from_cache = _weights_dir(spec, cfg)
    model, tokenizer = _read_model(directory, spec, device, dtype)
    elapsed = time.perf_counter() - started
    logger.info(
        "loaded %s in %.1f s (%s, %.0fM parameters)",
        spec,
        elapsed,
        "from cache" if from_cache else "fresh",
        sum(p.numel() for p in model.parameters()) / _MILLION,
    )
    return LoadedModel(model, tokenizer, spec, str(spec), elapsed, from_cache)


def load_trained_draft(directory: str | Path, cfg: LoadConfig | None = None) -> LoadedModel:
    """Load the target named in DIR/draft_config.json (normal spec machinery) and assemble the draft
    around its shared tensors: a feature draft (architecture "eagle") or a token draft.

    Returns a LoadedModel whose tokenizer is the target's.
    """
    from specdec.models.draft_model import assemble  # noqa: PLC0415 - torch modules, only for drafts
    from specdec.models.feature_draft import ARCHITECTURE as FEATURE_ARCHITECTURE  # noqa: PLC0415
    from specdec.models.feature_draft import assemble_feature_draft  # noqa: PLC0415

    started = time.perf_counter()
    directory = Path(directory)
    try:
        config = read_draft_config(directory)
        target = load_causal_lm(target_spec_of(directory, config), cfg or LoadConfig())
        build = assemble_feature_draft if config.get("architecture") == FEATURE_ARCHITECTURE else assemble
        draft = build(target.model, directory)
    except ModelLoadError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelLoadError(f"cannot load the draft in {directory}: {str(exc).splitlines()[0]}") from exc
    spec = ModelSpec(source=SOURCE_LOCAL, name=str(directory))
    return LoadedModel(draft, target.tokenizer, spec, str(spec), time.perf_counter() - started, target.from_cache)
