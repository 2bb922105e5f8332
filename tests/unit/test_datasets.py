"""Benchmark loaders, the stable split and the shared corpus, on the real files in ../shared/data."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from adaptive_rag.errors import ConfigurationError
from adaptive_rag.evaluation.corpus import load_corpus, passage_id
from adaptive_rag.evaluation.datasets import (
    DATASETS,
    FILES,
    HOTPOTQA_FULLWIKI_FILE,
    MULTI_HOP,
    SINGLE_HOP,
    SQUAD_DEV_TITLES,
    TRAIN_SHARE,
    Question,
    load_dataset,
    load_hotpotqa,
    load_questions,
    split_of,
)

REPO = Path(__file__).resolve().parents[2]
DATA_DIR = REPO / ".." / "shared" / "data"

DATA_PRESENT = all((DATA_DIR / name).is_file() for names in FILES.values() for name in names) and (
    DATA_DIR / HOTPOTQA_FULLWIKI_FILE).is_file()


@pytest.fixture(scope="module")
def questions() -> dict[str, list[Question]]:
    if not DATA_PRESENT:
        pytest.skip(f"benchmark data not found in {DATA_DIR}")
    return {name: load_dataset(DATA_DIR, name) for name in DATASETS}


@pytest.fixture(scope="module")
def corpus():
    if not DATA_PRESENT:
        pytest.skip(f"benchmark data not found in {DATA_DIR}")
    return load_corpus(DATA_DIR)


@pytest.mark.parametrize("name", DATASETS)
def test_loader_yields_questions_with_answers(questions, name: str) -> None:
    loaded = questions[name]
    assert len(loaded) >= 100
    for q in loaded:
        assert q.dataset == name
        assert q.id and q.question and q.question == q.question.strip()
        assert q.answers, q.id
        assert all(a and a == a.strip() for a in q.answers)
        assert len(set(q.answers)) == len(q.answers)
        assert q.multi_hop == (name in MULTI_HOP)
    assert len({q.id for q in loaded}) == len(loaded)


@pytest.mark.parametrize("name", MULTI_HOP)
def test_multi_hop_questions_have_supporting_titles(questions, name: str) -> None:
    assert all(q.supporting_titles for q in questions[name])


def expected_split(dataset: str, question_id: str) -> str:
    """The documented rule, written out here on its own: the first 8 bytes of
    sha256("<dataset>:<id>") as a big-endian integer, modulo 100, below 60 -> train."""
    digest = hashlib.sha256(f"{dataset}:{question_id}".encode()).hexdigest()
    return "train" if int(digest[:16], 16) % 100 < 60 else "test"


def test_split_follows_the_stable_hash_rule(questions) -> None:
    for name in DATASETS:
        mismatched = [q.id for q in questions[name] if q.split != expected_split(name, q.id)]
        assert not mismatched, (name, mismatched[:5])
    assert [split_of("nq", f"nq-{i}") for i in range(200)] == \
        [expected_split("nq", f"nq-{i}") for i in range(200)]


def test_split_is_stable_across_processes(questions) -> None:
    # Another interpreter with another hash seed loads the files again: same split per question.
    script = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from adaptive_rag.evaluation.datasets import DATASETS, load_dataset\n"
        "d = Path(sys.argv[1])\n"
        "print(json.dumps({n: {q.id: q.split for q in load_dataset(d, n)} for n in DATASETS}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(DATA_DIR)], capture_output=True, text=True, timeout=300,
        cwd=REPO, env={**os.environ, "PYTHONHASHSEED": "12345"}, check=True,
    )
    again = json.loads(done.stdout)
    for name in DATASETS:
        assert {q.id: q.split for q in questions[name]} == again[name], name


def test_split_depends_on_dataset_and_id() -> None:
    ids = [f"x{i}" for i in range(200)]
    assert [split_of("nq", i) for i in ids] != [split_of("trivia", i) for i in ids]


def test_split_is_about_sixty_forty(questions) -> None:
    assert TRAIN_SHARE == 60
    nq = questions["nq"]
    assert abs(100 * sum(q.split == "train" for q in nq) / len(nq) - 60) <= 5
    everything = [q for loaded in questions.values() for q in loaded]
    assert abs(100 * sum(q.split == "train" for q in everything) / len(everything) - 60) <= 3
    for name, loaded in questions.items():  # no dataset all train or all test
        assert 40 <= 100 * sum(q.split == "train" for q in loaded) / len(loaded) <= 80, name


def test_load_questions_split_filter_partitions(questions) -> None:
    train = load_questions(DATA_DIR, ["musique"], split="train")
    test = load_questions(DATA_DIR, ["musique"], split="test")
    assert {q.split for q in train} == {"train"} and {q.split for q in test} == {"test"}
    assert len(train) + len(test) == len(questions["musique"])
    assert not {q.id for q in train} & {q.id for q in test}


def test_load_questions_defaults_to_all_six(questions) -> None:
    everything = load_questions(DATA_DIR)
    assert {q.dataset for q in everything} == set(DATASETS) == set(SINGLE_HOP + MULTI_HOP)
    assert len(everything) == sum(len(v) for v in questions.values())


def test_squad_only_dev_titles(questions) -> None:
    titles = {q.supporting_titles for q in questions["squad"]}
    assert titles == {(t.replace("_", " "),) for t in SQUAD_DEV_TITLES}
    raw = json.loads((DATA_DIR / FILES["squad"][0]).read_text(encoding="utf-8"))["data"]
    dev_count = sum(
        len(p["qas"]) for a in raw if a["title"] in SQUAD_DEV_TITLES for p in a["paragraphs"]
    )
    all_count = sum(len(p["qas"]) for a in raw for p in a["paragraphs"])
    assert len(questions["squad"]) == dev_count < all_count


def test_trivia_csv_quotes_unwrapped(questions) -> None:
    raw = {
        row["id"]: row["question"].strip()
        for row in map(json.loads, (DATA_DIR / FILES["trivia"][0]).read_text().splitlines())
    }
    wrapped = {i for i, q in raw.items() if q.startswith('"') and q.endswith('"') and '""' in q}
    assert wrapped, "the file is known to hold CSV-style quoted questions"
    loaded = {q.id: q.question for q in questions["trivia"]}
    for i in wrapped:
        assert '""' not in loaded[i]
        assert loaded[i] == raw[i][1:-1].replace('""', '"')
    lookup = [q for q in loaded.values() if q.startswith("What philosopher said")]
    assert lookup == ['What philosopher said "God is dead"?']


def _rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA_DIR / name).read_text(encoding="utf-8").splitlines() if line.strip()]


def test_hotpotqa_reads_both_distractor_files_once_per_question(questions) -> None:
    hf_layout, original_layout = (_rows(name) for name in FILES["hotpotqa"])
    ids = [r["id"] for r in hf_layout] + [r["_id"] for r in original_layout]
    loaded = [q.id for q in questions["hotpotqa"]]
    assert len(loaded) == len(set(loaded)) == len(set(ids)) < len(ids)  # ids in both files: once
    assert set(loaded) == set(ids)
    # the fullwiki file's questions are not asked (unless a distractor file has them too)
    fullwiki = {r["_id"] for r in _rows(HOTPOTQA_FULLWIKI_FILE)}
    assert not (fullwiki - set(ids)) & set(loaded)


def test_hotpotqa_both_layouts_give_the_same_question(tmp_path) -> None:
    hf_row = {
        "id": "x1", "question": " Who? ", "answer": "Ann", "type": "bridge", "level": "hard",
        "supporting_facts": {"title": ["A", "B", "A"], "sent_id": [0, 1, 2]},
        "context": {"title": ["A", "B"], "sentences": [["A is.", " Yes."], ["B was."]]},
    }
    original_row = {
        "_id": "x1", "question": "Who?", "answer": "Ann", "type": "bridge", "level": "hard",
        "supporting_facts": [["A", 0], ["B", 1], ["A", 2]],
        "context": [["A", ["A is.", " Yes."]], ["B", ["B was."]]],
    }
    empty_row = {**original_row, "_id": "x2", "context": []}
    loaded = []
    for number, rows in enumerate(([hf_row], [original_row, empty_row])):
        path = tmp_path / f"{number}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        loaded.append(list(load_hotpotqa(path)))
    expected = Question(id="x1", dataset="hotpotqa", question="Who?", answers=("Ann",),
                        supporting_titles=("A", "B"))
    assert loaded == [[expected], [expected]]  # the record without paragraphs is skipped


def test_corpus_keeps_the_fullwiki_paragraphs_as_distractors(corpus) -> None:
    ids = {p.id for p in corpus}
    fullwiki = [(title, "".join(sentences)) for row in _rows(HOTPOTQA_FULLWIKI_FILE)
                for title, sentences in row.get("context") or [] if "".join(sentences).strip()]
    assert fullwiki
    assert all(passage_id(t.strip(), " ".join(x.split())) in ids for t, x in fullwiki)


def test_corpus_is_deduplicated(corpus) -> None:
    assert len(corpus) > 10_000
    pairs = [(p.title, p.text) for p in corpus]
    assert len(set(pairs)) == len(pairs)
    assert len({p.id for p in corpus}) == len(corpus)
    for p in corpus[:200]:
        assert p.id == passage_id(p.title, p.text)
        assert p.text and p.text == " ".join(p.text.split()) and p.title == p.title.strip()


def test_corpus_contains_supporting_titles(corpus, questions) -> None:
    titles = {p.title for p in corpus}
    for name in ("2wiki", "musique", "squad", "hotpotqa"):
        missing = {t for q in questions[name] for t in q.supporting_titles} - titles
        assert not missing, (name, sorted(missing)[:5])


def test_unknown_dataset_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="unknown dataset.*'bogus'"):
        load_questions(DATA_DIR, ["nq", "bogus"])


def test_missing_data_dir_is_a_configuration_error(tmp_path) -> None:
    with pytest.raises(ConfigurationError, match="benchmark file missing"):
        load_questions(tmp_path / "nowhere", ["nq"])


def test_load_corpus_missing_data_dir_is_a_configuration_error(tmp_path) -> None:
    with pytest.raises(ConfigurationError):
        load_corpus(tmp_path / "nowhere")


def test_split_values_are_fixed_across_processes() -> None:
    # sha256-based, so independent of PYTHONHASHSEED: these values must never change, or
    # every stored label and report would silently move between train and test.
    assert [split_of("nq", f"nq-{i}") for i in range(8)] == [
        "test", "test", "train", "test", "train", "train", "train", "test",
    ]
    assert split_of("hotpotqa", "5a7166395542994082a3e814") == "train"
