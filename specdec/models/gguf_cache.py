"""The converted-GGUF cache: a GGUF file (local, from a hub, or the embedded SmolLM2) is dequantised once
by transformers and the result is cached as an ordinary model directory under
``<cache_dir>/converted/<first 16 hex of the file's sha256>/``, written atomically (temp dir +
rename); later loads read that copy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from specdec.models.architecture import check_cache_truncatable
from specdec.models.load_config import LoadConfig
from specdec.models.resolve import WEIGHT_GLOBS, has_any, resolve_gguf_file
from specdec.models.spec import ModelSpec

logger = logging.getLogger("specdec.models")

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
#: dtype the GGUF is dequantised to for the converted cache (exact for every GGUF quant type).
CONVERSION_DTYPE = torch.float32


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


def conversion_complete(path: Path) -> bool:
    """True when a converted directory has its marker, config and weights."""
    return (path / CONVERSION_MARKER).is_file() and (path / "config.json").is_file() and has_any(path, WEIGHT_GLOBS)


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
    if conversion_complete(target):
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
