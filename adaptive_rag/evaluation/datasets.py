"""Loaders for the six benchmark datasets into one question format.

Files are read from a configurable data directory (`ARAG_DATA_DIR`, `../shared/data` here); the
file names are those listed in that directory's SOURCES.md. Nothing is copied into the project.
A dataset may come from several files (HotpotQA: two distractor-setting samples); a question id
seen in an earlier file is not loaded again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaptive_rag.contracts import Tier
from adaptive_rag.errors import ConfigurationError

SINGLE_HOP = ("squad", "nq", "trivia")
MULTI_HOP = ("musique", "hotpotqa", "2wiki")
DATASETS = SINGLE_HOP + MULTI_HOP


def dataset_tier(dataset: str) -> Tier | None:
    """The dataset-identity rule: B for squad, nq, trivia; C for musique, hotpotqa, 2wiki; None
    for any other source (live traffic, the support suite), where the rule does not apply.

    It knows the answer's source, not the question, so it is no router for live traffic; it is
    the baseline every learned router must beat on the benchmark, and the tier a question's label
    falls back to when no strategy answers it correctly."""
    if dataset in SINGLE_HOP:
        return Tier.B
    if dataset in MULTI_HOP:
        return Tier.C
    return None

# Each dataset's question files, read in this order.
FILES: dict[str, tuple[str, ...]] = {
    "squad": ("squad-v1.1_train-dev-mix_mrc-odqa-tutorial.json",),
    "nq": ("nq-open_dev_natural-questions.jsonl",),
    "trivia": ("triviaqa_test1000_reason-over-search.jsonl",),
    "musique": ("musique_dev200_migres.jsonl",),
    # The distractor setting: every supporting paragraph is in its record's own context, so in
    # the corpus (Hugging Face layout, then the original layout; 18 ids in both).
    "hotpotqa": ("hotpotqa_dev500-distractor_rpt.jsonl", "hotpotqa_dev200-distractor_migres.jsonl"),
    "2wiki": ("2wikimultihopqa_dev1000-questions_tts-project.json",),
}
# HotpotQA dev records with fullwiki-style contexts that lack 427 of their 1,000 supporting
# paragraphs: no retrieval can find those, so its questions are not asked; its paragraphs stay in
# the corpus as distractors.
HOTPOTQA_FULLWIKI_FILE = "hotpotqa_dev500_amor.jsonl"
# The SQuAD file mixes train and dev articles; only these three are dev (see SOURCES.md).
SQUAD_DEV_TITLES = frozenset({"Genghis_Khan", "Huguenot", "Immune_system"})
TRAIN_SHARE = 60  # percent of questions in `train`; the rest is `test`


@dataclass(frozen=True, slots=True)
class Question:
    id: str
    dataset: str
    question: str
    answers: tuple[str, ...]  # gold answer first, then aliases
    supporting_titles: tuple[str, ...] = ()

    @property
    def multi_hop(self) -> bool:
        return self.dataset in MULTI_HOP

    @property
    def split(self) -> str:
        return split_of(self.dataset, self.id)


def split_of(dataset: str, question_id: str) -> str:
    """`train` or `test`, by a stable hash of the dataset and question id (60/40)."""
    digest = hashlib.sha256(f"{dataset}:{question_id}".encode()).digest()
    return "train" if int.from_bytes(digest[:8], "big") % 100 < TRAIN_SHARE else "test"


def _jsonl(path: Path) -> Iterator[dict]:
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def _dedupe(answers: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(a.strip() for a in answers if a and a.strip()))


def _unquote_csv_style(text: str) -> str:
    """TriviaQA's file wraps some questions CSV-style: '"Who wrote ""X""?"' -> 'Who wrote "X"?'."""
    if len(text) > 1 and text[0] == text[-1] == '"' and '""' in text:
        return text[1:-1].replace('""', '"')
    return text


def load_squad(path: Path) -> Iterator[Question]:
    for article in json.loads(path.read_text(encoding="utf-8"))["data"]:
        if article["title"] not in SQUAD_DEV_TITLES:
            continue
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                yield Question(
                    id=qa["id"], dataset="squad", question=qa["question"].strip(),
                    answers=_dedupe(a["text"] for a in qa["answers"]),
                    supporting_titles=(article["title"].replace("_", " "),),
                )


def load_nq(path: Path) -> Iterator[Question]:
    for number, row in enumerate(_jsonl(path)):
        yield Question(
            id=f"nq-{number}", dataset="nq", question=row["question"].strip(),
            answers=_dedupe(row["answer"]),
        )


def load_trivia(path: Path) -> Iterator[Question]:
    for row in _jsonl(path):
        yield Question(
            id=row["id"], dataset="trivia", question=_unquote_csv_style(row["question"].strip()),
            answers=_dedupe(row["golden_answers"]),
        )


def load_musique(path: Path) -> Iterator[Question]:
    for row in _jsonl(path):
        yield Question(
            id=row["id"], dataset="musique", question=row["question"].strip(),
            answers=_dedupe([row["answer"], *row.get("answer_aliases", [])]),
            supporting_titles=_dedupe(p["title"] for p in row["paragraphs"] if p["is_supporting"]),
        )


def hotpotqa_paragraphs(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A HotpotQA record's context as (title, text), in either layout: the original list of
    [title, sentences] pairs or Hugging Face's {title: [...], sentences: [[...], ...]}. The
    sentences carry their own leading spaces, so they are joined as they are."""
    context = row.get("context") or []
    if isinstance(context, Mapping):
        pairs = zip(context.get("title", []), context.get("sentences", []))
    else:
        pairs = ((title, sentences) for title, sentences in context)
    return [(title, "".join(sentences)) for title, sentences in pairs]


def _hotpotqa_supporting_titles(row: Mapping[str, Any]) -> tuple[str, ...]:
    facts = row["supporting_facts"]
    titles = facts["title"] if isinstance(facts, Mapping) else (title for title, _ in facts)
    return _dedupe(titles)


def load_hotpotqa(path: Path) -> Iterator[Question]:
    """HotpotQA records of either layout (`id` or `_id`); records without paragraphs (the
    fullwiki file has two) are skipped."""
    for row in _jsonl(path):
        if not hotpotqa_paragraphs(row):
            continue
        yield Question(
            id=row.get("id") or row["_id"], dataset="hotpotqa", question=row["question"].strip(),
            answers=_dedupe([row["answer"]]),
            supporting_titles=_hotpotqa_supporting_titles(row),
        )


def load_2wiki(path: Path) -> Iterator[Question]:
    for row in json.loads(path.read_text(encoding="utf-8")):
        yield Question(
            id=row["id"], dataset="2wiki", question=row["question"].strip(),
            answers=_dedupe([row["answer"], *row.get("answer_aliases", [])]),
            supporting_titles=_dedupe(row["supporting_facts"]),
        )


LOADERS: dict[str, Callable[[Path], Iterator[Question]]] = {
    "squad": load_squad, "nq": load_nq, "trivia": load_trivia,
    "musique": load_musique, "hotpotqa": load_hotpotqa, "2wiki": load_2wiki,
}


def load_dataset(data_dir: Path, name: str) -> list[Question]:
    """Every question of one dataset, its files in order, each question id once (first file wins)."""
    if name not in LOADERS:
        raise ConfigurationError(f"unknown dataset(s) {[name]}; known: {', '.join(DATASETS)}")
    questions: dict[str, Question] = {}
    for file_name in FILES[name]:
        path = Path(data_dir) / file_name
        if not path.is_file():
            raise ConfigurationError(f"benchmark file missing: {path} (set ARAG_DATA_DIR)")
        for question in LOADERS[name](path):
            questions.setdefault(question.id, question)
    return list(questions.values())


def load_questions(
    data_dir: Path, datasets: Iterable[str] | None = None, split: str | None = None
) -> list[Question]:
    """Questions of the chosen datasets (all six by default), optionally one split only."""
    chosen = list(datasets or DATASETS)
    unknown = [d for d in chosen if d not in LOADERS]
    if unknown:
        raise ConfigurationError(f"unknown dataset(s) {unknown}; known: {', '.join(DATASETS)}")
    questions: list[Question] = []
    for name in chosen:
        questions.extend(q for q in load_dataset(data_dir, name) if split is None or q.split == split)
    return questions


def limit_per_dataset(questions: Iterable[Question], limit: int | None, skip: int = 0) -> list[Question]:
    """The first `limit` questions of each dataset (all with no limit) after its first `skip`
    (a later sample of the same split, never read by a run of the first ones), order kept."""
    if skip < 0:
        raise ValueError(f"skip is a count of questions, not {skip!r}")
    seen: dict[str, int] = {}
    kept = []
    for question in questions:
        position = seen.get(question.dataset, 0)
        seen[question.dataset] = position + 1
        if skip <= position and (not limit or position < skip + limit):
            kept.append(question)
    return kept


def interleaved(questions: Iterable[Question]) -> list[Question]:
    """The questions in a stable pseudo-random order mixing the datasets, so a run stopped part
    way (evaluation, labelling) already covers every dataset."""
    return sorted(questions, key=lambda q: (hashlib.md5(q.id.encode()).hexdigest()[:8], q.dataset))
