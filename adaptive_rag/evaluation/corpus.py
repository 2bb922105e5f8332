"""The shared retrieval corpus: every context paragraph of the benchmark files, deduplicated by
title + text, like one tenant's knowledge base. NQ-open and TriviaQA run against it too.

HotpotQA contributes its distractor-setting files (the questions' files) and the fullwiki-style
file whose questions are no longer asked: its paragraphs stay as distractors."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

from adaptive_rag.domain import Passage
from adaptive_rag.errors import ConfigurationError
from adaptive_rag.evaluation.datasets import FILES, HOTPOTQA_FULLWIKI_FILE, _jsonl, hotpotqa_paragraphs

WIKI_2_CONTEXT_FILE = "2wikimultihopqa_dev500_tts-project.json"
WIKI_2_CORPUS_FILE = "2wikimultihopqa_dev1000-corpus_hipporag.json"


def passage_id(title: str, text: str) -> str:
    return "p" + hashlib.sha1(f"{title}\x00{text}".encode()).hexdigest()[:15]


def _raw_paragraphs(data_dir: Path) -> Iterator[tuple[str, str]]:
    for name in (*FILES["hotpotqa"], HOTPOTQA_FULLWIKI_FILE):
        for row in _jsonl(data_dir / name):
            yield from hotpotqa_paragraphs(row)
    for row in _jsonl(data_dir / FILES["musique"][0]):
        for paragraph in row["paragraphs"]:
            yield paragraph["title"], paragraph["paragraph_text"]
    columns = json.loads((data_dir / WIKI_2_CONTEXT_FILE).read_text(encoding="utf-8"))
    for context in columns["context"].values():
        for title, sentences in context:
            yield title, " ".join(sentences)
    for row in json.loads((data_dir / WIKI_2_CORPUS_FILE).read_text(encoding="utf-8")):
        yield row["title"], row["text"]
    for article in json.loads((data_dir / FILES["squad"][0]).read_text(encoding="utf-8"))["data"]:
        for paragraph in article["paragraphs"]:
            yield article["title"].replace("_", " "), paragraph["context"]


def load_corpus(data_dir: Path) -> list[Passage]:
    """All benchmark paragraphs as passages, deduplicated by (title, text), in file order."""
    data_dir = Path(data_dir)
    needed = [*FILES["hotpotqa"], HOTPOTQA_FULLWIKI_FILE, *FILES["musique"], *FILES["squad"],
              WIKI_2_CONTEXT_FILE, WIKI_2_CORPUS_FILE]
    missing = [name for name in needed if not (data_dir / name).is_file()]
    if missing:
        raise ConfigurationError(
            f"benchmark file(s) missing in {data_dir}: {', '.join(missing)} (set ARAG_DATA_DIR)"
        )
    seen: set[str] = set()
    passages = []
    for title, text in _raw_paragraphs(Path(data_dir)):
        title, text = title.strip(), " ".join(text.split())
        pid = passage_id(title, text)
        if text and pid not in seen:
            seen.add(pid)
            passages.append(Passage(id=pid, title=title, text=text))
    return passages


def read_jsonl_corpus(path: Path) -> Iterator[Passage]:
    """Passages of a JSONL knowledge base (`title`, `text`, optional `id`), e.g. the demo's."""
    with Path(path).open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            row = json.loads(line)
            title, text = str(row.get("title", "")), str(row["text"])
            yield Passage(id=str(row.get("id") or passage_id(title, text)), title=title, text=text)
