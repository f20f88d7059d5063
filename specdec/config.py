"""Configuration dataclasses for the three services, read from the environment.

Every limit the system enforces is named here (no magic numbers in code).
Environment variables (CLI flags override them):

  SPECDEC_HOST, SPECDEC_PORT, SPECDEC_METRICS_PORT, SPECDEC_DRAIN_SECONDS,
  SPECDEC_MODEL, SPECDEC_DRAFT_KIND, SPECDEC_DEVICE, SPECDEC_DTYPE,
  SPECDEC_THREADS, SPECDEC_MODEL_CACHE_DIR, SPECDEC_OFFLINE,
  SPECDEC_CACHE_BUDGET_BYTES, SPECDEC_MAX_MESSAGE_BYTES,
  REDIS_URL, SPECDEC_TOKENIZER, SPECDEC_DRAFT_ADDRESSES,
  SPECDEC_TARGET_ADDRESSES, SPECDEC_MAX_CONCURRENT, SPECDEC_SESSION_TTL,
  SPECDEC_REDIS_PREFIX, SPECDEC_AUTH_TOKENS, SPECDEC_SERVICE_TOKEN,
  SPECDEC_TLS_CERT, SPECDEC_TLS_KEY, SPECDEC_TLS_CA,
  SPECDEC_LEASE_SECONDS, SPECDEC_HEALTH_WEDGED_SECONDS, SPECDEC_FAULT_FILE,
  SPECDEC_MAX_BATCH, SPECDEC_BATCH_WAIT_MS, SPECDEC_KEEP_HIDDEN, SPECDEC_MAX_HIDDEN_BYTES,
  SPECDEC_INPUT_MAJOR, SPECDEC_LINEAR_KERNEL, SPECDEC_KERNEL_BUDGET_S,
  SPECDEC_NGRAM_MIN_N, SPECDEC_NGRAM_MAX_N, SPECDEC_NGRAM_PREFER,
  SPECDEC_HEALTH_REFRESH_S, SPECDEC_REDIS_PING_TIMEOUT_S, SPECDEC_ROW_INVARIANT,
  SPECDEC_OVERLAP, SPECDEC_OVERLAP_MISS_COST_MS, SPECDEC_OVERLAP_MAX_TARGET_BATCH,
  SPECDEC_OVERLAP_MAX_DRAFT_IN_FLIGHT, SPECDEC_HOP_DELAY_MS (test and bench only),
  SPECDEC_ENGINE, SPECDEC_LLAMACPP_KV_TOKENS, SPECDEC_LLAMACPP_SESSIONS, SPECDEC_LLAMACPP_BATCH_TOKENS,
  SPECDEC_LLAMACPP_UBATCH_TOKENS, SPECDEC_LLAMACPP_FLASH_ATTN

Secrets (SPECDEC_AUTH_TOKENS, SPECDEC_SERVICE_TOKEN, REDIS_URL, REDIS_PASSWORD) can instead
be read from files, as Kubernetes and compose mount them: NAME_FILE=/path (see env_secret).
REDIS_PASSWORD (or REDIS_PASSWORD_FILE) fills in the password of a REDIS_URL that has none.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

DEFAULT_ORCHESTRATOR_PORT = 50050
DEFAULT_DRAFT_PORT = 50051
DEFAULT_TARGET_PORT = 50052
MIB = 1024 * 1024
GIB = 1024 * MIB
DEFAULT_CONTEXT_STORE_TOKENS = 1 << 20   # delta rounds: context tokens a model service keeps (about 50 MB)
# N-gram draft: a 1-token match of the context's tail is usually wrong on open-ended text (simulated on
# the target's own greedy continuations of the bench prompts at k = 4, min_n = 1 drafted 137 of 286 open
# rounds at acceptance 0.07, min_n = 2 32 at 0.20, with a mean accepted length of 2.27 vs 2.36 grounded).
NGRAM_MIN_N = 2
NGRAM_MAX_N = 4


def env_str(name: str, default: str = "") -> str:
    """String from the environment, or the default when unset or empty."""
    return os.environ.get(name) or default


def env_secret(name: str, default: str = "") -> str:
    """A secret from $NAME, else the stripped contents of the file named by $NAME_FILE.

    Raises:
        ValueError: $NAME_FILE names a file that cannot be read.
    """
    value = os.environ.get(name)
    if value:
        return value
    path = os.environ.get(f"{name}_FILE")
    if not path:
        return default
    try:
        return Path(path).read_text(encoding="utf-8").strip() or default
    except OSError as exc:
        raise ValueError(f"{name}_FILE={path}: {exc.strerror or exc}") from exc


def redis_url_from_env() -> str:
    """REDIS_URL(_FILE), with REDIS_PASSWORD(_FILE) as its password when the URL carries none."""
    url = env_secret("REDIS_URL")
    password = env_secret("REDIS_PASSWORD")
    if not url or not password:
        return url
    parts = urlsplit(url)
    if "@" in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=f":{quote(password, safe='')}@{parts.netloc}"))


def env_int(name: str, default: int) -> int:
    """Integer from the environment, or the default."""
    raw = os.environ.get(name)
    return int(raw) if raw else default


def env_float(name: str, default: float) -> float:
    """Float from the environment, or the default."""
    raw = os.environ.get(name)
    return float(raw) if raw else default


def env_bool(name: str, default: bool = False) -> bool:
    """Boolean from the environment (1/true/yes/on), or the default."""
    raw = os.environ.get(name)
    return default if not raw else raw.strip().lower() in {"1", "true", "yes", "on"}


@dataclass
class Limits:
    """Named limits enforced on requests (INVALID_ARGUMENT / RESOURCE_EXHAUSTED beyond them)."""

    max_k: int = 16
    max_new_tokens: int = 4096
    max_prompt_tokens: int = 8192
    max_stop_strings: int = 8
    max_stop_chars: int = 256
    max_logprobs: int = 20
    max_message_bytes: int = 4 * MIB
    max_id_chars: int = 256         # session_id / request_id length


@dataclass
class TLSConfig:
    """Optional TLS/mTLS: server cert+key, and a CA to verify peers (mTLS) or servers (client side)."""

    cert: str = field(default_factory=lambda: env_str("SPECDEC_TLS_CERT"))
    key: str = field(default_factory=lambda: env_str("SPECDEC_TLS_KEY"))
    ca: str = field(default_factory=lambda: env_str("SPECDEC_TLS_CA"))

    @property
    def enabled(self) -> bool:
        """True when a certificate and key are configured."""
        return bool(self.cert and self.key)


@dataclass
class ServerConfig:
    """What every gRPC service shares: address, metrics, drain, message size, security."""

    host: str = field(default_factory=lambda: env_str("SPECDEC_HOST", "127.0.0.1"))
    port: int = 0
    metrics_port: int = field(default_factory=lambda: env_int("SPECDEC_METRICS_PORT", 0))
    drain_seconds: float = field(default_factory=lambda: env_float("SPECDEC_DRAIN_SECONDS", 30.0))
    max_message_bytes: int = field(default_factory=lambda: env_int("SPECDEC_MAX_MESSAGE_BYTES", 4 * MIB))
    service_token: str = field(default_factory=lambda: env_secret("SPECDEC_SERVICE_TOKEN"))
    tls: TLSConfig = field(default_factory=TLSConfig)
    # Model services: the round lane's TCP port (specdec/server/lane.py): 0 = any free port (advertised in
    # ModelInfo.round_lane_port), -1 = no lane. With TLS on, the lane speaks TLS with the same certificates.
    round_lane_port: int = field(default_factory=lambda: env_int("SPECDEC_ROUND_LANE_PORT", 0))
    # Target: tell lane callers that ask when their forward has finished (FORWARD_DONE; specdec/server/lane.py),
    # and they poll for the answer from then: -1 = auto (offered while the target's torch threads leave a
    # core free, as polling: specdec.spin.offers_forward_done), 0 = never, 1 = always.
    round_lane_forward_done: int = field(default_factory=lambda: env_int("SPECDEC_ROUND_LANE_FORWARD_DONE", -1))
    # The event loop polls instead of sleeping for at most this many µs when an event is due at once
    # (specdec/spin.py): -1 = auto (the orchestrator polls; a model service polls when its torch threads
    # leave a core free), 0 = never.
    spin_us: int = field(default_factory=lambda: env_int("SPECDEC_SPIN_US", -1))


@dataclass
class HealthConfig:
    """When a model service reports NOT_SERVING besides loading and draining.

    poll_s: how often the health watcher looks at the model worker.
    wedged_s: a forward running longer than this marks the service NOT_SERVING (0 = never).
    fault_file: chaos/testing hook, off unless set: while this file exists, every forward
        fails with RuntimeError (a real failure of the worker, used by the reliability tests).
    """

    poll_s: float = 0.2
    wedged_s: float = field(default_factory=lambda: env_float("SPECDEC_HEALTH_WEDGED_SECONDS", 120.0))
    fault_file: str = field(default_factory=lambda: env_str("SPECDEC_FAULT_FILE"))


# Row-count bands the linear kernels are chosen for (specdec/models/kernels.py), by their upper
# ends: a decode step (1 row), a verify pass of k + 1 <= 5 rows (k = 4, the default) and up to
# 17 (k = 16), and everything larger (batched verifies of 8 sessions at k = 4: 40 rows; prefill
# chunks), timed at 32 rows.
KERNEL_BAND_ROWS = (1, 5, 17, 32)


@dataclass
class KernelConfig:
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

    kernel: str = field(default_factory=lambda: env_str("SPECDEC_LINEAR_KERNEL", "auto"))
    budget_s: float = field(default_factory=lambda: env_float("SPECDEC_KERNEL_BUDGET_S", 2.0))
    reps: int = 3
    probe_instances: int = 4
    check_atol: float = 2e-4
    check_atol_low: float = 2e-2
    layout_slack: float = 0.1
    allow_input_major: bool = field(default_factory=lambda: env_bool("SPECDEC_INPUT_MAJOR", True))
    band_rows: tuple[int, ...] = KERNEL_BAND_ROWS
    busy_load_per_core: float = 1.0
    int4_max_rows: int = field(default_factory=lambda: env_int("SPECDEC_INT4_MAX_ROWS", 32))

    def atol(self, dtype: "torch.dtype") -> float:  # noqa: F821 - torch is not imported by config
        """The check tolerance for weights of `dtype`."""
        return self.check_atol if str(dtype) == "torch.float32" else self.check_atol_low


@dataclass
class LlamaCppConfig:
    """The llama.cpp engine's context (specdec/engine/llamacpp_runner.py): KV cells shared by all sessions
    (f16: 23 KB a cell for SmolLM2-135M), sessions held at once, tokens per llama_decode and per ggml
    compute step, flash attention (its CPU kernel skips the cells of other sessions)."""

    kv_tokens: int = field(default_factory=lambda: env_int("SPECDEC_LLAMACPP_KV_TOKENS", 8192))
    sessions: int = field(default_factory=lambda: env_int("SPECDEC_LLAMACPP_SESSIONS", 64))
    batch_tokens: int = field(default_factory=lambda: env_int("SPECDEC_LLAMACPP_BATCH_TOKENS", 2048))
    ubatch_tokens: int = field(default_factory=lambda: env_int("SPECDEC_LLAMACPP_UBATCH_TOKENS", 512))
    flash_attn: bool = field(default_factory=lambda: env_bool("SPECDEC_LLAMACPP_FLASH_ATTN", True))


#: The model a service loads when SPECDEC_MODEL / --model name none, by role.
DEFAULT_MODELS = {"target": "embedded", "draft": "embedded:smollm2-draft"}


@dataclass
class ModelServiceConfig:
    """A draft or target worker: which model, where, and its KV-cache budget."""

    role: str = "target"
    # Empty: the role's default (DEFAULT_MODELS): the embedded SmolLM2 for a target, the trained
    # draft shipped for it for a draft service (not the target again).
    model: str = field(default_factory=lambda: env_str("SPECDEC_MODEL"))
    draft_kind: str = field(default_factory=lambda: env_str("SPECDEC_DRAFT_KIND", "model"))
    device: str = field(default_factory=lambda: env_str("SPECDEC_DEVICE", "auto"))
    dtype: str = field(default_factory=lambda: env_str("SPECDEC_DTYPE", "auto"))
    # auto: llama.cpp for a GGUF model on CPU (the embedded default included), torch otherwise; torch | llamacpp.
    engine: str = field(default_factory=lambda: env_str("SPECDEC_ENGINE", "auto"))
    llamacpp: LlamaCppConfig = field(default_factory=LlamaCppConfig)
    threads: int = field(default_factory=lambda: env_int("SPECDEC_THREADS", 0))
    cache_dir: str = field(default_factory=lambda: env_str("SPECDEC_MODEL_CACHE_DIR"))
    offline: bool = field(default_factory=lambda: env_bool("SPECDEC_OFFLINE"))
    cache_budget_bytes: int = field(default_factory=lambda: env_int("SPECDEC_CACHE_BUDGET_BYTES", 2 * GIB))
    # Prefix sharing: a session's first call starts from the longest prefix of its context that another
    # cached session holds (the same system prompt; the whole conversation an OpenAI client resends each
    # turn), copied instead of computed, when at least this many tokens are shared; 0 = off.
    # (vLLM's automatic prefix caching; here the finished sessions' caches stay until evicted.)
    prefix_share_min_tokens: int = field(default_factory=lambda: env_int("SPECDEC_PREFIX_SHARE_MIN_TOKENS", 16))
    max_k: int = Limits.max_k
    # Target: concurrent Verify calls of different sessions scored in ONE forward pass (1 = off).
    max_batch: int = field(default_factory=lambda: env_int("SPECDEC_MAX_BATCH", 8))
    # How long a batch may wait for the previous batch's sessions to send their next round
    # (one orchestrator round trip); a lone session never waits.
    batch_wait_ms: float = field(default_factory=lambda: env_float("SPECDEC_BATCH_WAIT_MS", 5.0))
    # A call whose forward runs at most this many tokens (a decode round) runs on the event loop when the model
    # thread is idle (no hand-off and back); 0 = never. Only at one thread or with loop_forwards (inline_limit).
    inline_max_tokens: int = field(default_factory=lambda: env_int("SPECDEC_INLINE_MAX_TOKENS", 16))
    # Every forward runs on the event loop's thread, never a model thread: one OpenMP team, no hand-offs.
    # -1 (auto): on CPU with more than one engine thread, in a service with chunked prefill (bounded passes;
    # specdec.engine.loading.forwards_on_loop). 0 = off, 1 = on.
    loop_forwards: int = field(default_factory=lambda: env_int("SPECDEC_LOOP_FORWARDS", -1))
    # Target: a Verify whose forward would compute more tokens than this (a long prompt's prefill) runs
    # in chunks of this many tokens, each its own pass, with other sessions' rounds in between
    # (chunked prefill: a long prompt no longer stalls every running session); 0 = whole prefills.
    # Model draft: a Propose over a longer new context prefills it this many tokens a model call, other
    # sessions' proposals in between (draft_service/servicer.py).
    prefill_chunk_tokens: int = field(default_factory=lambda: env_int("SPECDEC_PREFILL_CHUNK_TOKENS", 512))
    # Target: while other sessions decode, a pass prefills only as many prompt tokens as take about this
    # many ms (measured speeds; BatchQueue.turn_tokens for long prompts, pass_prefill_tokens for the
    # rest): a longer prompt takes turns, riding in the decode rounds' passes, and a burst of prompts
    # spreads over several passes, so new prompts add at most about this much to each running session's
    # round; alone whole chunks run. 0 = whole chunks always. (Decode first, as vLLM's token budget per step.)
    prefill_turn_ms: float = field(default_factory=lambda: env_float("SPECDEC_PREFILL_TURN_MS", 200.0))
    # Delta rounds: the most context tokens kept over all sessions (about 50 bytes each) so that
    # Propose/Verify can carry only new tokens; least recently used sessions are dropped first (their
    # next call gets the whole context resent). 0 = keep none: Info does not offer the delta form.
    context_store_tokens: int = field(default_factory=lambda: env_int("SPECDEC_CONTEXT_STORE_TOKENS", DEFAULT_CONTEXT_STORE_TOKENS))
    # The shortest context tail the n-gram draft matches (see NGRAM_MIN_N) and the longest it tries.
    ngram_min_n: int = field(default_factory=lambda: env_int("SPECDEC_NGRAM_MIN_N", NGRAM_MIN_N))
    ngram_max_n: int = field(default_factory=lambda: env_int("SPECDEC_NGRAM_MAX_N", NGRAM_MAX_N))
    # Which earlier occurrence of the context's tail the n-gram draft continues: earliest | recent.
    ngram_prefer: str = field(default_factory=lambda: env_str("SPECDEC_NGRAM_PREFER", "earliest"))
    # Target: keep each cached position's final hidden state (about hidden/KV = 1/(4 x layers) more
    # memory) so feature drafts can be fed; 0 = off (a feature draft then gets FAILED_PRECONDITION).
    keep_hidden: bool = field(default_factory=lambda: env_bool("SPECDEC_KEEP_HIDDEN", True))
    # Torch: row-invariant attention (specdec/engine/ragged.py): returned rows computed bitwise as 1-row steps
    # compute them. auto: on for --dtype int8 and int4 (row-invariant linears), off otherwise; on | off force it.
    row_invariant: str = field(default_factory=lambda: env_str("SPECDEC_ROW_INVARIANT", "auto"))
    # Target: the most hidden-state bytes one Verify returns (fp16 on the wire); a feature draft
    # catches up on a long prompt over several rounds beyond that.
    max_hidden_bytes: int = field(default_factory=lambda: env_int("SPECDEC_MAX_HIDDEN_BYTES", 2 * MIB))
    # Target and model drafts on CPU: linear kernels and weight layouts timed at load, per row-count
    # band, the fastest kept (specdec/models/kernels.py); SPECDEC_LINEAR_KERNEL forces a choice.
    kernels: KernelConfig = field(default_factory=KernelConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    health: HealthConfig = field(default_factory=HealthConfig)

    def __post_init__(self) -> None:
        if not self.model:
            self.model = DEFAULT_MODELS.get(self.role, DEFAULT_MODELS["target"])


@dataclass
class RetryConfig:
    """Deadlines and retries of orchestrator -> model-service calls."""

    base_deadline_s: float = 10.0          # per call, plus per_token_deadline_s per token computed
    per_token_deadline_s: float = 0.05
    attempts: int = 3                      # tries over distinct replicas on UNAVAILABLE
    backoff_s: float = 0.05
    connect_timeout_s: float = 5.0
    min_deadline_s: float = 0.05           # below this much of the client's deadline left: DEADLINE_EXCEEDED
    reconnect_initial_s: float = 0.2       # channel reconnect backoff toward a replica that went away
    reconnect_max_s: float = 2.0           # (gRPC's default grows to 120 s: a restarted replica would wait)
    # Propose/Verify over long-lived bidirectional streams where the replica serves them (ModelInfo.round_streams;
    # orchestrator/streams.py); off: one unary call per round, as older orchestrators do.
    round_streams: bool = field(default_factory=lambda: env_bool("SPECDEC_ROUND_STREAMS", True))
    idle_streams_max: int = 64             # idle round streams (and lane connections) kept per replica and method
    # Propose/Verify on the replica's round lane where it serves one (ModelInfo.round_lane_port; plain TCP,
    # orchestrator/lane.py); off: round streams. A lane that cannot be reached is skipped for lane_retry_s.
    round_lane: bool = field(default_factory=lambda: env_bool("SPECDEC_ROUND_LANE", True))
    lane_connect_timeout_s: float = 1.0
    lane_retry_s: float = 60.0


@dataclass
class OverlapConfig:
    """Overlapped rounds (docs/overlap.md, orchestrator/overlap.py): the draft drafts the next round's
    block while the target verifies this one; the output never changes, only when tokens arrive."""

    # The default of GenerateRequest.overlap (a request's own value wins).
    enabled: bool = field(default_factory=lambda: env_bool("SPECDEC_OVERLAP", False))
    # Overlap a round only when the block drafted ahead is expected to save more than it costs: P(used) x (draft
    # time it hides) > what the pre-draft costs the verify beside it + the expected wait past the verify. That cost
    # is measured (CostModel.overlap_extra_ms: verify time beside a pre-draft over v(n)); miss_cost_ms is its floor
    # and its value until measured (the draft and the target may share CPU cores or a host's memory bandwidth).
    miss_cost_ms: float = field(default_factory=lambda: env_float("SPECDEC_OVERLAP_MISS_COST_MS", 1.0))
    # Under load overlap is off: when the target's passes carry more than this many sessions on average
    # (CostModel.batch) or the draft replica has other calls in flight, a pre-draft would delay other sessions.
    max_target_batch: float = field(default_factory=lambda: env_float("SPECDEC_OVERLAP_MAX_TARGET_BATCH", 1.5))
    # ... and while this orchestrator runs more than this many generations per target replica: their rounds share
    # the target's passes now, which the averaged batch above learns only after some rounds.
    max_running: float = field(default_factory=lambda: env_float("SPECDEC_OVERLAP_MAX_RUNNING", 1.0))
    max_draft_in_flight: int = field(default_factory=lambda: env_int("SPECDEC_OVERLAP_MAX_DRAFT_IN_FLIGHT", 0))
    # Branches (docs/overlap.md): also draft ahead behind the draft's runner-up token at up to this many positions of
    # a round's block, each while it pays. Off: where draft and target share cores they cost more than they hide.
    branches: int = field(default_factory=lambda: env_int("SPECDEC_OVERLAP_BRANCHES", 0))
    # TEST AND BENCH ONLY: a fixed delay added to every hop of the orchestrator's draft/target calls
    # (request and response: 2 x this per call) to measure a distant draft. Never set it in production.
    hop_delay_ms: float = field(default_factory=lambda: env_float("SPECDEC_HOP_DELAY_MS", 0.0))


@dataclass
class LeaseConfig:
    """The per-session lease an orchestrator holds while it generates (see orchestrator/generation.py).

    seconds: lease length; renewed every seconds / renew_fraction while the generation runs,
        so a dead orchestrator's session is free again at most `seconds` after it died.
    takeover_wait_s: how long a retried request (same request_id) waits for the old lease to
        expire before giving up with ABORTED (default: one lease plus margin), capped by the
        client's deadline.
    poll_s: how often the waiting retry asks Redis again.
    release_s: the lease left behind when a generation fails with a retryable error (the
        request stays resumable and is free for another orchestrator almost at once).
    stop_wait_s: how long a finished generation waits for its renewal task to end.
    """

    seconds: float = field(default_factory=lambda: env_float("SPECDEC_LEASE_SECONDS", 6.0))
    renew_fraction: float = 3.0
    takeover_margin_s: float = 1.0
    poll_s: float = 0.1
    release_s: float = 0.001
    stop_wait_s: float = 5.0

    @property
    def renew_s(self) -> float:
        """Interval between renewals."""
        return self.seconds / self.renew_fraction

    @property
    def takeover_wait_s(self) -> float:
        """Longest wait for another instance's lease to expire."""
        return self.seconds + self.takeover_margin_s


@dataclass
class OrchestratorConfig:
    """The public entry point: where the pools and Redis are, admission, sessions."""

    tokenizer: str = field(default_factory=lambda: env_str("SPECDEC_TOKENIZER", "embedded"))
    draft_addresses: str = field(default_factory=lambda: env_str("SPECDEC_DRAFT_ADDRESSES"))
    # The n-gram draft needs only the context, which the orchestrator holds: run it here and
    # skip a network hop per round (a draft pool is then needed only for model drafts).
    local_ngram: bool = field(default_factory=lambda: env_bool("SPECDEC_LOCAL_NGRAM", True))
    # Delta rounds: the most context tokens kept over all sessions (about 50 bytes each) so that
    # Propose/Verify can carry only new tokens; least recently used sessions are dropped first (their
    # next call gets the whole context resent). 0 = keep none: Info does not offer the delta form.
    context_store_tokens: int = field(default_factory=lambda: env_int("SPECDEC_CONTEXT_STORE_TOKENS", DEFAULT_CONTEXT_STORE_TOKENS))
    # The shortest context tail the n-gram draft matches (see NGRAM_MIN_N) and the longest it tries.
    ngram_min_n: int = field(default_factory=lambda: env_int("SPECDEC_NGRAM_MIN_N", NGRAM_MIN_N))
    ngram_max_n: int = field(default_factory=lambda: env_int("SPECDEC_NGRAM_MAX_N", NGRAM_MAX_N))
    # Which earlier occurrence of the context's tail the n-gram draft continues: earliest | recent.
    ngram_prefer: str = field(default_factory=lambda: env_str("SPECDEC_NGRAM_PREFER", "earliest"))
    target_addresses: str = field(default_factory=lambda: env_str("SPECDEC_TARGET_ADDRESSES"))
    # Adaptive k under load (orchestrator/adaptive.py, latency_cap): how much the drafts of the sessions
    # waiting for the target may lengthen the others' rounds, as a fraction of a round without drafts.
    # 0.05: no session's inter-token latency grows past 1.05x plain decoding's for another's draft.
    # Negative (the default): no cap, throughput first (each session's k maximises its tokens per ms of
    # the whole pass). Off by default: measured, the cap gave up the low-rate gain and saturation
    # throughput without a latency gain the bench could tell from its noise (docs/performance.md).
    latency_slack: float = field(default_factory=lambda: env_float("SPECDEC_LATENCY_SLACK", -1.0))
    # A request without a session id goes to the replicas of its conversation (orchestrator/affinity.py): keyed by
    # its system messages and first user message, or the first this many characters of a plain prompt, so a
    # client resending a growing conversation meets the earlier turns' KV cache on one replica. 0 = off: each
    # such request is routed by its own new session id.
    affinity_prompt_chars: int = field(default_factory=lambda: env_int("SPECDEC_AFFINITY_PROMPT_CHARS", 1024))
    # ... but at most this many generations of one opening at once from this orchestrator; more (identical
    # openings arriving together) are spread over the other replicas (orchestrator/affinity.py).
    affinity_max_live: int = field(default_factory=lambda: env_int("SPECDEC_AFFINITY_MAX_LIVE", 4))
    # A traced generation's rows show the target's argmax and the greedy comparison at every draft position, also
    # after the first rejection (the article's trace). 0: only what the accept rule read, as untraced rounds ask
    # (VerifyRequest.verdict_only), so a trace costs the round nothing (the benches read their timings so).
    trace_rejected_rows: bool = field(default_factory=lambda: env_bool("SPECDEC_TRACE_REJECTED_ROWS", True))
    redis_url: str = field(default_factory=redis_url_from_env)
    redis_prefix: str = field(default_factory=lambda: env_str("SPECDEC_REDIS_PREFIX", "specdec:"))
    session_ttl_s: int = field(default_factory=lambda: env_int("SPECDEC_SESSION_TTL", 24 * 3600))
    lease: LeaseConfig = field(default_factory=LeaseConfig)
    max_concurrent: int = field(default_factory=lambda: env_int("SPECDEC_MAX_CONCURRENT", 64))
    # A request that arrives before the first pool check finished waits this long (or until
    # its own deadline) for the check, instead of failing UNAVAILABLE while the service starts.
    first_check_wait_s: float = field(default_factory=lambda: env_float("SPECDEC_FIRST_CHECK_WAIT_S", 10.0))
    # Health: every health_refresh_s the replica pools are checked again and Redis is PINGed, each PING
    # bounded by redis_ping_timeout_s; health is NOT_SERVING while Redis fails the PING (down, too slow,
    # refusing the password), SERVING again at the first pass where it answers (orchestrator/pair.py).
    health_refresh_s: float = field(default_factory=lambda: env_float("SPECDEC_HEALTH_REFRESH_S", 2.0))
    redis_ping_timeout_s: float = field(default_factory=lambda: env_float("SPECDEC_REDIS_PING_TIMEOUT_S", 1.0))
    auth_tokens: tuple[str, ...] = field(
        default_factory=lambda: tuple(t for t in env_secret("SPECDEC_AUTH_TOKENS").split(",") if t))
    cache_dir: str = field(default_factory=lambda: env_str("SPECDEC_MODEL_CACHE_DIR"))
    offline: bool = field(default_factory=lambda: env_bool("SPECDEC_OFFLINE"))
    limits: Limits = field(default_factory=Limits)
    retry: RetryConfig = field(default_factory=RetryConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    overlap: OverlapConfig = field(default_factory=OverlapConfig)

    @property
    def lease_s(self) -> float:
        """The session lease length (LeaseConfig.seconds)."""
        return self.lease.seconds
