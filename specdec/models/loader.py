"""Load tokenizers and causal LMs from any :mod:`specdec.models.spec` source.

* Hub specs (``hf:``/``modelscope:``) are resolved through the hub's
  ``snapshot_download`` into ``<cache_dir>/hub/<source>/``. A cached snapshot is
  used without touching the network; otherwise it is downloaded unless offline
  mode is on.
* GGUF files (local, from a hub, or the embedded SmolLM2) are dequantised once by
  transformers and the result is cached as an ordinary model directory under
  ``<cache_dir>/converted/<first 16 hex of the file's sha256>/``, written
  atomically (temp dir + rename); later loads read that copy.
* Every failure is a :class:`~specdec.models.spec.ModelLoadError` subclass with a
  one-line message (the CLI prints it and exits 2).

Nothing here imports the package that carries the embedded model; it is located
with :func:`importlib.util.find_spec`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specdec.models.spec import (
    EMBEDDED_MODELS,
    SOURCE_EMBEDDED,
    SOURCE_GGUF,
    SOURCE_HF,
    SOURCE_LOCAL,
    SOURCE_MODELSCOPE,
    HubUnreachableError,
    ModelLoadError,
    ModelNotCachedError,
    ModelNotFoundError,
    ModelOutOfMemoryError,
    ModelSpec,
    ModelSpecError,
    UnsupportedModelError,
    parse_model_spec,
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
    "check_cache_truncatable",
    "embedded_gguf_path",
    "ensure_converted_gguf",
    "gguf_sha256",
    "load_causal_lm",
    "load_tokenizer",
    "resolve_gguf_file",
    "resolve_model_dir",
]

logger = logging.getLogger("specdec.models")

ENV_CACHE_DIR = "SPECDEC_MODEL_CACHE_DIR"
DEFAULT_CACHE_DIR = "~/.cache/specdec"
OFFLINE_ENV_VARS = ("HF_HUB_OFFLINE", "MODELSCOPE_OFFLINE", "SPECDEC_OFFLINE")
_TRUTHY = frozenset({"1", "true", "yes", "on"})
HUB_SUBDIR = "hub"
CONVERTED_SUBDIR = "converted"
HASH_INDEX_FILE = "gguf-hash-index.json"
CONVERSION_MARKER = "specdec-conversion.json"
TMP_PREFIX = ".tmp-"
HASH_CHUNK_BYTES = 8 * 1024 * 1024
HASH_PREFIX_HEX = 16
MAX_HASH_INDEX_ENTRIES = 256
STALE_TMP_SECONDS = 3600
#: mkdtemp/mkstemp create 0700/0600; cache entries are shared, so publish them as 0755/0644.
CACHE_DIR_MODE = 0o755
CACHE_FILE_MODE = 0o644
MAX_ERROR_CHARS = 240
#: dtype the GGUF is dequantised to for the converted cache (exact for every GGUF quant type).
CONVERSION_DTYPE = torch.float32
TOKENIZER_PATTERNS = ("*.json", "*.model", "*.tiktoken", "*.txt", "*.jinja", "tokenizer*")
WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.pt")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
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
_SOURCE_LABELS = {SOURCE_HF: "Hugging Face Hub", SOURCE_MODELSCOPE: "ModelScope"}
_NOT_FOUND_ERRORS = frozenset({
    "RepositoryNotFoundError", "RevisionNotFoundError", "GatedRepoError",
    "RemoteEntryNotFoundError", "NotExistError", "NoValidRevisionError",
})
_NOT_CACHED_ERRORS = frozenset({"LocalEntryNotFoundError", "CacheNotFound", "IncompleteSnapshotError"})
_NETWORK_ERRORS = frozenset({
    "ConnectionError", "ConnectError", "TimeoutError", "Timeout", "TimeoutException",
    "HTTPError", "HfHubHTTPError", "NetworkError", "RequestException", "TransportError",
    "OfflineModeIsEnabled", "HubError", "ProxyError", "SSLError", "MaxRetryError",
    "NewConnectionError", "gaierror",
})
#: Architectures whose state is not a plain per-token KV cache (cannot be rolled back by truncation).
NON_TRUNCATABLE_MODEL_TYPES = frozenset({
    "mamba", "mamba2", "falcon_mamba", "rwkv", "rwkv5", "rwkv6", "rwkv7", "recurrent_gemma",
    "jamba", "zamba", "zamba2", "bamba", "falcon_h1", "granitemoehybrid", "nemotron_h", "lfm2",
    "lfm2_moe", "qwen3_next", "minimax", "xlstm", "plamo2", "xlnet", "reformer", "mllama",
})
_NON_TRUNCATABLE_ARCH_WORDS = ("mamba", "rwkv", "recurrent", "jamba", "hybrid", "xlstm")
FULL_ATTENTION_LAYER_TYPES = frozenset({"full_attention", "attention"})
_MILLION = 1_000_000
_OOM_PHRASES = ("out of memory", "can't allocate memory", "cannot allocate memory")


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


def _one_line(exc: BaseException) -> str:
    """Return the first non-empty line of an exception's message, bounded in length."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "..."


def _as_spec(spec: ModelSpec | str) -> ModelSpec:
    """Accept a ModelSpec or spec text."""
    return spec if isinstance(spec, ModelSpec) else parse_model_spec(spec)


def _exception_names(exc: BaseException) -> set[str]:
    """Return the class names in an exception's MRO (hub libraries vary by version)."""
    return {cls.__name__ for cls in type(exc).__mro__}


# --------------------------------------------------------------------------- embedded / local


def embedded_gguf_path(name: str) -> Path:
    """Return the GGUF path of an embedded model, located via find_spec (never imported)."""
    entry = EMBEDDED_MODELS.get(name)
    if entry is None:
        raise ModelNotFoundError(f"unknown embedded model {name!r} (known: {', '.join(EMBEDDED_MODELS)})")
    found = importlib.util.find_spec(entry.package)
    if found is None or not found.origin:
        raise ModelNotFoundError(
            f"embedded model {name} needs the Python package {entry.pypi_name} "
            f"(pip install {entry.pypi_name}); it is not installed"
        )
    path = Path(found.origin).parent / entry.filename
    if not path.is_file():
        raise ModelNotFoundError(f"embedded model {name}: {path} is missing from package {entry.pypi_name}")
    return path


def _local_dir(spec: ModelSpec) -> Path:
    """Return an existing local model directory or raise ModelNotFoundError."""
    path = Path(spec.name).expanduser()
    if not path.is_dir():
        raise ModelNotFoundError(f"local model directory {path} does not exist")
    return path


# --------------------------------------------------------------------------- hubs


def _hub_download_fn(source: str) -> Callable[..., str]:
    """Return the hub's snapshot_download, looked up at call time (so tests can patch it)."""
    if source == SOURCE_MODELSCOPE:
        import modelscope  # noqa: PLC0415 - heavy import, only when needed

        return modelscope.snapshot_download
    import huggingface_hub  # noqa: PLC0415

    return huggingface_hub.snapshot_download


def _has_any(path: Path, names: Iterable[str]) -> bool:
    """True when ``path`` holds a file matching any of the glob patterns ``names``."""
    return any(next(path.glob(name), None) is not None for name in names)


def _snapshot_usable(path: Path, spec: ModelSpec, need_weights: bool) -> bool:
    """True when a snapshot dir holds what the caller needs (weights, GGUF or tokenizer files)."""
    if spec.gguf_file:
        return (path / spec.gguf_file).is_file()
    if need_weights:
        return _has_any(path, WEIGHT_GLOBS)
    return _has_any(path, TOKENIZER_FILES)


def _classify_hub_error(exc: BaseException, spec: ModelSpec) -> ModelLoadError:
    """Map a hub library exception to a one-line ModelLoadError subclass."""
    label = _SOURCE_LABELS.get(spec.source, spec.source)
    names = _exception_names(exc)
    revision = f" at revision {spec.revision}" if spec.revision else ""
    if names & _NOT_FOUND_ERRORS:
        return ModelNotFoundError(f"{label} has no model {spec.name}{revision} ({spec}): {_one_line(exc)}")
    if names & (_NETWORK_ERRORS | _NOT_CACHED_ERRORS):
        return HubUnreachableError(f"cannot reach {label} to download {spec}: {_one_line(exc)}")
    return ModelLoadError(f"downloading {spec} from {label} failed: {type(exc).__name__}: {_one_line(exc)}")


def _hub_snapshot(spec: ModelSpec, cfg: LoadConfig, need_weights: bool) -> tuple[Path, bool]:
    """Return (snapshot dir, was already cached); download unless offline."""
    download = _hub_download_fn(spec.source)
    cache = cfg.cache_root() / HUB_SUBDIR / spec.source
    patterns = [spec.gguf_file] if spec.gguf_file else (None if need_weights else list(TOKENIZER_PATTERNS))
    kwargs = {"revision": spec.revision, "cache_dir": str(cache), "allow_patterns": patterns}
    try:
        cached = Path(download(spec.name, local_files_only=True, **kwargs))
        if _snapshot_usable(cached, spec, need_weights):
            return cached, True
    except Exception as exc:  # noqa: BLE001 - hub libraries raise many unrelated types
        if not _exception_names(exc) & _NOT_CACHED_ERRORS:
            raise _classify_hub_error(exc, spec) from exc
    if cfg.offline:
        raise ModelNotCachedError(f"model {spec} is not in the cache {cache} and offline mode is on")
    logger.info("downloading %s from %s into %s", spec, _SOURCE_LABELS[spec.source], cache)
    try:
        path = Path(download(spec.name, local_files_only=False, **kwargs))
    except Exception as exc:  # noqa: BLE001 - hub libraries raise many unrelated types
        raise _classify_hub_error(exc, spec) from exc
    if not _snapshot_usable(path, spec, need_weights):
        raise ModelNotFoundError(f"{_SOURCE_LABELS[spec.source]} snapshot of {spec} at {path} has no usable files")
    return path, False


def _resolve(spec: ModelSpec, cfg: LoadConfig, need_weights: bool) -> tuple[Path, bool]:
    """Return (directory, from cache) for a spec; GGUF specs give the GGUF's directory."""
    if spec.source in _SOURCE_LABELS:
        return _hub_snapshot(spec, cfg, need_weights)
    if spec.source == SOURCE_EMBEDDED:
        return embedded_gguf_path(spec.name).parent, False
    if spec.source == SOURCE_GGUF:
        path = Path(spec.name).expanduser() / str(spec.gguf_file)
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file {path} does not exist")
        return path.parent, False
    if spec.source == SOURCE_LOCAL:
        return _local_dir(spec), False
    raise ModelSpecError(f"invalid model spec {spec}: unknown source {spec.source!r}")


def resolve_model_dir(spec: ModelSpec | str, cfg: LoadConfig | None = None) -> Path:
    """Return the local directory holding the model (downloading a hub snapshot if needed).

    For GGUF specs this is the directory that contains the GGUF file (see
    :func:`resolve_gguf_file` and :func:`ensure_converted_gguf`).

    Raises:
        ModelNotCachedError: offline mode is on and the hub model is not cached.
        HubUnreachableError: the hub could not be reached.
        ModelNotFoundError: unknown model id / revision, missing directory or file.
    """
    return _resolve(_as_spec(spec), cfg or LoadConfig(), need_weights=True)[0]


def resolve_gguf_file(spec: ModelSpec | str, cfg: LoadConfig | None = None) -> tuple[Path, bool]:
    """Return (GGUF file path, came from an existing hub cache) for a GGUF or embedded spec."""
    spec = _as_spec(spec)
    if not spec.is_gguf:
        raise ModelSpecError(f"invalid model spec {spec}: not a GGUF model")
    directory, cached = _resolve(spec, cfg or LoadConfig(), need_weights=True)
    if spec.source == SOURCE_EMBEDDED:
        return embedded_gguf_path(spec.name), cached
    return directory / str(spec.gguf_file), cached


# --------------------------------------------------------------------------- GGUF conversion cache


def _hash_file(path: Path) -> str:
    """Return the full sha256 hex digest of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to ``path`` via a temp file in the same directory and os.replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
        os.chmod(tmp, CACHE_FILE_MODE)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def gguf_sha256(path: Path, index_path: Path | None = None) -> str:
    """Return the sha256 of a file, memoised in ``index_path`` keyed by (real path, size, mtime)."""
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    index: dict[str, str] = {}
    if index_path is not None and index_path.is_file():
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            logger.warning("ignoring unreadable hash index %s: %s", index_path, exc)
    if key in index:
        return index[key]
    started = time.perf_counter()
    digest = _hash_file(path)
    logger.info("hashed %s in %.2f s", path, time.perf_counter() - started)
    if index_path is not None:
        index.pop(key, None)
        index[key] = digest
        trimmed = dict(list(index.items())[-MAX_HASH_INDEX_ENTRIES:])
        try:
            _write_json_atomic(index_path, trimmed)
        except OSError as exc:
            logger.warning("could not write hash index %s: %s", index_path, exc)
    return digest


def _conversion_complete(path: Path) -> bool:
    """True when a converted directory has its marker, config and weights."""
    return (path / CONVERSION_MARKER).is_file() and (path / "config.json").is_file() and _has_any(
        path, WEIGHT_GLOBS
    )


def _remove_stale_tmp(parent: Path) -> None:
    """Delete temp build dirs older than STALE_TMP_SECONDS left by crashed conversions."""
    now = time.time()
    for entry in parent.glob(f"{TMP_PREFIX}*"):
        try:
            if entry.is_dir() and now - entry.stat().st_mtime > STALE_TMP_SECONDS:
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            continue


def atomic_build_dir(final: Path, build: Callable[[Path], None]) -> bool:
    """Build a directory with ``build(tmp_dir)`` then rename it to ``final`` in one step.

    A crash or exception never leaves a partial ``final``; the temp dir is removed on
    failure. Returns True if this call created ``final``, False if another process
    won the race (its copy is kept).
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(final.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{final.name}-", dir=final.parent))
    try:
        build(tmp)
        os.chmod(tmp, CACHE_DIR_MODE)
        try:
            os.rename(tmp, final)
        except OSError:
            if final.is_dir():
                logger.info("another process already wrote %s; using it", final)
                return False
            raise
        return True
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _strip_gguf_quantizer(model: Any) -> None:
    """Mark a GGUF-loaded (already dequantised) model as plain so save_pretrained accepts it."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def _convert_gguf(gguf_path: Path, digest: str, out_dir: Path) -> None:
    """Dequantise ``gguf_path`` with transformers and save model + tokenizer into ``out_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415
    from transformers import __version__ as transformers_version  # noqa: PLC0415

    kwargs = {"gguf_file": gguf_path.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), **kwargs)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), dtype=CONVERSION_DTYPE, **kwargs)
    check_cache_truncatable(model.config, str(gguf_path))
    _strip_gguf_quantizer(model)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    marker = {
        "gguf": str(gguf_path),
        "sha256": digest,
        "transformers": transformers_version,
        "dtype": str(CONVERSION_DTYPE),
        "created": time.time(),
    }
    _write_json_atomic(out_dir / CONVERSION_MARKER, marker)


def converted_gguf_dir(gguf_path: Path, cfg: LoadConfig) -> Path:
    """Return where the converted copy of ``gguf_path`` lives (it may not exist yet)."""
    root = cfg.cache_root() / CONVERTED_SUBDIR
    return root / gguf_sha256(gguf_path, root / HASH_INDEX_FILE)[:HASH_PREFIX_HEX]


def ensure_converted_gguf(spec: ModelSpec | str, cfg: LoadConfig | None = None) -> tuple[Path, bool]:
    """Return (converted model dir, was already cached), converting the GGUF if needed."""
    cfg = cfg or LoadConfig()
    gguf_path, _ = resolve_gguf_file(spec, cfg)
    target = converted_gguf_dir(gguf_path, cfg)
    if _conversion_complete(target):
        return target, True
    if target.exists():
        logger.warning("removing incomplete converted copy %s", target)
        shutil.rmtree(target, ignore_errors=True)
    logger.info("converting GGUF %s to %s (one time; dequantising takes a while)", gguf_path, target)
    started = time.perf_counter()
    digest = gguf_sha256(gguf_path, target.parent / HASH_INDEX_FILE)
    atomic_build_dir(target, lambda out: _convert_gguf(gguf_path, digest, out))
    logger.info("converted %s in %.1f s", gguf_path.name, time.perf_counter() - started)
    return target, False


# --------------------------------------------------------------------------- architecture check


def _cfg_get(config: Any, key: str, default: Any = None) -> Any:
    """Read a field from a transformers config object or a plain dict."""
    if isinstance(config, dict):
        return config.get(key, default)
    return getattr(config, key, default)


def _text_config(config: Any) -> Any:
    """Return the decoder text config of multimodal configs, else the config itself."""
    getter = getattr(config, "get_text_config", None)
    if callable(getter):
        try:
            return getter(decoder=True)
        except (TypeError, ValueError):
            return getter()
    return _cfg_get(config, "text_config") or config


def _layer_type_blocker(text: Any) -> str | None:
    """Return why per-layer attention types prevent exact truncation, or None."""
    layer_types = _cfg_get(text, "layer_types")
    if not layer_types:
        return None
    other = sorted({str(kind) for kind in layer_types} - FULL_ATTENTION_LAYER_TYPES)
    return f"it has {'/'.join(other)} layers (layer_types)" if other else None


def _sliding_window_blocker(text: Any) -> str | None:
    """Return why a sliding window (with no layer_types) prevents exact truncation, or None."""
    window = _cfg_get(text, "sliding_window")
    if not window or not _cfg_get(text, "use_sliding_window", True):
        return None
    max_positions = _cfg_get(text, "max_position_embeddings")
    if max_positions is not None and window >= max_positions:
        return None
    return f"it uses sliding-window attention (sliding_window={window})"


def _truncation_blocker(config: Any) -> str | None:
    """Return a reason the model's cache cannot be truncated exactly, or None if it can."""
    if _cfg_get(config, "is_encoder_decoder", False):
        return "it is an encoder-decoder model"
    text = _text_config(config)
    for model_type in {_cfg_get(config, "model_type"), _cfg_get(text, "model_type")}:
        if model_type in NON_TRUNCATABLE_MODEL_TYPES:
            return f"{model_type} is a hybrid, linear-attention or state-space architecture"
    for arch in _cfg_get(config, "architectures") or []:
        if any(word in arch.lower() for word in _NON_TRUNCATABLE_ARCH_WORDS):
            return f"{arch} is a hybrid, recurrent or state-space architecture"
    if _cfg_get(text, "attention_chunk_size"):
        return f"it uses chunked attention (attention_chunk_size={_cfg_get(text, 'attention_chunk_size')})"
    if _cfg_get(text, "layer_types"):
        return _layer_type_blocker(text)
    return _sliding_window_blocker(text)


def check_cache_truncatable(model_config: Any, model_name: str | None = None) -> None:
    """Refuse models whose KV cache cannot be truncated exactly to drop rejected draft tokens.

    Refused: sliding-window attention actually in use (``sliding_window`` set, smaller
    than ``max_position_embeddings`` and ``use_sliding_window`` not false, or
    ``layer_types`` with any non-full-attention layer such as sliding/linear/chunked),
    hybrid / linear-attention / state-space architectures (mamba, rwkv, recurrent_gemma,
    jamba, ...), and encoder-decoder models.

    Raises:
        UnsupportedModelError: naming the model and the reason.
    """
    reason = _truncation_blocker(model_config)
    if reason is None:
        return
    name = model_name or _cfg_get(model_config, "_name_or_path") or _cfg_get(model_config, "model_type")
    raise UnsupportedModelError(
        f"model {name} is not supported: {reason}; speculative decoding needs a KV cache "
        "that can be truncated exactly to roll back rejected draft tokens"
    )


# --------------------------------------------------------------------------- loading


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
        return ModelOutOfMemoryError(f"out of memory loading {spec} on {where}: {_one_line(exc)}")
    text = _one_line(exc)
    if isinstance(exc, (KeyError, ValueError)) and ("model type" in text or "architecture" in text):
        return UnsupportedModelError(f"model {spec} has an unsupported architecture: {text}")
    return ModelLoadError(f"cannot load {what} of {spec}: {type(exc).__name__}: {text}")


def _tokenizer_source(spec: ModelSpec, cfg: LoadConfig) -> tuple[str, dict[str, Any]]:
    """Return (path, from_pretrained kwargs) to read a tokenizer from, without loading weights."""
    if spec.is_gguf:
        gguf_path, _ = resolve_gguf_file(spec, cfg)
        converted = converted_gguf_dir(gguf_path, cfg)
        if _conversion_complete(converted):
            return str(converted), {}
        return str(gguf_path.parent), {"gguf_file": gguf_path.name}
    directory, _ = _resolve(spec, cfg, need_weights=False)
    return str(directory), {}


def _is_trained_draft(spec: ModelSpec) -> bool:
    """A local directory holding a specdec draft (draft_config.json), see specdec.models.draft_model."""
    return spec.source == SOURCE_LOCAL and (Path(spec.name).expanduser() / "draft_config.json").is_file()


def load_tokenizer(spec: ModelSpec | str, cfg: LoadConfig | None = None) -> Any:
    """Load only the tokenizer of a model (no weights; hub specs fetch tokenizer files only).

    GGUF specs read the converted copy's tokenizer when it exists, else the GGUF itself.
    """
    spec, cfg = _as_spec(spec), cfg or LoadConfig()
    if _is_trained_draft(spec):  # a specdec draft uses its target's tokenizer
        from specdec.models.draft_model import read_draft_config, target_spec_of  # noqa: PLC0415

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
    directory, cached = _resolve(spec, cfg, need_weights=True)
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
        model = model.to(device).eval()
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
    spec, cfg = _as_spec(spec), cfg or LoadConfig()
    if _is_trained_draft(spec):  # a specdec draft: target's shared tensors + its own layers
        from specdec.models.draft_model import load_trained_draft  # noqa: PLC0415

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
        spec, elapsed, "from cache" if from_cache else "fresh",
        sum(p.numel() for p in model.parameters()) / _MILLION,
    )
    return LoadedModel(model, tokenizer, spec, str(spec), elapsed, from_cache)
