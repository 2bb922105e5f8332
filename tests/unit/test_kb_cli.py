"""`arag kb` on embedded defaults (tantivy per tenant under ARAG_KB_DIR, SQLite records), as an
operator runs it: the COVID FAQ file imports as is, a re-import changes nothing, a changed file
updates in place and drops what it no longer has, a rebuild switches generations, the abstention
threshold is derived on import, shown, overridden and restored, and bad input is one clear line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from adaptive_rag.knowledge.indexes import TantivyKnowledgeIndex

REPO = Path(__file__).resolve().parents[2]
COVID_FAQ = REPO.parent / "shared" / "data" / "covid-faq_en_covid-qa.csv"


def arag(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "ARAG_KB_DIR": str(tmp_path / "kb"),
           "DATABASE_URL": f"sqlite:///{tmp_path}/arag.db", "ARAG_RETRIEVER": "tantivy"}
    return subprocess.run([sys.executable, "-c", "from adaptive_rag.cli import main; main()", "kb", *args],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)


def flat(text: str) -> str:
    return " ".join(text.split())


def test_the_covid_faq_imports_as_is_and_a_second_import_changes_nothing(tmp_path: Path) -> None:
    first = arag(tmp_path, "import", "--tenant", "health", str(COVID_FAQ))
    assert first.returncode == 0, first.stderr
    assert "tenant 'health': 213 documents" in flat(first.stdout) and "generation 1" in first.stdout
    again = arag(tmp_path, "import", "--tenant", "health", str(COVID_FAQ))
    assert again.returncode == 0, again.stderr
    assert "added 0, updated 0, unchanged 213, deleted 0; chunks written 0, removed 0" in flat(again.stdout)
    hits = TantivyKnowledgeIndex(tmp_path / "kb").retriever("health").search("What is a novel coronavirus?", 3)
    assert hits and hits[0].title == "What is a novel coronavirus?"
    assert hits[0].doc_id.startswith("faq-") and hits[0].id.startswith(hits[0].doc_id + "#")


def test_a_changed_file_updates_in_place_and_drops_what_it_no_longer_has(tmp_path: Path) -> None:
    source = tmp_path / "help.jsonl"
    source.write_text('{"id": "a", "title": "Warranty", "text": "Two years."}\n'
                      '{"id": "b", "title": "Returns", "text": "Within 30 days."}\n')
    assert arag(tmp_path, "import", "--tenant", "t1", str(source)).returncode == 0
    source.write_text('{"id": "a", "title": "Warranty", "text": "Three years from purchase."}\n')
    changed = arag(tmp_path, "import", "--tenant", "t1", str(source))
    assert changed.returncode == 0, changed.stderr
    assert "added 0, updated 1, unchanged 0, deleted 1" in flat(changed.stdout)
    assert "tenant 't1': 1 documents, 1 chunks" in flat(changed.stdout)
    retriever = TantivyKnowledgeIndex(tmp_path / "kb").retriever("t1")
    assert [p.text for p in retriever.search("warranty years", 5)] == ["Three years from purchase."]
    assert retriever.search("returns days", 5) == []
    rebuilt = arag(tmp_path, "import", "--tenant", "t1", "--rebuild", str(source))
    assert rebuilt.returncode == 0 and "generation 2" in rebuilt.stdout
    deleted = arag(tmp_path, "delete", "--tenant", "t1", "a", "nope")
    assert deleted.returncode == 0 and "1 of the ids were not in the knowledge base" in flat(deleted.stdout)


def test_the_abstention_threshold_is_derived_on_import_shown_and_overridden(tmp_path: Path) -> None:
    imported = arag(tmp_path, "import", "--tenant", "health", str(COVID_FAQ))
    assert imported.returncode == 0, imported.stderr
    shown = flat(imported.stdout)
    assert "abstains when nothing is retrieved, or on relevance below" in shown and "(automatic)" in shown
    assert "automatic threshold" in shown and "of 160 reference questions reach), derived at" in shown
    overridden = arag(tmp_path, "threshold", "--tenant", "health", "0.9")
    assert overridden.returncode == 0, overridden.stderr
    assert "relevance below 0.9 (tenant override; automatic would be" in flat(overridden.stdout)
    described = arag(tmp_path, "describe", "--tenant", "health")
    assert "(tenant override; automatic would be" in flat(described.stdout)
    back = arag(tmp_path, "threshold", "--tenant", "health", "--auto")
    assert back.returncode == 0 and "(automatic)" in flat(back.stdout)
    again = arag(tmp_path, "calibrate", "--tenant", "health")
    assert again.returncode == 0 and "(automatic)" in flat(again.stdout)


@pytest.mark.parametrize(("args", "message"), [
    (["threshold", "--tenant", "t"], "give a threshold, or --auto"),
    (["threshold", "--tenant", "t", "-1"], "-1"),
    (["threshold", "--tenant", "nobody", "0.5"], "'nobody' has no knowledge base yet"),
    (["import", "--tenant", "t", "/nonexistent.csv"], "/nonexistent.csv does not exist"),
    (["import", "--tenant", "t", "README.txt"], "unsupported"),
    (["describe", "--tenant", "nobody"], "'nobody' has no knowledge base yet"),
])
def test_bad_input_is_one_clear_line(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "README.txt").write_text("not a knowledge base")
    result = arag(tmp_path, *args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in flat(result.stderr).lower() or message in flat(result.stderr)
    assert "Traceback" not in result.stderr


def test_the_answer_style_is_shown_set_and_restored_by_the_operator(tmp_path: Path) -> None:
    source = tmp_path / "help.jsonl"
    source.write_text('{"id": "a", "title": "Returns", "text": "Within 30 days."}\n')
    imported = arag(tmp_path, "import", "--tenant", "t1", str(source))
    assert imported.returncode == 0, imported.stderr
    assert "answer style support (deployment setting)" in flat(imported.stdout)
    short = arag(tmp_path, "style", "--tenant", "t1", "short")
    assert short.returncode == 0, short.stderr
    assert "answer style short (tenant)" in flat(arag(tmp_path, "describe", "--tenant", "t1").stdout)
    back = arag(tmp_path, "style", "--tenant", "t1", "--default")
    assert back.returncode == 0 and "answer style support (deployment setting)" in flat(back.stdout)
    for args, message in ((["style", "--tenant", "t1", "verbose"], "not a style"),
                          (["style", "--tenant", "t1"], "give a style"),
                          (["style", "--tenant", "nobody", "short"], "'nobody' has no knowledge base yet")):
        refused = arag(tmp_path, *args)
        assert refused.returncode == 2 and message in flat(refused.stderr), refused.stderr
