"""llama-cpp-python's C API, the few calls the llama.cpp runner makes, with llama.cpp's errors made ours.

The wheel is built portable (scripts/build_llamacpp.sh): ggml's CPU kernels are runtime-loaded variants
(libggml-cpu-<variant>.so beside libllama.so). llama.cpp looks for them beside the executable and in the
working directory only, so they are loaded here from the package's own folder, before any model; ggml
picks the best variant the CPU supports (`cpu_variant` says which).
"""

from __future__ import annotations

import ctypes
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from specdec.errors import ResourceExhausted, SpecDecError

log = logging.getLogger("specdec.engine.llamacpp")

DECODE_ERRORS = {
    1: "no KV-cache slot for the batch (the cache is full)",
    2: "aborted",
    -1: "invalid input batch",
}
KV_DTYPE_BYTES = 2  # f16 K and V (llama.cpp's default cache type)


class LlamaCppUnavailable(RuntimeError):
    """llama-cpp-python is not installed (or its library does not load)."""


class LlamaCppLib:
    """The loaded library: model and context lifetime, memory edits, decode, logits."""

    def __init__(self, module: Any) -> None:
        self.c = module
        self.llama_batch = module.llama_batch
        self._log_callback = module.llama_log_callback(_log_line)  # kept: llama.cpp calls it for the process
        module.llama_log_set(self._log_callback, ctypes.c_void_p(0))
        self.cpu_variant = load_backends(module)
        module.llama_backend_init()

    def load_model(self, path: str) -> Any:
        params = self.c.llama_model_default_params()
        params.use_mmap = True
        model = self.c.llama_model_load_from_file(path.encode(), params)
        if not model:
            raise ValueError(f"llama.cpp could not load the GGUF file {path}")
        return model

    def new_context(self, model: Any, settings: Any) -> Any:
        params = self.c.llama_context_default_params()
        params.n_ctx = settings.kv_tokens
        params.n_batch = settings.batch_tokens
        params.n_ubatch = min(settings.ubatch_tokens, settings.batch_tokens)
        params.n_seq_max = settings.sessions
        params.n_threads = params.n_threads_batch = settings.threads
        params.kv_unified = True
        params.no_perf = True
        params.flash_attn_type = (
            self.c.LLAMA_FLASH_ATTN_TYPE_ENABLED if settings.flash_attn else self.c.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        ctx = self.c.llama_init_from_model(model, params)
        if not ctx:
            raise ValueError(
                f"llama.cpp could not make a context of {settings.kv_tokens} KV cells for {settings.sessions} sessions"
            )
        return ctx

    def free_context(self, ctx: Any) -> None:
        self.c.llama_free(ctx)

    def free_model(self, model: Any) -> None:
        self.c.llama_model_free(model)

    def n_vocab(self, model: Any) -> int:
        return int(self.c.llama_vocab_n_tokens(self.c.llama_model_get_vocab(model)))

    def is_eog(self, model: Any, token: int) -> bool:
        """Whether `token` ends a generation in llama.cpp's own eyes (EOS, EOT, <|im_end|> ...)."""
        return bool(self.c.llama_vocab_is_eog(self.c.llama_model_get_vocab(model), token))

    def n_ctx_train(self, model: Any) -> int:
        return int(self.c.llama_model_n_ctx_train(model))

    def n_embd(self, model: Any) -> int:
        return int(self.c.llama_model_n_embd(model))

    def describe(self, model: Any) -> str:
        """llama.cpp's one-line description of the model ("llama 135M Q4_1")."""
        buf = ctypes.create_string_buffer(256)
        self.c.llama_model_desc(model, buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def n_ctx(self, ctx: Any) -> int:
        return int(self.c.llama_n_ctx(ctx))

    def memory(self, ctx: Any) -> Any:
        return self.c.llama_get_memory(ctx)

    def seq_rm(self, memory: Any, seq: int, p0: int, p1: int) -> None:
        self.c.llama_memory_seq_rm(memory, seq, p0, p1)

    def seq_cp(self, memory: Any, src: int, dst: int, p0: int, p1: int) -> None:
        self.c.llama_memory_seq_cp(memory, src, dst, p0, p1)

    def kv_bytes_per_token(self, model: Any) -> int:
        """K and V bytes of one cached position (f16 cache): 2 x layers x kv heads x head size x 2."""
        layers = int(self.c.llama_model_n_layer(model))
        heads, kv_heads = int(self.c.llama_model_n_head(model)), int(self.c.llama_model_n_head_kv(model))
        head_dim = self.n_embd(model) // max(heads, 1)
        return 2 * layers * kv_heads * head_dim * KV_DTYPE_BYTES

    def decode(self, ctx: Any, batch: Any) -> None:
        code = int(self.c.llama_decode(ctx, batch))
        if code == 1:
            raise ResourceExhausted(f"llama_decode: {DECODE_ERRORS[1]}")
        if code != 0:
            raise SpecDecError(f"llama_decode failed ({code}: {DECODE_ERRORS.get(code, 'internal error')})")

    def logits(self, ctx: Any, rows: int, width: int) -> np.ndarray:
        """A copy of the last decode's output logits, [rows, width] float32, in batch order."""
        pointer = self.c.llama_get_logits(ctx)
        return np.ctypeslib.as_array(pointer, shape=(rows, width)).copy()


# ggml's log levels -> Python's (llama.cpp's info lines are debug here: a model load prints hundreds).
GGML_LOG_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}
LLAMA_LOG = logging.getLogger("llama.cpp")


def _log_line(level: int, text: bytes, _user_data: Any) -> None:
    python_level = GGML_LOG_LEVELS.get(level, logging.DEBUG)
    if LLAMA_LOG.isEnabledFor(python_level):
        line = text.decode("utf-8", "replace").rstrip()
        if line:
            LLAMA_LOG.log(python_level, "%s", line)


def load_backends(module: Any) -> str:
    """Load ggml's CPU variants from the folder of the llama_cpp package `module` (see _load_backends); nothing
    where that package carries no ggml library of its own."""
    lib_dir = Path(module.__file__).parent / "lib"
    ggml_path = _mapped("libggml.so") or (str(lib_dir / "libggml.so") if (lib_dir / "libggml.so").exists() else "")
    return _load_backends(ggml_path, lib_dir) if ggml_path else ""


def _load_backends(ggml_path: str, lib_dir: Path) -> str:
    """Load ggml's runtime CPU variants from the package folder into the libggml at `ggml_path` (the one libllama
    uses; a build without variants links its kernels: nothing to load); returns the variant ggml loaded, or ""
    where the kernels are linked in."""
    ggml = ctypes.CDLL(ggml_path)
    ggml.ggml_backend_reg_count.restype = ctypes.c_size_t
    if ggml.ggml_backend_reg_count() == 0:
        ggml.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
        ggml.ggml_backend_load_all_from_path(str(lib_dir).encode())
        if ggml.ggml_backend_reg_count() == 0:
            raise LlamaCppUnavailable(f"ggml found no CPU backend in {lib_dir}")
    variant = Path(_mapped("libggml-cpu-")).name
    return variant[len("libggml-cpu-") :].split(".so")[0] if variant else ""


def _mapped(prefix: str) -> str:
    """The path of the first library this process has mapped whose file name starts with `prefix` ("": none)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return ""
    for line in maps.splitlines():
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if path.startswith("/") and Path(path).name.startswith(prefix):
            return path
    return ""


_LIB: LlamaCppLib | None = None
_LIB_LOCK = threading.Lock()


def load_library() -> LlamaCppLib:
    """The process's llama.cpp library (loaded once). Raises LlamaCppUnavailable where it is not installed."""
    global _LIB
    with _LIB_LOCK:
        if _LIB is None:
            try:
                import llama_cpp
            except (ImportError, OSError) as exc:
                raise LlamaCppUnavailable(
                    f"the llama.cpp engine needs llama-cpp-python (make install builds it: {exc})"
                ) from exc
            _LIB = LlamaCppLib(llama_cpp)
            log.info(
                "llama.cpp %s, CPU kernels: %s", getattr(llama_cpp, "__version__", "?"), _LIB.cpu_variant or "built in"
            )
        return _LIB


def available() -> bool:
    """Whether llama-cpp-python can be imported (without loading it)."""
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None
