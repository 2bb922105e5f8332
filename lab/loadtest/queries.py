"""What the load test asks: query pools per expected tier and the tier mix.

Pools (`build_pools`):
- A: the demo's help-centre questions whose expected tier is A, plus short chit-chat;
- B: the demo's B questions, plus the single-hop benchmark sets (SQuAD, NQ-open, TriviaQA);
- C: the demo's C questions, plus the multi-hop benchmark sets (MuSiQue, HotpotQA, 2Wiki).
Benchmark questions come from the `test` split only (`adaptive_rag.evaluation.datasets`, read from
`ARAG_DATA_DIR`, default `../shared/data`), never `train`: those train the classifier.

The mix (`parse_mix`, default A 60 %, B 30 %, C 10 %) is kept exactly by a smooth weighted round
robin shared by every user of the process (`QueryPicker`): every ten requests hold six A, three B
and one C, interleaved (A B A C A B A ...), so even a short run sends every tier; inside a tier the
pool is walked in a seeded shuffled order.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEMO_QUESTIONS = REPO / "demo" / "questions.json"
TIERS = ("A", "B", "C")
DEFAULT_MIX = "A=60,B=30,C=10"
SOURCES = ("demo", "benchmark", "all")
LOG = logging.getLogger("lab.loadtest.queries")

# Short small talk: what a support chat gets besides questions (expected tier A).
CHIT_CHAT = (
    "hi", "hello!", "hey there", "good morning", "thanks!", "thank you so much", "ok, great",
    "how are you?", "who are you?", "what can you help me with?", "bye", "see you later",
    "are you a bot?", "can I talk to a human?", "that helped, thanks", "good evening",
)
SINGLE_HOP_SETS = ("squad", "nq", "trivia")  # expected tier B
MULTI_HOP_SETS = ("musique", "hotpotqa", "2wiki")  # expected tier C


@dataclass(frozen=True, slots=True)
class Query:
    text: str
    expected_tier: str
    source: str  # "demo", "chit-chat" or the benchmark dataset's name


def parse_mix(text: str | Mapping[str, float]) -> dict[str, float]:
    """`"A=60,B=30,C=10"` (or `"60,30,10"`, or a mapping) -> shares summing to 1."""
    if isinstance(text, Mapping):
        raw = {str(k).upper(): float(v) for k, v in text.items()}
    else:
        parts = [p.strip() for p in str(text).split(",") if p.strip()]
        if parts and all("=" not in p for p in parts):
            if len(parts) != len(TIERS):
                raise ValueError(f"mix {text!r}: give three numbers (A,B,C) or A=..,B=..,C=..")
            raw = dict(zip(TIERS, (float(p) for p in parts)))
        else:
            raw = {}
            for part in parts:
                tier, _, value = part.partition("=")
                raw[tier.strip().upper()] = float(value)
    unknown = set(raw) - set(TIERS)
    if unknown:
        raise ValueError(f"mix {text!r}: unknown tier(s) {sorted(unknown)}; tiers are A, B, C")
    if any(v < 0 for v in raw.values()) or sum(raw.values()) <= 0:
        raise ValueError(f"mix {text!r}: shares must be >= 0 and not all 0")
    total = sum(raw.values())
    return {tier: raw.get(tier, 0.0) / total for tier in TIERS}


def demo_queries(path: Path = DEMO_QUESTIONS) -> list[Query]:
    rows = json.loads(path.read_text(encoding="utf-8"))
    return [Query(r["question"], r["expected_tier"], "demo") for r in rows if r.get("expected_tier") in TIERS]


def benchmark_queries(data_dir: Path, per_dataset: int | None = 200) -> list[Query]:
    """Single-hop sets as B, multi-hop sets as C; `test` split only, first `per_dataset` of each."""
    from adaptive_rag.evaluation.datasets import limit_per_dataset, load_questions

    found = limit_per_dataset(
        load_questions(Path(data_dir), SINGLE_HOP_SETS + MULTI_HOP_SETS, split="test"), per_dataset)
    return [Query(q.question, "C" if q.dataset in MULTI_HOP_SETS else "B", q.dataset)
            for q in found if q.question and q.split == "test"]


def build_pools(source: str = "all", data_dir: Path | None = None,
                per_dataset: int | None = 200) -> dict[str, list[Query]]:
    """Queries per expected tier from `source` (demo | benchmark | all)."""
    if source not in SOURCES:
        raise ValueError(f"query source {source!r}: one of {', '.join(SOURCES)}")
    queries: list[Query] = []
    if source in ("demo", "all"):
        queries += demo_queries()
        queries += [Query(text, "A", "chit-chat") for text in CHIT_CHAT]
    if source in ("benchmark", "all"):
        if data_dir is None:
            from adaptive_rag.settings import Settings

            data_dir = Settings().data_dir
        data_dir = Path(data_dir)
        if not data_dir.is_absolute() and not data_dir.is_dir() and (REPO / data_dir).is_dir():
            data_dir = REPO / data_dir  # the default ../shared/data is relative to the repository
        try:
            queries += benchmark_queries(data_dir, per_dataset)
        except Exception as exc:  # noqa: BLE001 - a missing data dir only narrows the default pools
            if source == "benchmark":
                raise
            LOG.warning("benchmark questions not loaded (%s); using the demo pools only", exc)
        if source == "benchmark":  # chit-chat is A's only pool there
            queries += [Query(text, "A", "chit-chat") for text in CHIT_CHAT]
    pools: dict[str, list[Query]] = {tier: [] for tier in TIERS}
    for query in queries:
        pools[query.expected_tier].append(query)
    return pools


class QueryPicker:
    """Next query: the tier by smooth weighted round robin over `mix`, the query by walking a
    seeded shuffle of that tier's pool. Thread-safe and shared by every user of a process.

    `distinct`: every text gets a tag `[seed.pass]`, so no two calls of a run (nor of runs with
    other seeds) send the same text and the front door's routing cache never answers; what a
    ceiling of distinct queries measures (the tagged text is classified like any new query)."""

    def __init__(self, pools: Mapping[str, Iterable[Query]], mix: Mapping[str, float], seed: int = 0,
                 distinct: bool = False) -> None:
        self.pools = {tier: list(pools.get(tier, ())) for tier in TIERS}
        self.mix = {tier: share for tier, share in mix.items() if share > 0}
        empty = [tier for tier in self.mix if not self.pools[tier]]
        if empty:
            raise ValueError(f"no queries for tier(s) {empty} but the mix asks for them")
        self._random = random.Random(seed)
        self.seed, self.distinct = seed, distinct
        for pool in self.pools.values():
            self._random.shuffle(pool)
        self._next_index = {tier: 0 for tier in TIERS}
        self._credit = {tier: 0.0 for tier in self.mix}
        self._lock = threading.Lock()

    def next_tier(self) -> str:
        with self._lock:
            for tier, share in self.mix.items():
                self._credit[tier] += share
            tier = max(self._credit, key=lambda t: (self._credit[t], -TIERS.index(t)))
            self._credit[tier] -= 1.0
            return tier

    def next(self) -> Query:
        tier = self.next_tier()
        with self._lock:
            pool = self.pools[tier]
            index = self._next_index[tier]
            query = pool[index % len(pool)]
            self._next_index[tier] += 1
        if self.distinct:
            query = Query(f"{query.text} [{self.seed}.{index // len(pool)}]", query.expected_tier, query.source)
        return query
