"""Where and how to load a model (:class:`LoadConfig`) and what a load returns (:class:`LoadedModel`).

Also the two helpers every loading module shares: :func:`as_spec` and :func:`one_line` (exception
messages cut to one bounded line: every load failure is a one-line
:class:`~specdec.models.spec.ModelLoadError`, which the CLI prints before exiting 2).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specdec.models.spec import ModelLoadError, ModelSpec, parse_model_spec

ENV_CACHE_DIR = "SPECDEC_MODEL_CACHE_DIR"
DEFAULT_CACHE_DIR = "~/.cache/specdec"
OFFLINE_ENV_VARS = ("HF_HUB_OFFLINE", "MODELSCOPE_OFFLINE", "SPECDEC_OFFLINE")
_TRUTHY = frozenset({"1", "true", "yes", "on"})
MAX_ERROR_CHARS = 240
DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}
AUTO = "auto"


class LoadConfigError(ModelLoadError, ValueError):
    """A LoadConfig field has a value that cannot be used (bad dtype, unavailable device)."""


def _env_offline() -> bool:
    """Return True when any of HF_HUB_OFFLINE / MODELSCOPE_OFFLINE / SPECDEC_OFFLINE is truthy."""
    return any(os.environ.get(name, "").strip().lower() in _TRUTHY for name in OFFLINE_ENV_VARS)


@dataclass
class LoadConfig:
    """Where and how to load a model.

    Attributes:
        device: ``auto`` (cuda when available, else cpu), ``cpu``, ``cuda``, ``cuda:N``.
        dtype: ``auto`` (float32 on CPU, bfloat16 on CUDA) or float32/bfloat16/float16.
        cache_dir: root of the specdec model cache; None means $SPECDEC_MODEL_CACHE_DIR,
            else ~/.cache/specdec.
        offline: never touch the network (default: HF_HUB_OFFLINE / MODELSCOPE_OFFLINE /
            SPECDEC_OFFLINE set to 1/true/yes/on).
        threads: torch intra-op threads to use (process-wide); None leaves torch's default.
    """

    device: str = AUTO
    dtype: str = AUTO
    cache_dir: str | None = None
    offline: bool = field(default_factory=_env_offline)
    threads: int | None = None

    def __post_init__(self) -> None:
        """Validate dtype, device syntax and threads early, with one-line errors."""
        if self.dtype != AUTO and self.dtype.lower() not in DTYPES:
            raise LoadConfigError(f"unknown dtype {self.dtype!r} (use auto, {', '.join(DTYPES)})")
        if self.device != AUTO:
            try:
                torch.device(self.device)
            except (RuntimeError, ValueError) as exc:
                raise LoadConfigError(f"unknown device {self.device!r}: {exc}") from exc
        if self.threads is not None and self.threads < 1:
            raise LoadConfigError(f"threads must be >= 1, got {self.threads}")

    def torch_device(self) -> torch.device:
        """Return the device to load onto; raise LoadConfigError if CUDA is asked for but absent."""
        if self.device == AUTO:
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        device = torch.device(self.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise LoadConfigError(f"device {self.device!r} requested but CUDA is not available")
        return device

    def torch_dtype(self, device: torch.device | None = None) -> torch.dtype:
        """Return the explicit torch dtype (auto: bfloat16 on CUDA, float32 elsewhere)."""
        if self.dtype != AUTO:
            return DTYPES[self.dtype.lower()]
        device = device or self.torch_device()
        return torch.bfloat16 if device.type == "cuda" else torch.float32

    def cache_root(self) -> Path:
        """Return the cache root: cache_dir, else $SPECDEC_MODEL_CACHE_DIR, else ~/.cache/specdec."""
        raw = self.cache_dir or os.environ.get(ENV_CACHE_DIR) or DEFAULT_CACHE_DIR
        return Path(raw).expanduser()


@dataclass
class LoadedModel:
    """A model ready for inference.

    Attributes:
        model: the transformers causal LM, in eval mode, on the configured device.
        tokenizer: its tokenizer.
        spec: the parsed spec it came from.
        model_id: canonical spec text (``str(spec)``), for logs and metadata.
        load_seconds: wall time of the whole load (resolve, convert, read weights).
        from_cache: True when weights came from a cache this module manages (an existing hub
            snapshot or converted GGUF copy) instead of a fresh download or conversion;
            always False for a local directory.
    """

    model: Any
    tokenizer: Any
    spec: ModelSpec
    model_id: str
    load_seconds: float
    from_cache: bool


def load_config(device: str = AUTO, dtype: str = AUTO, cache_dir: str = "", offline: bool = False) -> LoadConfig:
    """A LoadConfig from service settings: "" cache_dir is the default; offline=False keeps LoadConfig's
    own default (HF_HUB_OFFLINE and friends)."""
    extra = {"offline": True} if offline else {}
    return LoadConfig(device=device, dtype=dtype, cache_dir=cache_dir or None, **extra)


def one_line(exc: BaseException) -> str:
    """Return the first non-empty line of an exception's message, bounded in length."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "..."


def as_spec(spec: ModelSpec | str) -> ModelSpec:
    """Accept a ModelSpec or spec text."""
    return spec if isinstance(spec, ModelSpec) else parse_model_spec(spec)
