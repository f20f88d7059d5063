"""The settings of the orchestrator: its pools and their calls, leases, Redis, admission."""

from __future__ import annotations

from pydantic import Field, model_validator

from specdec.settings.base import SpecdecSettings, env, with_password
from specdec.settings.shared import ClientAuth, ContextSettings, Limits, ModelCache, ServerConfig

DAY_S = 24 * 3600


class RetryConfig(SpecdecSettings):
    """Deadlines and retries of orchestrator -> model-service calls."""

    base_deadline_s: float = Field(10.0, gt=0)  # per call, plus per_token_deadline_s per token computed
    per_token_deadline_s: float = Field(0.05, ge=0)
    attempts: int = Field(3, ge=1)  # tries over distinct replicas on UNAVAILABLE
    backoff_s: float = Field(0.05, ge=0)
    connect_timeout_s: float = Field(5.0, gt=0)
    min_deadline_s: float = Field(0.05, ge=0)  # below this much of the client's deadline left: DEADLINE_EXCEEDED
    reconnect_initial_s: float = Field(0.2, gt=0)  # channel reconnect backoff toward a replica that went away
    reconnect_max_s: float = Field(2.0, gt=0)  # (gRPC's default grows to 120 s: a restarted replica would wait)
    hop_delay_ms: float = env(
        "SPECDEC_HOP_DELAY_MS",
        0.0,
        "TEST AND BENCH ONLY: a fixed delay added to every hop of the orchestrator's "
        "draft/target calls (2 x this per call) to measure a distant draft. Never set it in production.",
        ge=0,
    )


class LeaseConfig(SpecdecSettings):
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

    seconds: float = env(
        "SPECDEC_LEASE_SECONDS",
        6.0,
        "Session lease length: a dead orchestrator's session is free again at most this long after it died.",
        gt=0,
    )
    renew_fraction: float = Field(3.0, gt=1)
    takeover_margin_s: float = Field(1.0, ge=0)
    poll_s: float = Field(0.1, gt=0)
    release_s: float = Field(0.001, gt=0)
    stop_wait_s: float = Field(5.0, ge=0)

    @property
    def renew_s(self) -> float:
        """Interval between renewals."""
        return self.seconds / self.renew_fraction

    @property
    def takeover_wait_s(self) -> float:
        """Longest wait for another instance's lease to expire."""
        return self.seconds + self.takeover_margin_s


class RedisSettings(SpecdecSettings):
    """Where the session store is (Redis) and how its health is checked."""

    redis_url: str = env(
        "REDIS_URL",
        "",
        "Redis of the session store, redis://[:password@]host:port/db (the "
        "orchestrator needs one; `specdec up` starts its own); or REDIS_URL_FILE.",
        secret=True,
    )
    redis_password: str = env(
        "REDIS_PASSWORD", "", "Password filled into a REDIS_URL that has none; or REDIS_PASSWORD_FILE.", secret=True
    )
    redis_prefix: str = env("SPECDEC_REDIS_PREFIX", "specdec:", "Prefix of every Redis key.")
    session_ttl_s: int = env("SPECDEC_SESSION_TTL", DAY_S, "Seconds an idle session stays in Redis.", ge=1)
    redis_ping_timeout_s: float = env(
        "SPECDEC_REDIS_PING_TIMEOUT_S",
        1.0,
        "Bound of each health PING of Redis: health is NOT_SERVING while Redis "
        "fails it (down, too slow, refusing the password).",
        gt=0,
    )

    @model_validator(mode="after")
    def _password_into_url(self) -> RedisSettings:
        url = with_password(self.redis_url, self.redis_password)
        if url != self.redis_url:
            self.__dict__["redis_url"] = url  # not an assignment: that would run this check again
        return self


class OrchestratorConfig(ModelCache, ContextSettings, ClientAuth, RedisSettings):
    """The public entry point: where the pools and Redis are, admission, sessions."""

    tokenizer: str = env("SPECDEC_TOKENIZER", "embedded", "Model spec of the target (its tokenizer only).")
    draft_addresses: str = env(
        "SPECDEC_DRAFT_ADDRESSES",
        "",
        "Draft replicas: host:port,... or dns:///name:port "
        "(empty: no draft pool; the n-gram draft runs in the orchestrator).",
    )
    target_addresses: str = env("SPECDEC_TARGET_ADDRESSES", "", "Target replicas: host:port,... or dns:///name:port.")
    local_ngram: bool = env(
        "SPECDEC_LOCAL_NGRAM",
        True,
        "Run the n-gram draft here (it needs only the context the "
        "orchestrator holds) instead of a network hop per round.",
    )
    affinity_prompt_chars: int = env(
        "SPECDEC_AFFINITY_PROMPT_CHARS",
        1024,
        "A request without a session id goes to the replicas of its "
        "conversation, keyed by its system and first user messages or this many characters of a plain prompt "
        "(orchestrator/affinity.py); 0 = off.",
        ge=0,
    )
    affinity_max_live: int = env(
        "SPECDEC_AFFINITY_MAX_LIVE",
        4,
        "Conversation affinity: at most this many "
        "generations of one opening at once; more are spread over the other replicas.",
        ge=1,
    )
    decode_steps: int = env(
        "SPECDEC_DECODE_STEPS",
        8,
        "A round without a draft asks the target for up to this many tokens in one call (decode steps, as vLLM's "
        "multi-step decoding): the round's hops and bookkeeping are paid once for them, tokens stream in groups "
        "of up to this many; 1 = a call per token. Never in a generation's first round (its first token).",
        ge=1,
        le=64,
    )
    decode_steps_ms: float = env(
        "SPECDEC_DECODE_STEPS_MS",
        200.0,
        "Decode steps of one call are cut to what the target's last pass without a draft says fits in this many "
        "milliseconds (at least 1), so tokens reach the client at least about this often however slow the "
        "target; 0 = SPECDEC_DECODE_STEPS alone decides.",
        ge=0,
    )
    trace_rejected_rows: bool = env(
        "SPECDEC_TRACE_REJECTED_ROWS",
        True,
        "A traced generation's rows show the target's argmax at every draft "
        "position, also after the first rejection; off: only what the accept rule read.",
    )
    lease: LeaseConfig = Field(default_factory=LeaseConfig)
    max_concurrent: int = env("SPECDEC_MAX_CONCURRENT", 64, "Generations at once; more get RESOURCE_EXHAUSTED.", ge=1)
    first_check_wait_s: float = env(
        "SPECDEC_FIRST_CHECK_WAIT_S",
        10.0,
        "A request arriving before the first pool check finished waits this "
        "long (or its own deadline) for it instead of failing UNAVAILABLE.",
        ge=0,
    )
    health_refresh_s: float = env(
        "SPECDEC_HEALTH_REFRESH_S", 2.0, "Seconds between checks of the replica pools and Redis.", gt=0
    )
    limits: Limits = Field(default_factory=Limits)
    retry: RetryConfig = Field(default_factory=RetryConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)

    @property
    def lease_s(self) -> float:
        """The session lease length (LeaseConfig.seconds)."""
        return self.lease.seconds
