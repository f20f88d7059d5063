"""The settings of a model service (draft or target): which model, on what, with which engine and limits."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BeforeValidator, Field, model_validator

from specdec.settings.base import GIB, MIB, SpecdecSettings, env, lower_stripped
from specdec.settings.shared import AUTO, ON, ContextSettings, HealthConfig, Limits, ModelCache, ServerConfig

if TYPE_CHECKING:
    import torch

# Row-count bands the linear kernels are chosen for (specdec/models/kernels.py), by their upper
# ends: a decode step (1 row), a verify pass of k + 1 <= 5 rows (k = 4, the default) and up to
# 17 (k = 16), and everything larger (batched verifies of 8 sessions at k = 4: 40 rows; prefill
# chunks), timed at 32 rows.
KERNEL_BAND_ROWS = (1, 5, 17, 32)

#: The model a service loads when SPECDEC_MODEL / --model name none, by role.
DEFAULT_MODELS = {"target": "embedded", "draft": "embedded:smollm2-draft"}
FLOAT32 = "torch.float32"


class KernelConfig(SpecdecSettings):
    """How a torch model service picks its CPU linear kernels at load (specdec/engine/kernel_select.py).

    kernel: auto (measure, or the cached choice), or a kernel name / one name per band to force.
    budget_s: the most seconds the timing may take at load; reps: timing rounds per (band, kernel), least kept;
    probe_instances: layers of each shape timed in turn (so weights stream from memory).
    check_atol: how far a kernel's output may lie from nn.Linear's, relative to the largest value beyond 1, in
        float32 (6e-5 measured on SmolLM2's logits); lower precisions get check_atol_low.
    allow_input_major: whether the input-major candidates are timed (SPECDEC_INPUT_MAJOR=0: no).
    busy_load_per_core: a plan measured at or above this load average per core is measured again later.
    int4_max_rows: --dtype int4 outside a row-invariant pass: up to this many rows run the weight-only int4
        GEMM, wider calls a bfloat16 GEMM over the same dequantized weights (specdec/models/int4.py).
    layout_slack: one weight layout is kept (not both, a second copy of every weight) when its own
        winners are at most this much slower on average over the bands.
    """

    kernel: str = env(
        "SPECDEC_LINEAR_KERNEL",
        "auto",
        "CPU linear kernels: auto (timed at load, or the cached "
        "choice), or a kernel name, or one name per row band (comma-separated), to force.",
    )
    budget_s: float = env("SPECDEC_KERNEL_BUDGET_S", 2.0, "The most seconds the kernel timing may take at load.", ge=0)
    reps: int = Field(3, ge=1)
    probe_instances: int = Field(4, ge=1)
    check_atol: float = Field(2e-4, gt=0)
    check_atol_low: float = Field(2e-2, gt=0)
    layout_slack: float = Field(0.1, ge=0)
    allow_input_major: bool = env("SPECDEC_INPUT_MAJOR", True, "Time the input-major kernel candidates too.")
    band_rows: tuple[int, ...] = KERNEL_BAND_ROWS
    busy_load_per_core: float = Field(1.0, gt=0)
    int4_max_rows: int = env(
        "SPECDEC_INT4_MAX_ROWS",
        32,
        "--dtype int4 outside a row-invariant pass: up to this "
        "many rows run the weight-only int4 GEMM, wider calls a bfloat16 GEMM.",
        ge=1,
    )

    def atol(self, dtype: torch.dtype) -> float:
        """The check tolerance for weights of `dtype`."""
        return self.check_atol if str(dtype) == FLOAT32 else self.check_atol_low


class LlamaCppConfig(SpecdecSettings):
    """The llama.cpp engine's context (specdec/engine/llamacpp_runner.py): KV cells shared by all sessions
    (f16: 23 KB a cell for SmolLM2-135M), sessions held at once, tokens per llama_decode and per ggml
    compute step, flash attention (its CPU kernel skips the cells of other sessions)."""

    kv_tokens: int = env("SPECDEC_LLAMACPP_KV_TOKENS", 8192, "llama.cpp: KV cells shared by all sessions.", ge=1)
    sessions: int = env("SPECDEC_LLAMACPP_SESSIONS", 64, "llama.cpp: sessions held at once (LRU-evicted beyond).", ge=1)
    batch_tokens: int = env("SPECDEC_LLAMACPP_BATCH_TOKENS", 2048, "llama.cpp: tokens one llama_decode takes.", ge=1)
    ubatch_tokens: int = env("SPECDEC_LLAMACPP_UBATCH_TOKENS", 512, "llama.cpp: tokens ggml computes at once.", ge=1)
    flash_attn: bool = env("SPECDEC_LLAMACPP_FLASH_ATTN", True, "llama.cpp: flash attention.")
    idle_tokens: int = env(
        "SPECDEC_LLAMACPP_IDLE_TOKENS",
        1024,
        "llama.cpp: the most KV cells held by idle sessions (unused for SPECDEC_LLAMACPP_IDLE_SECONDS), least "
        "recently used evicted beyond: every decode's attention spans the cells of all held sessions; -1 = no limit.",
        ge=-1,
    )
    idle_seconds: float = env(
        "SPECDEC_LLAMACPP_IDLE_SECONDS",
        1.0,
        "llama.cpp: how long a session goes unused before it counts as idle.",
        ge=0,
    )


Engine = Annotated[Literal["auto", "torch", "llamacpp"], BeforeValidator(lower_stripped)]
RowInvariant = Annotated[Literal["auto", "on", "off"], BeforeValidator(lower_stripped)]


class ModelServiceConfig(ModelCache, ContextSettings):
    """A draft or target worker: which model, where, and its KV-cache budget."""

    role: Literal["target", "draft"] = "target"
    model: str = env(
        "SPECDEC_MODEL",
        "",
        "Model spec: embedded | modelscope:ORG/NAME | hf:ORG/NAME | DIR | "
        "gguf:FILE. Empty: the role's default (the embedded SmolLM2 for a target, the trained draft "
        "shipped for it for a draft).",
    )
    draft_kind: Literal["model", "ngram", "combined"] = env(
        "SPECDEC_DRAFT_KIND", "model", "Draft service: a draft model, prompt lookup (n-gram), or lookup then model."
    )
    device: str = env("SPECDEC_DEVICE", "auto", "auto, cpu, cuda, cuda:N, ...")
    dtype: str = env("SPECDEC_DTYPE", "auto", "Weights: auto, float32, bfloat16, float16, int8, int4.")
    engine: Engine = env(
        "SPECDEC_ENGINE",
        "auto",
        "Model runner: auto (llama.cpp for a GGUF model on CPU, the "
        "embedded default included; torch otherwise), torch, llamacpp.",
    )
    llamacpp: LlamaCppConfig = Field(default_factory=LlamaCppConfig)
    threads: int = env(
        "SPECDEC_THREADS", 0, "torch / llama.cpp threads (0 = torch's default; llama.cpp: every usable core).", ge=0
    )
    cache_budget_bytes: int = env(
        "SPECDEC_CACHE_BUDGET_BYTES",
        2 * GIB,
        "KV-cache bytes over all sessions (least recently used sessions evicted beyond).",
        ge=0,
    )
    prefix_share_min_tokens: int = env(
        "SPECDEC_PREFIX_SHARE_MIN_TOKENS",
        16,
        "Prefix sharing: a session's first call starts from the longest "
        "prefix of its context another cached session holds, copied instead of computed, when at least this many "
        "tokens are shared; 0 = off.",
        ge=0,
    )
    max_k: int = Field(Limits.max_k, ge=1)
    max_batch: int = env(
        "SPECDEC_MAX_BATCH",
        8,
        "Target: concurrent Verify calls of different sessions scored in one forward pass (1 = off).",
        ge=1,
    )
    batch_wait_ms: float = env(
        "SPECDEC_BATCH_WAIT_MS",
        5.0,
        "How long a batch may wait for the previous batch's "
        "sessions to send their next round; a lone session never waits.",
        ge=0,
    )
    inline_max_tokens: int = env(
        "SPECDEC_INLINE_MAX_TOKENS",
        16,
        "A call whose forward runs at most this many tokens runs on the event loop "
        "when the model thread is idle (one thread, or with loop forwards); 0 = never.",
        ge=0,
    )
    loop_forwards: int = env(
        "SPECDEC_LOOP_FORWARDS",
        AUTO,
        "Every forward runs on the event loop's thread: -1 = auto (on CPU with more "
        "than one engine thread, with chunked prefill), 0 = off, 1 = on.",
        ge=AUTO,
        le=ON,
    )
    prefill_chunk_tokens: int = env(
        "SPECDEC_PREFILL_CHUNK_TOKENS",
        512,
        "Chunked prefill: a forward over more tokens than this runs in chunks "
        "of this many, other sessions' rounds in between (target Verify, model-draft Propose); 0 = whole prefills.",
        ge=0,
    )
    prefill_turn_ms: float = env(
        "SPECDEC_PREFILL_TURN_MS",
        200.0,
        "Target: while other sessions decode, a pass prefills only as many prompt "
        "tokens as take about this many ms (measured speeds); 0 = whole chunks always.",
        ge=0,
    )
    keep_hidden: bool = env(
        "SPECDEC_KEEP_HIDDEN",
        True,
        "Target: keep each cached position's final hidden state "
        "so feature drafts can be fed (off: a feature draft gets FAILED_PRECONDITION).",
    )
    row_invariant: RowInvariant = env(
        "SPECDEC_ROW_INVARIANT",
        "auto",
        "Torch: row-invariant attention (rows computed bitwise as 1-row steps "
        "compute them): auto = on for --dtype int8 and int4, off otherwise.",
    )
    cuda_graphs: bool = env(
        "SPECDEC_CUDA_GRAPHS",
        False,
        "Torch on CUDA: decode and verify passes of one session replayed as CUDA graphs over static KV slots "
        "(no cross-session batching, no hidden rows for feature drafts); measure on your GPU with "
        "scripts/gpu_check.sh.",
    )
    cuda_graph_slots: int = env(
        "SPECDEC_CUDA_GRAPH_SLOTS", 8, "CUDA graphs: sessions held at once, each a static KV slot.", ge=1
    )
    cuda_graph_tokens: int = env(
        "SPECDEC_CUDA_GRAPH_TOKENS",
        4096,
        "CUDA graphs: positions one slot holds (prompt and output; at most the model's context).",
        ge=1,
    )
    max_hidden_bytes: int = env(
        "SPECDEC_MAX_HIDDEN_BYTES",
        2 * MIB,
        "Target: the most hidden-state bytes one "
        "Verify returns; a feature draft catches up over several rounds beyond that.",
        ge=0,
    )
    kernels: KernelConfig = Field(default_factory=KernelConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)

    @model_validator(mode="after")
    def _role_default_model(self) -> ModelServiceConfig:
        if not self.model:
            self.model = DEFAULT_MODELS.get(self.role, DEFAULT_MODELS["target"])
        return self
