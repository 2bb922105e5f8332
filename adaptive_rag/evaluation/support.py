"""The `support` suite: a help centre's FAQ as the knowledge base and the traffic a support
backend sees, measured end to end (routing, retrieval, answer, abstention, time).

Built from the COVID FAQ files in the data directory (see its SOURCES.md):

- knowledge base: the 213 entries of `covid-faq_en_covid-qa.csv` (title = question, text = answer),
  imported and chunked like a tenant's help centre (`knowledge.importers` / `knowledge.chunking`
  when present; one passage per entry, ids derived the same way, otherwise);
- queries, each with a stable id, gold tier and gold entries:
  `paraphrase` (B): each distinct `question_2` of a positive pair of the similarity file, gold =
  every entry of its `question_1` (one paraphrase names two FAQ questions, both count);
  `faq` (B): each distinct FAQ question (five questions occur twice; both entries count);
  `small_talk` (A): the turns in `support_data/small_talk.txt`; gold: a canned reply, no abstain;
  `joined` (C): two FAQ questions asked as one ("X? And Y?"), pairs sampled with a fixed seed,
  gold = both entries;
  `out_of_kb` (B, must abstain): general-knowledge questions from NQ-open, TriviaQA and SQuAD dev,
  drawn by a stable hash, minus those whose topic a health FAQ may cover (virus, disease ...).
  Gold tier B because the router cannot know what a tenant's knowledge base holds: retrieval
  finds nothing and the strategy abstains; tier A would answer from the model's own memory.
- split: `split_of("support", query id)`, the same 60/40 hash rule as the benchmark.

Metrics per row (a router, or a fixed tier) and query kind: hit@1 / hit@5 of the gold entry among
the chunks the strategy read (a joined question needs both entries in its first five; its hit@1
needs either at the top), answer token F1 and ROUGE-L against the gold FAQ answer (max over
duplicate entries; a joined question's two answers are concatenated), abstain rate (the goal on
out-of-KB queries, a false abstain on in-KB ones), tier accuracy against the gold tiers, seconds
per query overall and per executed tier; bootstrap 95 % intervals on every rate and mean.
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import random
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from adaptive_rag.contracts import StrategyName, Tier
from adaptive_rag.domain import Passage
from adaptive_rag.errors import ConfigurationError
from adaptive_rag.evaluation.datasets import load_questions, split_of
from adaptive_rag.evaluation.metrics import f1_score
from adaptive_rag.evaluation.runner import load_keyed_jsonl
from adaptive_rag.knowledge.documents import Document, Section, derived_document_id, normalise_title
from adaptive_rag.ports import LLM, Retriever
from adaptive_rag.routing.rules import asks_several_things
from adaptive_rag.routing.small_talk import small_talk_intent
from adaptive_rag.settings import Settings, multi_step_strategy

SUITE = "support"
FAQ_FILE = "covid-faq_en_covid-qa.csv"
SIMILARITY_FILE = "covid-faq_question-similarity-en_covid-qa.csv"
SMALL_TALK_FILE = Path(__file__).with_name("support_data") / "small_talk.txt"

PARAPHRASE, FAQ, SMALL_TALK, JOINED, OUT_OF_KB = "paraphrase", "faq", "small_talk", "joined", "out_of_kb"
# The help centre's kinds (`evaluation.help_centre`): a question one of its articles answers, and
# one about its own products or services that no article answers (off-topic ones are `out_of_kb`).
QUESTION, UNCOVERED = "question", "uncovered"
KINDS = (PARAPHRASE, FAQ, QUESTION, SMALL_TALK, JOINED, UNCOVERED, OUT_OF_KB)
IN_KB = frozenset({PARAPHRASE, FAQ, QUESTION, JOINED})
EXPECT_ABSTAIN = frozenset({UNCOVERED, OUT_OF_KB})
GOLD_TIER = {PARAPHRASE: Tier.B, FAQ: Tier.B, QUESTION: Tier.B, SMALL_TALK: Tier.A, JOINED: Tier.C,
             UNCOVERED: Tier.B, OUT_OF_KB: Tier.B}
COVID_FAQ = "covid-faq"
FOLLOW_UPS_FILE = Path(__file__).with_name("support_data") / "follow_ups.jsonl"

JOINED_COUNT = 60
JOINED_SEED = 20240403
OUT_OF_KB_COUNT = 80
OUT_OF_KB_DATASETS = ("nq", "trivia", "squad")
# Out-of-KB questions must really be out of a health FAQ: drop these topics (and SQuAD's
# Immune_system article), so "abstain" is the right gold behaviour for every one kept.
_HEALTH_TOPIC = re.compile(
    r"(covid|corona|virus|viral|pandemic|epidemic|vaccin|influenza|\bflu\b|infect|quarantin|"
    r"immun|pathogen|disease|symptom|germ|bacteri|\bmasks?\b)",
    re.IGNORECASE,
)

ROUTER_ROW = "router"
SMALL_TALK_STRATEGY = StrategyName.SMALL_TALK
FIXED_ROWS = {"always_a": Tier.A, "always_b": Tier.B, "always_c": Tier.C}
HIT_K = 5

RouterFn = Callable[[str], Any]  # query -> Tier, or anything with a `.tier` (a RoutingDecision)


# --- the suite ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FaqEntry:
    """One FAQ row and the document id the knowledge base knows it by."""

    doc_id: str
    question: str
    answer: str
    row: int


@dataclass(frozen=True, slots=True)
class SupportQuery:
    """One query of the suite.

    `gold_groups` holds, per part of the question, the entries that answer it (more than one when
    the FAQ repeats a question); a joined question has two groups. `gold_answers` are the answer
    texts to score against (max over them).
    """

    id: str
    kind: str
    query: str
    gold_tier: Tier
    gold_groups: tuple[tuple[str, ...], ...] = ()
    gold_answers: tuple[str, ...] = ()
    expect_abstain: bool = False
    split_key: str = SUITE  # the namespace of the split hash (a question set shared with another experiment keeps its own)

    @property
    def split(self) -> str:
        return split_of(self.split_key, self.id)

    @property
    def in_kb(self) -> bool:
        return self.kind in IN_KB


@dataclass(frozen=True, slots=True)
class FollowUpTurn:
    """A two-turn conversation: a question, a follow-up that only makes sense after it, the same
    follow-up written to stand alone (the reference), and the documents that answer it."""

    id: str
    previous: str
    follow_up: str
    standalone: str
    gold: tuple[str, ...]
    split_key: str = SUITE

    @property
    def split(self) -> str:
        return split_of(self.split_key, self.id)


@dataclass
class SupportSuite:
    entries: list[FaqEntry]
    passages: list[Passage]
    queries: list[SupportQuery]
    follow_ups: list[FollowUpTurn] = field(default_factory=list)
    name: str = COVID_FAQ
    description: str = ""
    # Never used to design or tune anything (no rule, threshold or phrase was chosen on any of its
    # questions): every split is unseen, so its checks are also reported over all its questions.
    held_out: bool = False

    def select(self, split: str | None = None, limit: int | None = None) -> list[SupportQuery]:
        """Queries of `split` (all with None), in a stable interleaved order (kinds mixed, so a
        partial run covers every kind), at most `limit` per kind."""
        chosen = [q for q in self.queries if split is None or q.split == split]
        chosen.sort(key=lambda q: (_rank(q.id), q.id))
        if not limit:
            return chosen
        seen: Counter[str] = Counter()
        kept = []
        for query in chosen:
            if seen[query.kind] < limit:
                kept.append(query)
                seen[query.kind] += 1
        return kept


def _rank(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _key(text: str) -> str:
    return hashlib.sha256(normalise_title(text).encode()).hexdigest()[:12]


def _read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        raise ConfigurationError(f"support suite file missing: {path} (set ARAG_DATA_DIR)")
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def faq_documents(path: Path) -> list[Document]:
    """The FAQ file as a tenant would import it: the importer's documents when it exists, else
    the same mapping (title = question, text = answer, id derived from the question; a repeated
    question gets its row number appended). The file's repeated questions are expected, so the
    importer's warnings about them are not shown."""
    try:
        from adaptive_rag.knowledge.importers import import_path
    except ImportError:
        import_path = None
    if import_path is not None:
        return list(import_path(path, on_warning=lambda message: None))
    documents = []
    seen: set[str] = set()
    for row, record in enumerate(_read_csv(path), start=1):
        doc_id = derived_document_id(record["question"], prefix="faq")
        if doc_id in seen:
            doc_id = f"{doc_id}-{row}"
        seen.add(doc_id)
        documents.append(Document(
            id=doc_id, title=record["question"].strip(),
            sections=(Section("", record["answer"].strip()),),
            url=record.get("link", ""), source=path.name,
        ))
    return documents


def kb_passages(documents: Sequence[Document], settings: Settings) -> list[Passage]:
    """The documents cut into passages like a tenant's knowledge base (one per document until
    the chunker exists); every passage carries its `doc_id`."""
    try:
        from adaptive_rag.knowledge import chunking
    except ImportError:
        chunking = None
    if chunking is not None and hasattr(chunking, "chunk_documents"):
        return list(chunking.chunk_documents(
            documents, max_words=settings.chunk_words, overlap_words=settings.chunk_overlap_words
        ))
    if chunking is not None and hasattr(chunking, "chunk_document"):
        return [p for doc in documents for p in chunking.chunk_document(
            doc, max_words=settings.chunk_words, overlap_words=settings.chunk_overlap_words
        )]
    return [Passage(id=f"{d.id}#0", title=d.title, text=d.text, doc_id=d.id) for d in documents]


def faq_entries(rows: Sequence[Mapping[str, str]], documents: Sequence[Document]) -> list[FaqEntry]:
    """Each CSV row paired with its document: the k-th row of a question gets the k-th document
    with that title, so repeated questions keep distinct ids whatever suffix the importer uses."""
    by_title: dict[str, list[Document]] = defaultdict(list)
    for doc in documents:
        by_title[normalise_title(doc.title)].append(doc)
    used: Counter[str] = Counter()
    entries = []
    for row, record in enumerate(rows):
        title = normalise_title(record["question"])
        candidates = by_title.get(title, [])
        if used[title] >= len(candidates):
            raise ConfigurationError(f"FAQ row {row} ({record['question']!r}) has no imported document")
        doc = candidates[used[title]]
        used[title] += 1
        entries.append(FaqEntry(doc.id, record["question"].strip(), record["answer"].strip(), row))
    return entries


def load_small_talk(path: Path = SMALL_TALK_FILE) -> list[str]:
    """Turns of the small-talk file: one a line, `#` comments and blank lines skipped."""
    lines = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
    return list(dict.fromkeys(line for line in lines if line and not line.startswith("#")))


def join_questions(first: str, second: str) -> str:
    """'X? And y?': the second question's first letter lowered unless it starts an acronym."""
    head = first.strip().rstrip("?.! ")
    tail = second.strip()
    if len(tail) > 1 and tail[1].islower():
        tail = tail[0].lower() + tail[1:]
    return f"{head}? And {tail.rstrip('?.! ')}?"


def build_suite(
    data_dir: Path,
    settings: Settings | None = None,
    joined: int = JOINED_COUNT,
    out_of_kb: int = OUT_OF_KB_COUNT,
    seed: int = JOINED_SEED,
) -> SupportSuite:
    """The whole suite (both splits) from the data directory."""
    settings = settings or Settings()
    data_dir = Path(data_dir)
    rows = _read_csv(data_dir / FAQ_FILE)
    documents = faq_documents(data_dir / FAQ_FILE)
    entries = faq_entries(rows, documents)
    by_question: dict[str, list[FaqEntry]] = defaultdict(list)
    for entry in entries:
        by_question[normalise_title(entry.question)].append(entry)

    def gold(question: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        found = by_question[normalise_title(question)]
        return tuple(e.doc_id for e in found), tuple(e.answer for e in found)

    queries: list[SupportQuery] = []
    # (a) paraphrases: one query per distinct question_2, gold = every entry of its question_1s.
    paraphrases: dict[str, tuple[str, list[str]]] = {}
    for pair in _read_csv(data_dir / SIMILARITY_FILE):
        if pair["similar"].strip() != "1":
            continue
        if normalise_title(pair["question_1"]) not in by_question:
            raise ConfigurationError(f"paraphrase pair names no FAQ entry: {pair['question_1']!r}")
        text, targets = paraphrases.setdefault(normalise_title(pair["question_2"]), (pair["question_2"].strip(), []))
        if pair["question_1"] not in targets:
            targets.append(pair["question_1"])
    for key, (text, targets) in paraphrases.items():
        ids: dict[str, None] = {}
        answers: dict[str, None] = {}
        for target in targets:
            doc_ids, texts = gold(target)
            ids.update(dict.fromkeys(doc_ids))
            answers.update(dict.fromkeys(texts))
        queries.append(SupportQuery(
            id=f"para-{_key(key)}", kind=PARAPHRASE, query=text, gold_tier=GOLD_TIER[PARAPHRASE],
            gold_groups=(tuple(ids),), gold_answers=tuple(answers),
        ))
    # (b) the FAQ questions themselves, one query per distinct question.
    distinct = [found[0].question for found in by_question.values()]
    for question in distinct:
        doc_ids, answers = gold(question)
        queries.append(SupportQuery(
            id=f"faq-{_key(question)}", kind=FAQ, query=question, gold_tier=GOLD_TIER[FAQ],
            gold_groups=(doc_ids,), gold_answers=answers,
        ))
    # (c) small talk.
    for turn in load_small_talk():
        queries.append(SupportQuery(
            id=f"talk-{_key(turn)}", kind=SMALL_TALK, query=turn, gold_tier=GOLD_TIER[SMALL_TALK],
        ))
    # (d) two distinct FAQ questions joined, pairs drawn with a fixed seed.
    rng = random.Random(seed)
    pairs: dict[tuple[int, int], None] = {}
    while len(pairs) < min(joined, len(distinct) * (len(distinct) - 1)):
        first, second = rng.sample(range(len(distinct)), 2)
        pairs.setdefault((first, second), None)
    for first, second in pairs:
        (ids_1, answers_1), (ids_2, answers_2) = gold(distinct[first]), gold(distinct[second])
        queries.append(SupportQuery(
            id=f"joined-{_key(distinct[first] + ' | ' + distinct[second])}", kind=JOINED,
            query=join_questions(distinct[first], distinct[second]), gold_tier=GOLD_TIER[JOINED],
            gold_groups=(ids_1, ids_2),
            gold_answers=tuple(f"{a}\n\n{b}" for a, b in itertools.product(answers_1, answers_2)),
        ))
    # (e) out-of-knowledge-base questions from the open-domain sets, drawn by a stable hash.
    queries.extend(_out_of_kb(data_dir, out_of_kb))
    return SupportSuite(entries, kb_passages(documents, settings), queries, covid_follow_ups(entries),
                        COVID_FAQ, f"the COVID FAQ ({len(entries)} entries)")


def covid_follow_ups(entries: Sequence[FaqEntry], path: Path = FOLLOW_UPS_FILE) -> list[FollowUpTurn]:
    """The FAQ's two-turn conversations (`support_data/follow_ups.jsonl`), gold rows as documents."""
    if not path.is_file():
        return []
    doc_of_row = {entry.row: entry.doc_id for entry in entries}
    turns = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            item = json.loads(line)
            turns.append(FollowUpTurn(item["id"], item["previous"], item["follow_up"], item["standalone"],
                                      tuple(doc_of_row[row] for row in item["gold_rows"])))
    return turns


def _out_of_kb(data_dir: Path, count: int) -> list[SupportQuery]:
    per_dataset = [count // len(OUT_OF_KB_DATASETS) + (i < count % len(OUT_OF_KB_DATASETS))
                   for i in range(len(OUT_OF_KB_DATASETS))]
    chosen: list[SupportQuery] = []
    for dataset, quota in zip(OUT_OF_KB_DATASETS, per_dataset):
        candidates = [
            q for q in load_questions(data_dir, [dataset])
            if not _HEALTH_TOPIC.search(q.question) and "Immune system" not in q.supporting_titles
        ]
        candidates.sort(key=lambda q: _rank(f"{SUITE}:{q.dataset}:{q.id}"))
        for question in candidates[:quota]:
            chosen.append(SupportQuery(
                id=f"ookb-{dataset}-{question.id}", kind=OUT_OF_KB, query=question.question,
                gold_tier=GOLD_TIER[OUT_OF_KB], gold_answers=question.answers, expect_abstain=True,
            ))
    return chosen


# --- metrics -----------------------------------------------------------------------------------


def doc_id_of(passage_id: str, doc_id: str = "") -> str:
    """A chunk's document: its `doc_id`, else the part of its id before `#<position>`."""
    return doc_id or passage_id.rsplit("#", 1)[0]


def retrieval_hits(doc_ids: Sequence[str], gold_groups: Sequence[Sequence[str]], k: int = HIT_K) -> tuple[float, float]:
    """(hit@1, hit@k): the top chunk is a gold entry; every gold group has an entry in the top k."""
    if not gold_groups:
        return 0.0, 0.0
    gold_any = {d for group in gold_groups for d in group}
    top = list(doc_ids[:k])
    hit_1 = float(bool(top) and top[0] in gold_any)
    hit_k = float(all(any(d in top for d in group) for group in gold_groups))
    return hit_1, hit_k


_ROUGE = None


def rouge_l(prediction: str, golds: Sequence[str]) -> float:
    """ROUGE-L F-measure (rouge-score, Porter stemming), max over gold answers; 0 when empty."""
    global _ROUGE
    if not prediction.strip() or not golds:
        return 0.0
    if _ROUGE is None:
        from rouge_score import rouge_scorer

        _ROUGE = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return max(_ROUGE.score(gold, prediction)["rougeL"].fmeasure for gold in golds)


def bootstrap_interval(
    values: Sequence[float], resamples: int = 1000, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean of `values` (None when there are none)."""
    import numpy as np

    if len(values) == 0:
        return None
    data = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, len(data), size=(resamples, len(data)))].mean(axis=1)
    tail = (1 - confidence) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def mean_with_interval(values: Sequence[float]) -> dict[str, Any]:
    """`{"mean", "low", "high", "n"}` of `values` (mean None when empty)."""
    interval = bootstrap_interval(values)
    return {
        "mean": sum(values) / len(values) if values else None,
        "low": interval[0] if interval else None,
        "high": interval[1] if interval else None,
        "n": len(values),
    }


# --- running -----------------------------------------------------------------------------------


@dataclass
class SupportOutcome:
    """One strategy's result on one query, as run (scored when the report is written)."""

    query_id: str
    strategy: str
    answer: str
    answerable: bool
    abstain_reason: str
    steps: int
    seconds: float
    passage_ids: list[str] = field(default_factory=list)
    doc_ids: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str]:
        return (self.query_id, self.strategy)


@dataclass(frozen=True)
class Routed:
    """The strategy a row picked for a query, the tier it stands for and the routing time."""

    strategy: str
    tier: Tier
    routing_s: float = 0.0
    reason: str = ""


def rules_support_router(query: str) -> Tier:
    """The default router of the suite: the rule classifier's tier."""
    from adaptive_rag.routing.rules import rules_router

    return rules_router(query).tier


def route(
    row: str, query: str, settings: Settings, router: RouterFn = rules_support_router,
    small_talk: bool = True,
) -> Routed:
    """The strategy row `row` runs for `query`: a fixed tier, or the small-talk detector in front
    of `router` (small talk is answered by its canned reply, no LLM)."""
    from adaptive_rag.strategies import strategy_for_tier

    if row in FIXED_ROWS:
        tier = FIXED_ROWS[row]
        return Routed(strategy_for_tier(tier, settings), tier, 0.0, f"fixed {tier.value}")
    if row != ROUTER_ROW:
        raise ConfigurationError(f"unknown support row {row!r}; choose {ROUTER_ROW} or {', '.join(FIXED_ROWS)}")
    start = time.perf_counter()
    talk = small_talk_intent(query) if small_talk else None
    if talk is not None:
        return Routed(SMALL_TALK_STRATEGY, Tier.A, time.perf_counter() - start, f"small talk: {talk.intent}")
    decided = router(query)
    tier = Tier(getattr(decided, "tier", decided))
    if tier is not Tier.C and asks_several_things(query):  # as serving does (`escalate_several_things`)
        return Routed(strategy_for_tier(Tier.C, settings), Tier.C, time.perf_counter() - start,
                      "router; several questions in one: C")
    return Routed(strategy_for_tier(tier, settings), tier, time.perf_counter() - start, "router")


def load_support_outcomes(path: Path) -> dict[tuple[str, str], SupportOutcome]:
    """Outcomes already on disk; a line cut short by a crash is ignored (and redone)."""
    return load_keyed_jsonl(path, SupportOutcome)


def _small_talk_outcome(query: SupportQuery) -> SupportOutcome:
    start = time.perf_counter()
    talk = small_talk_intent(query.query)
    reply = talk.reply if talk else ""
    return SupportOutcome(
        query_id=query.id, strategy=SMALL_TALK_STRATEGY, answer=reply, answerable=True,
        abstain_reason="", steps=0, seconds=time.perf_counter() - start,
        trace=[f"small talk: {talk.intent}" if talk else "not small talk"],
    )


def run_support(
    queries: Sequence[SupportQuery],
    rows: Sequence[str],
    strategies: Mapping[str, Any],
    results_path: Path,
    settings: Settings,
    router: RouterFn = rules_support_router,
    on_progress: Callable[[int], None] | None = None,
) -> dict[tuple[str, str], SupportOutcome]:
    """Run, for every query and row, the strategy the row picks, unless `results_path` already
    holds that (query, strategy) outcome; rows share outcomes (the router's B is always-B's B).

    `strategies` maps strategy names to built strategies (`build_strategy`); each outcome is
    appended to `results_path` as soon as it exists, so an interrupted run resumes.
    """
    from adaptive_rag.evaluation.runner import _end_last_line

    results_path.parent.mkdir(parents=True, exist_ok=True)
    outcomes = load_support_outcomes(results_path)
    _end_last_line(results_path)
    with results_path.open("a", encoding="utf-8") as sink:
        for query in queries:
            for row in rows:
                routed = route(row, query.query, settings, router)
                key = (query.id, routed.strategy)
                if key not in outcomes:
                    if routed.strategy == SMALL_TALK_STRATEGY:
                        outcome = _small_talk_outcome(query)
                    else:
                        if routed.strategy not in strategies:
                            raise ConfigurationError(f"no strategy {routed.strategy!r} was built")
                        result = strategies[routed.strategy].run(query.query)
                        outcome = SupportOutcome(
                            query_id=query.id, strategy=routed.strategy, answer=result.answer,
                            answerable=result.answerable, abstain_reason=result.abstain_reason,
                            steps=result.steps, seconds=result.timings.get("total", 0.0),
                            passage_ids=[p.id for p in result.passages],
                            doc_ids=[doc_id_of(p.id, p.doc_id) for p in result.passages],
                            scores=[round(p.score, 4) for p in result.passages],
                            trace=list(result.trace),
                        )
                    sink.write(json.dumps(asdict(outcome)) + "\n")
                    sink.flush()
                    outcomes[key] = outcome
                if on_progress:
                    on_progress(1)
    return outcomes


# --- summaries ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scored:
    """One query in one row: what ran and how it scored (None: the metric does not apply)."""

    query: SupportQuery
    routed: Routed
    outcome: SupportOutcome
    hit_1: float | None
    hit_5: float | None
    f1: float | None
    rouge_l: float | None

    @property
    def abstained(self) -> float:
        return float(not self.outcome.answerable)

    @property
    def tier_correct(self) -> float:
        return float(self.routed.tier == self.query.gold_tier)

    @property
    def seconds(self) -> float:
        return self.outcome.seconds + self.routed.routing_s


def score_row(
    row: str,
    queries: Iterable[SupportQuery],
    outcomes: Mapping[tuple[str, str], SupportOutcome],
    settings: Settings,
    router: RouterFn = rules_support_router,
) -> list[Scored]:
    """Every query of `row` that has its outcome, scored."""
    scored = []
    for query in queries:
        routed = route(row, query.query, settings, router)
        outcome = outcomes.get((query.id, routed.strategy))
        if outcome is None:
            continue
        hit_1 = hit_5 = f1 = rouge = None
        if query.in_kb:
            hit_1, hit_5 = retrieval_hits(outcome.doc_ids, query.gold_groups)
            f1 = f1_score(outcome.answer, query.gold_answers) if outcome.answer else 0.0
            rouge = rouge_l(outcome.answer, query.gold_answers)
        scored.append(Scored(query, routed, outcome, hit_1, hit_5, f1, rouge))
    return scored


METRICS = ("hit_1", "hit_5", "f1", "rouge_l", "abstain", "tier_accuracy", "seconds")


def summarise_scored(items: Sequence[Scored]) -> dict[str, Any]:
    """Mean and bootstrap interval of each metric over `items` (None where none applies)."""
    def values(name: str) -> list[float]:
        picked = {
            "abstain": [s.abstained for s in items],
            "tier_accuracy": [s.tier_correct for s in items],
            "seconds": [s.seconds for s in items],
        }.get(name)
        if picked is not None:
            return picked
        return [v for v in (getattr(s, name) for s in items) if v is not None]

    cell: dict[str, Any] = {"n": len(items)}
    for name in METRICS:
        cell[name] = mean_with_interval(values(name))
    cell["steps"] = sum(s.outcome.steps for s in items) / len(items) if items else None
    return cell


def summarise_row(items: Sequence[Scored]) -> dict[str, Any]:
    """Per kind, and overall: answer metrics over in-KB queries, abstain rate on out-of-KB ones
    (goal) and in-KB ones (false abstain), tier accuracy and time over all; time per tier run."""
    by_kind: dict[str, list[Scored]] = defaultdict(list)
    for item in items:
        by_kind[item.query.kind].append(item)
    kinds = {kind: summarise_scored(by_kind[kind]) for kind in KINDS if by_kind.get(kind)}
    in_kb = [s for s in items if s.query.in_kb]
    out = [s for s in items if s.query.kind in EXPECT_ABSTAIN]
    talk = [s for s in items if s.query.kind == SMALL_TALK]
    overall = summarise_scored(items)
    for name in ("hit_1", "hit_5", "f1", "rouge_l"):
        overall[name] = summarise_scored(in_kb)[name]
    overall["false_abstain"] = mean_with_interval([s.abstained for s in in_kb])
    overall["out_of_kb_abstain"] = mean_with_interval([s.abstained for s in out])
    overall["small_talk_abstain"] = mean_with_interval([s.abstained for s in talk])
    del overall["abstain"]
    by_tier: dict[str, list[float]] = defaultdict(list)
    for item in items:
        by_tier[item.routed.tier.value].append(item.seconds)
    overall["seconds_by_tier"] = {
        tier: {"mean": sum(v) / len(v), "n": len(v)} for tier, v in sorted(by_tier.items())
    }
    overall["routed"] = dict(sorted(Counter(s.routed.strategy for s in items).items()))
    return {"overall": overall, "kinds": kinds}


def paired_difference(
    a: Sequence[Scored], b: Sequence[Scored], metric: Callable[[Scored], float | None],
    resamples: int = 1000, seed: int = 0,
) -> dict[str, Any] | None:
    """Mean of metric(a) - metric(b) over the queries both rows scored, with a paired bootstrap
    95 % interval (the interval a claim "row a beats row b" rests on)."""
    theirs = {s.query.id: s for s in b}
    deltas = []
    for item in a:
        other = theirs.get(item.query.id)
        if other is None:
            continue
        mine, base = metric(item), metric(other)
        if mine is not None and base is not None:
            deltas.append(mine - base)
    if not deltas:
        return None
    return mean_with_interval(deltas) | {"resamples": resamples, "seed": seed}


def retriever_hits(
    queries: Iterable[SupportQuery], retriever: Retriever, k: int = HIT_K
) -> dict[str, Any]:
    """Retrieval alone (the question as the query, top k), per in-KB kind: hit@1 and hit@k."""
    per_kind: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for query in queries:
        if not query.in_kb:
            continue
        found = retriever.search(query.query, k)
        per_kind[query.kind].append(retrieval_hits([doc_id_of(p.id, p.doc_id) for p in found], query.gold_groups, k))
    table = {}
    for kind in KINDS:
        if kind in per_kind:
            table[kind] = {
                "hit_1": mean_with_interval([h[0] for h in per_kind[kind]]),
                "hit_5": mean_with_interval([h[1] for h in per_kind[kind]]),
            }
    pooled = [h for hits in per_kind.values() for h in hits]
    if pooled:
        table["in_kb"] = {
            "hit_1": mean_with_interval([h[0] for h in pooled]),
            "hit_5": mean_with_interval([h[1] for h in pooled]),
        }
    return table


def _interval(values: Sequence[float]) -> dict[str, Any] | None:
    from adaptive_rag.evaluation.bootstrap import bootstrap_mean

    found = bootstrap_mean({"all": list(values)})
    return found.as_dict() if found else None


def abstention_gate(queries: Iterable[SupportQuery], retriever: Retriever, abstention: Any,
                    k: int = HIT_K) -> dict[str, Any]:
    """Which questions the retrieval gate before the reader hands to a human (`Abstention.reason`,
    as every retrieving strategy calls it): caught = questions that must abstain and do, false =
    in-KB questions that do, and per kind. Retrieval only: no reader runs, so every question of
    the split counts, not only the ones a reader row ran."""
    by_kind: dict[str, list[float]] = defaultdict(list)
    pooled: dict[bool, list[float]] = defaultdict(list)  # in question order, so intervals are reproducible
    for query in queries:
        if query.kind == SMALL_TALK:
            continue
        found = retriever.search(query.query, k)
        value = float(abstention.reason(retriever, query.query, found) is not None)
        by_kind[query.kind].append(value)
        pooled[query.kind in EXPECT_ABSTAIN].append(value)
    return {
        "caught": _interval(pooled[True]),
        "false_abstain": _interval(pooled[False]),
        "kinds": {kind: _interval(by_kind[kind]) for kind in KINDS if by_kind.get(kind)},
    }


FOLLOW_UP_ROWS = ("standalone", "as_typed", "rewritten")


def follow_up_hits(turns: Sequence[FollowUpTurn], retriever: Retriever, k: int = HIT_K) -> dict[str, Any]:
    """Hit@k of each follow-up turn searched standalone (the reference), as typed, and rewritten
    by the conversation rules (`strategies.follow_up.standalone_question`, no reader), with each
    row's hit@k as a ratio to the standalone question's (paired bootstrap over turns)."""
    from adaptive_rag.evaluation.bootstrap import ratio_interval
    from adaptive_rag.strategies.follow_up import Turn, standalone_question

    if not turns:
        return {"turns": 0}
    hits: dict[str, dict[tuple[str, str], float]] = {row: {} for row in FOLLOW_UP_ROWS}
    records = []
    for turn in turns:
        rewrite = standalone_question(turn.follow_up, [Turn(turn.previous)])
        queries = {"standalone": turn.standalone, "as_typed": turn.follow_up, "rewritten": rewrite.question}
        record = {"id": turn.id, "split": turn.split, "queries": queries, "method": rewrite.method.value, "hit_5": {}}
        for row, query in queries.items():
            found = retriever.search(query, k)
            hit = retrieval_hits([doc_id_of(p.id, p.doc_id) for p in found], [turn.gold], k)[1]
            hits[row][("all", turn.id)] = hit
            record["hit_5"][row] = hit
        records.append(record)
    summary: dict[str, Any] = {"turns": len(turns), "k": k, "hit_5": {}, "vs_standalone": {}, "records": records}
    for row in FOLLOW_UP_ROWS:
        summary["hit_5"][row] = _interval(list(hits[row].values()))
        if row != "standalone":
            ratio = ratio_interval(hits[row], hits["standalone"])
            summary["vs_standalone"][row] = ratio.as_dict() if ratio else None
    summary["methods"] = dict(sorted(Counter(r["method"] for r in records).items()))
    return summary


def question_records(queries: Iterable[SupportQuery], retriever: Retriever, gates: Mapping[str, Any],
                     k: int = HIT_K) -> list[dict[str, Any]]:
    """Per question of every split (small talk aside): its kind and split, whether retrieval found
    its gold pages in the top k (in-KB ones) and whether each gate abstained; the raw records the
    knowledge base's figures recompute from."""
    records = []
    for query in queries:
        if query.kind == SMALL_TALK:
            continue
        found = retriever.search(query.query, k)
        hit = retrieval_hits([doc_id_of(p.id, p.doc_id) for p in found], query.gold_groups, k)[1] if query.in_kb else None
        records.append({
            "id": query.id, "kind": query.kind, "split": query.split, "in_kb": query.in_kb, "hit_5": hit,
            "abstained": {name: gate.reason(retriever, query.query, found) is not None for name, gate in gates.items()},
        })
    return records


def knowledge_base_checks(suite: SupportSuite, retriever: Retriever, abstention: Any, split: str,
                          k: int = HIT_K) -> dict[str, Any]:
    """The knowledge base's own figures, from retrieval alone (no reader, every question of
    `split`): hit@k of its in-KB questions, the abstention gate's caught / false, and its
    follow-up turns with and without rewriting (on `split`, and on every turn: the rewrite rules
    were never tuned on them)."""
    from adaptive_rag.strategies import Abstention

    queries = [q for q in suite.queries if q.split == split]
    never = Abstention()  # no threshold: abstains only when nothing at all is retrieved
    checks = {
        "name": suite.name, "description": suite.description, "split": split,
        "documents": len(suite.entries), "passages": len(suite.passages),
        "retrieval": retriever_hits(queries, retriever, k),
        "abstention": abstention_gate(queries, retriever, abstention, k),
        "abstention_no_threshold": abstention_gate(queries, retriever, never, k),
        "follow_ups": follow_up_hits([t for t in suite.follow_ups if t.split == split], retriever, k),
        "follow_ups_all_turns": follow_up_hits(suite.follow_ups, retriever, k),
        "held_out": suite.held_out,
    }
    checks["records"] = question_records(suite.queries, retriever, {"automatic": abstention, "none": never}, k)
    if suite.held_out:
        checks["all_questions"] = {
            "n": len(suite.queries),
            "retrieval": retriever_hits(suite.queries, retriever, k),
            "abstention": abstention_gate(suite.queries, retriever, abstention, k),
            "abstention_no_threshold": abstention_gate(suite.queries, retriever, never, k),
        }
    return checks


def threshold_sweep(
    queries: Iterable[SupportQuery], retriever: Retriever, k: int = HIT_K,
    thresholds: Sequence[float] | None = None,
) -> dict[str, Any]:
    """The retrieval threshold's trade-off, from BM25 top scores alone (no LLM): per threshold,
    the share of out-of-KB queries that would abstain and of in-KB queries that would abstain
    wrongly. `best` maximises their difference (Youden's J) over every distinct top score (or
    over `thresholds` when given); `points` is the curve on a grid of whole scores (or at
    `thresholds`). Run it on `train` only."""
    top: dict[str, list[float]] = defaultdict(list)
    for query in queries:
        if query.kind == SMALL_TALK:
            continue
        found = retriever.search(query.query, k)
        top["out" if query.kind in EXPECT_ABSTAIN else "in"].append(max((p.score for p in found), default=0.0))
    if not top["in"] or not top["out"]:
        return {"points": [], "best": None}

    def point(threshold: float) -> dict[str, float]:
        abstain_out = sum(s < threshold for s in top["out"]) / len(top["out"])
        false_in = sum(s < threshold for s in top["in"]) / len(top["in"])
        return {"threshold": threshold, "out_of_kb_abstain": abstain_out,
                "false_abstain": false_in, "j": abstain_out - false_in}

    if thresholds is None:
        # Just above each observed top score: the queries scoring exactly that abstain.
        candidates = sorted({0.0} | {round(s + 1e-4, 4) for s in top["in"] + top["out"]})
        grid = [float(t) for t in range(0, int(max(top["in"] + top["out"])) + 2)]
    else:
        candidates = grid = [float(t) for t in thresholds]
    best = max((point(t) for t in candidates), key=lambda p: (p["j"], -p["threshold"]))
    return {"points": [point(t) for t in grid], "best": best,
            "n_in": len(top["in"]), "n_out": len(top["out"])}


# --- report ------------------------------------------------------------------------------------


def _pct(cell: Mapping[str, Any] | None, interval: bool = True) -> str:
    if not cell or cell.get("mean") is None:
        return "-"
    text = f"{100 * cell['mean']:.1f}"
    if interval and cell.get("low") is not None:
        text += f" [{100 * cell['low']:.1f}, {100 * cell['high']:.1f}]"
    return text


def _secs(cell: Mapping[str, Any] | None) -> str:
    return "-" if not cell or cell.get("mean") is None else f"{cell['mean']:.2f}"


def support_markdown(report: Mapping[str, Any]) -> str:
    """The report's tables: overall per row, one per query kind, retrieval alone, routing, time."""
    rows: Mapping[str, Any] = report["rows"]
    meta = report["meta"]
    lines = ["# Support suite report", "", f"Command: `{meta.get('command', '')}`", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items() if k != "command"]
    lines += ["", "Values are percentages with bootstrap 95 % intervals; time in seconds per query.",
              "Answer metrics (hit, F1, ROUGE-L) are over in-KB queries (paraphrase, faq, joined).", ""]
    lines += ["## Overall", "",
              "| row | n | hit@1 | hit@5 | F1 | ROUGE-L | false abstain (in-KB) | abstain (out-of-KB) | "
              "abstain (small talk) | tier acc | s/query | s/query by tier |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for row, data in rows.items():
        o = data["overall"]
        by_tier = ", ".join(f"{t}: {v['mean']:.2f} ({v['n']})" for t, v in o["seconds_by_tier"].items())
        lines.append(
            f"| {row} | {o['n']} | {_pct(o['hit_1'])} | {_pct(o['hit_5'])} | {_pct(o['f1'])} | "
            f"{_pct(o['rouge_l'])} | {_pct(o['false_abstain'])} | {_pct(o['out_of_kb_abstain'])} | "
            f"{_pct(o['small_talk_abstain'])} | {_pct(o['tier_accuracy'])} | {_secs(o['seconds'])} | {by_tier} |"
        )
    differences = [(name, d) for name, d in report.get("differences", {}).items() if d]
    if differences:
        lines += ["", "Paired differences (bootstrap 95 % interval over the same queries):", ""]
    for name, diff in differences:
        lines.append(f"- {name}: {diff['mean']:+.3f} [{diff['low']:+.3f}, {diff['high']:+.3f}] (n={diff['n']})")
    for kind in KINDS:
        present = [(row, data["kinds"][kind]) for row, data in rows.items() if kind in data["kinds"]]
        if not present:
            continue
        lines += ["", f"## {kind} (gold tier {GOLD_TIER[kind].value}"
                  f"{', expected: abstain' if kind in EXPECT_ABSTAIN else ''})", "",
                  "| row | n | hit@1 | hit@5 | F1 | ROUGE-L | abstain | tier acc | s/query | steps |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for row, c in present:
            lines.append(
                f"| {row} | {c['n']} | {_pct(c['hit_1'])} | {_pct(c['hit_5'])} | {_pct(c['f1'])} | "
                f"{_pct(c['rouge_l'])} | {_pct(c['abstain'])} | {_pct(c['tier_accuracy'])} | "
                f"{_secs(c['seconds'])} | {c['steps']:.2f} |"
            )
    retrieval = report.get("retrieval") or {}
    if retrieval:
        lines += ["", f"## Retrieval alone (question as query, top {HIT_K})", "",
                  "| kind | n | hit@1 | hit@5 |", "| --- | ---: | ---: | ---: |"]
        for kind, cell in retrieval.items():
            lines.append(f"| {kind} | {cell['hit_1']['n']} | {_pct(cell['hit_1'])} | {_pct(cell['hit_5'])} |")
    lines += _knowledge_base_markdown(report.get("knowledge_base"))
    routed = {row: data["overall"]["routed"] for row, data in rows.items()}
    lines += ["", "## Strategies run per row", ""]
    lines += [f"- {row}: " + ", ".join(f"{k} {v}" for k, v in counts.items()) for row, counts in routed.items()]
    sweep = report.get("threshold_sweep") or {}
    if sweep.get("best"):
        best = sweep["best"]
        lines += ["", "## Retrieval threshold (chosen on train, BM25 top score only)", "",
                  f"Best by Youden's J over {sweep['n_in']} in-KB and {sweep['n_out']} out-of-KB train queries: "
                  f"min score {best['threshold']:.2f}: out-of-KB abstain {100 * best['out_of_kb_abstain']:.1f} %, "
                  f"false abstain {100 * best['false_abstain']:.1f} %."]
    return "\n".join(lines) + "\n"


def _ratio(cell: Mapping[str, Any] | None) -> str:
    if not cell:
        return "-"
    return f"{100 * cell['estimate']:.0f} % [{100 * cell['low']:.0f}, {100 * cell['high']:.0f}]"


def _estimate(cell: Mapping[str, Any] | None) -> str:
    if not cell:
        return "-"
    return f"{100 * cell['estimate']:.1f} [{100 * cell['low']:.1f}, {100 * cell['high']:.1f}]"


def _knowledge_base_markdown(checks: Mapping[str, Any] | None) -> list[str]:
    """The knowledge base's retrieval-only section: hit@5, the abstention gate, follow-ups."""
    if not checks:
        return []
    gate = checks["abstention"]
    lines = ["", f"## This knowledge base, retrieval alone ({checks['description']}, `{checks['split']}` split, "
                 "every question, no reader)", "",
             f"Abstention gate (relevance below {checks.get('abstain_min_relevance', 0):g}, as every retrieving "
             f"strategy checks before its reader): caught {_estimate(gate['caught'])} of the questions it must "
             f"abstain on, false abstentions {_estimate(gate['false_abstain'])} of the in-KB ones. Per kind: "
             + ", ".join(f"{kind} {_estimate(cell)} (n {cell['n']})" for kind, cell in gate["kinds"].items()) + "."]
    never = checks.get("abstention_no_threshold")
    if never:
        lines += ["", f"Without a threshold (never abstain, unless nothing at all is retrieved): caught "
                      f"{_estimate(never['caught'])}, false abstentions {_estimate(never['false_abstain'])}."]
    everything = checks.get("all_questions")
    if everything:
        pooled = (everything["retrieval"].get("in_kb") or {}).get("hit_5")
        lines += ["", f"Held out (no rule was designed or tuned on this knowledge base, so every split is "
                      f"unseen), all {everything['n']} questions, both splits: in-KB hit@{HIT_K} {_pct(pooled)}; "
                      f"abstention gate caught {_estimate(everything['abstention']['caught'])}, false "
                      f"{_estimate(everything['abstention']['false_abstain'])}; without a threshold caught "
                      f"{_estimate(everything['abstention_no_threshold']['caught'])}, false "
                      f"{_estimate(everything['abstention_no_threshold']['false_abstain'])}."]
    for label, key in (("the split's turns", "follow_ups"), ("every turn", "follow_ups_all_turns")):
        fu = checks.get(key) or {}
        if not fu.get("turns"):
            continue
        lines += ["", f"Follow-up turns, {label} ({fu['turns']}; rewriting: "
                      + ", ".join(f"{m} {n}" for m, n in fu["methods"].items()) + "):", "",
                  f"| row | hit@{fu['k']} | ratio to standalone |", "| --- | ---: | ---: |"]
        for row in FOLLOW_UP_ROWS:
            lines.append(f"| {row} | {_estimate(fu['hit_5'][row])} | {_ratio(fu['vs_standalone'].get(row))} |")
    return lines


def support_plot(report: Mapping[str, Any], path: Path) -> None:
    """Left: F1 (in-KB) against seconds per query per row. Right: abstain rate per kind per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for row, data in rows.items():
        o = data["overall"]
        if o["f1"]["mean"] is None or o["seconds"]["mean"] is None:
            continue
        x, y = o["seconds"]["mean"], 100 * o["f1"]["mean"]
        low, high = o["f1"]["low"], o["f1"]["high"]
        left.errorbar(x, y, yerr=[[y - 100 * low], [100 * high - y]], fmt="o", capsize=3)
        left.annotate(row, (x, y), fontsize=8, xytext=(4, 4), textcoords="offset points")
    left.set_xlabel("seconds / query (all kinds)")
    left.set_ylabel("F1 on in-KB queries (%)")
    left.set_title("answer quality against time")
    left.grid(alpha=0.3)
    kinds = [k for k in KINDS if any(k in d["kinds"] for d in rows.values())]
    width = 0.8 / max(len(rows), 1)
    for i, (row, data) in enumerate(rows.items()):
        heights = [100 * (data["kinds"].get(k, {}).get("abstain", {}).get("mean") or 0.0) for k in kinds]
        right.bar([j + i * width for j in range(len(kinds))], heights, width, label=row)
    right.set_xticks([j + width * (len(rows) - 1) / 2 for j in range(len(kinds))])
    right.set_xticklabels(kinds, fontsize=8)
    right.set_ylabel("abstain rate (%)")
    right.set_title("abstentions (only out_of_kb should)")
    right.legend(fontsize=7)
    right.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_report(
    rows: Sequence[str],
    queries: Sequence[SupportQuery],
    outcomes: Mapping[tuple[str, str], SupportOutcome],
    settings: Settings,
    meta: Mapping[str, Any],
    router: RouterFn = rules_support_router,
    retriever: Retriever | None = None,
    sweep: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The report as a JSON-able dict: per row summaries, paired differences against always-B,
    retrieval alone and the train threshold sweep."""
    scored = {row: score_row(row, queries, outcomes, settings, router) for row in rows}
    report: dict[str, Any] = {
        "meta": dict(meta),
        "rows": {row: summarise_row(items) for row, items in scored.items() if items},
        "differences": {},
    }
    if ROUTER_ROW in scored and "always_b" in scored:
        a, b = scored[ROUTER_ROW], scored["always_b"]
        in_kb = lambda s: s.query.in_kb  # noqa: E731
        report["differences"] = {
            "router - always_b, F1 (in-KB)": paired_difference(
                [s for s in a if in_kb(s)], [s for s in b if in_kb(s)], lambda s: s.f1),
            "router - always_b, tier accuracy": paired_difference(a, b, lambda s: s.tier_correct),
            "router - always_b, seconds/query": paired_difference(a, b, lambda s: s.seconds),
        }
    if retriever is not None:
        report["retrieval"] = retriever_hits(queries, retriever)
    if sweep is not None:
        report["threshold_sweep"] = dict(sweep)
    return report


def write_support_report(report: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """`report.json`, `report.md` and `support.png` in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "report.json", out_dir / "report.md", out_dir / "support.png"]
    paths[0].write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    paths[1].write_text(support_markdown(report), encoding="utf-8")
    support_plot(report, paths[2])
    return paths


# --- the whole run -----------------------------------------------------------------------------


@dataclass
class SupportRun:
    """What `evaluate_support` did: the report, its files and the settings it ran with."""

    report: dict[str, Any]
    paths: list[Path]
    settings: Settings


def _check_run_config(out_dir: Path, config: Mapping[str, Any]) -> None:
    """Resuming into a directory made with other settings would mix results: refuse."""
    path = out_dir / "run_config.json"
    if path.exists():
        before = json.loads(path.read_text(encoding="utf-8"))
        if before != dict(config):
            changed = sorted(k for k in set(before) | set(config) if before.get(k) != config.get(k))
            raise ConfigurationError(
                f"{out_dir} holds results made with other settings ({', '.join(changed)}); "
                "choose another --out or remove it"
            )
    else:
        out_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dict(config), indent=2, sort_keys=True), encoding="utf-8")


def evaluate_support(
    settings: Settings,
    out_dir: Path,
    rows: Sequence[str] = (ROUTER_ROW, "always_b"),
    split: str = "test",
    limit: int | None = None,
    llm: LLM | None = None,
    retriever: Retriever | None = None,
    router: RouterFn = rules_support_router,
    run: bool = True,
    auto_threshold: bool = False,
    meta: Mapping[str, Any] | None = None,
    progress: Callable[[str, int], Any] | None = None,
    suite: SupportSuite | None = None,
) -> SupportRun:
    """Index `suite` (default: the COVID FAQ's; the others: `evaluation.support_kbs`) (tantivy in
    a temporary directory, rebuilt each run in about a second, unless `retriever` is given), run
    `rows` on `split` (at most `limit` per kind) and write the report.

    Abstention as a tenant gets it: the FAQ's own relevance threshold, derived from the
    knowledge base when it is indexed (`knowledge.calibration`), unless ARAG_ABSTAIN_MIN_RELEVANCE
    is set. With `auto_threshold` a raw BM25 floor is added: the best of the sweep over the `train`
    split (retrieval only, so no `test` query shapes it); otherwise the settings' own (0: none).
    `progress(description, total)` is a context manager yielding `advance(n)` (the CLI's bar).
    The report's `knowledge_base` section is retrieval alone over the whole split
    (`knowledge_base_checks`): hit@5, the abstention gate, follow-ups with and without rewriting.
    """
    suite = suite if suite is not None else build_suite(settings.data_dir, settings)
    if retriever is None:
        import tempfile

        from adaptive_rag.retrieval.tantivy_index import TantivyRetriever

        with tempfile.TemporaryDirectory(prefix="arag-support-kb-") as work:
            index = TantivyRetriever.build(Path(work) / "index", suite.passages, title_boost=settings.title_boost)
            return _evaluate(suite, settings, out_dir, rows, split, limit, llm, index, router, run,
                             auto_threshold, meta, progress)
    return _evaluate(suite, settings, out_dir, rows, split, limit,
                     llm, retriever, router, run, auto_threshold, meta, progress)


def _evaluate(
    suite: SupportSuite, settings: Settings, out_dir: Path, rows: Sequence[str], split: str,
    limit: int | None, llm: LLM | None, retriever: Retriever, router: RouterFn, run: bool,
    auto_threshold: bool, meta: Mapping[str, Any] | None,
    progress: Callable[[str, int], Any] | None,
) -> SupportRun:
    from adaptive_rag.knowledge.calibration import calibrate
    from adaptive_rag.strategies import Abstention, build_strategy, strategy_for_tier

    sweep = threshold_sweep(suite.select("train"), retriever, max(HIT_K, settings.top_k))
    threshold_note = "settings"
    if auto_threshold and sweep["best"] is not None:
        settings = settings.model_copy(update={"abstain_min_score": sweep["best"]["threshold"]})
        threshold_note = "auto: best J of the train sweep"
    if settings.abstain_min_relevance is not None:
        min_relevance, relevance_note = settings.abstain_min_relevance, "ARAG_ABSTAIN_MIN_RELEVANCE"
    else:
        derived = calibrate(retriever, len(suite.passages))
        min_relevance = derived.threshold if derived else 0.0
        relevance_note = f"automatic: {derived.describe()}" if derived else "none: the retriever cannot weigh queries"
    abstention = Abstention(min_relevance=min_relevance, min_score=settings.abstain_min_score)
    queries = suite.select(split, limit)
    needed = {route(row, q.query, settings, router).strategy for q in queries for row in rows}
    config = {
        "split": split, "abstain_min_score": settings.abstain_min_score,
        "abstain_min_relevance": min_relevance,
        "reader_abstains": settings.reader_abstains, "top_k": settings.top_k,
        "multi_step": multi_step_strategy(settings), "title_boost": settings.title_boost,
        "llm": settings.llm_base_url or str(settings.gguf_path or "embedded default"),
        "chunk_words": settings.chunk_words, "chunk_overlap_words": settings.chunk_overlap_words,
        "passages": len(suite.passages),
    }
    if suite.name != COVID_FAQ:
        config["knowledge_base"] = suite.name
    _check_run_config(out_dir, config)
    results_path = out_dir / "results.jsonl"
    if run:
        if llm is None and needed - {SMALL_TALK_STRATEGY}:
            from adaptive_rag.llm import build_llm

            llm = build_llm(settings)
        strategies = {
            name: build_strategy(name, retriever, llm, settings, abstention)
            for name in needed if name != SMALL_TALK_STRATEGY
        }
        total = len(queries) * len(rows)
        if progress is not None:
            with progress("support suite", total) as advance:
                outcomes = run_support(queries, rows, strategies, results_path, settings, router, advance)
        else:
            outcomes = run_support(queries, rows, strategies, results_path, settings, router)
    else:
        outcomes = load_support_outcomes(results_path)
    counts = Counter(q.kind for q in queries)
    full_meta = {
        **(meta or {}),
        "suite": SUITE, "split": split, "queries": len(queries),
        "queries_per_kind": {k: counts[k] for k in KINDS if any(q.kind == k for q in suite.queries)},
        "rows": list(rows),
        "router": f"small-talk detector, then {getattr(router, '__name__', type(router).__name__)}",
        "knowledge_base": f"{suite.description}, {len(suite.passages)} passages",
        "abstain_min_relevance": f"{min_relevance:g} ({relevance_note})",
        "abstain_min_score": f"{settings.abstain_min_score:g} ({threshold_note})",
        "reader_abstains": settings.reader_abstains,
        "top_k": settings.top_k, "multi_step (tier C)": strategy_for_tier(Tier.C, settings),
        "llm": config["llm"],
    }
    report = build_report(rows, queries, outcomes, settings, full_meta, router, retriever, sweep)
    report["knowledge_base"] = knowledge_base_checks(suite, retriever, abstention, split, max(HIT_K, settings.top_k))
    report["knowledge_base"]["abstain_min_relevance"] = min_relevance
    return SupportRun(report, write_support_report(report, out_dir), settings)


__all__ = [
    "GOLD_TIER", "IN_KB", "KINDS", "FaqEntry", "SupportOutcome", "SupportQuery", "SupportRun",
    "SupportSuite", "bootstrap_interval", "build_report", "build_suite", "evaluate_support",
    "faq_documents", "join_questions", "load_small_talk", "retrieval_hits", "rouge_l", "route",
    "run_support", "threshold_sweep", "write_support_report",
]
