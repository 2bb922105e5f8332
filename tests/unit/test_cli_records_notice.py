"""The CLI names the records database before a command writes records to it: without
DATABASE_URL that is a SQLite file the front door and the workers never read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from adaptive_rag.cli.common import records_database_notice

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_database_url(monkeypatch, tmp_path):
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)  # no .env file, and the default SQLite file lands here
    return tmp_path


def test_default_database_is_named_with_its_file_and_the_variable_that_changes_it(no_database_url):
    notice = records_database_notice(["keys", "create", "--tenant", "acme"])
    assert notice is not None
    assert "sqlite:///var/arag.db" in notice
    assert str((no_database_url / "var" / "arag.db").resolve()) in notice
    assert "DATABASE_URL selects another" in notice


def test_database_url_is_named_without_its_password(monkeypatch, no_database_url):
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://arag:secret@db.example:5432/arag")
    notice = records_database_notice(["kb", "import", "--tenant", "acme", "faq.jsonl"])
    assert notice is not None
    assert "db.example:5432/arag" in notice and "secret" not in notice
    assert "(DATABASE_URL)" in notice


@pytest.mark.parametrize("argv", [
    ["keys", "list", "--database-url", "sqlite:////srv/records.db"],
    ["kb", "describe", "--tenant", "t", "--database-url=sqlite:////srv/records.db"],
])
def test_an_explicit_option_wins(argv, no_database_url):
    notice = records_database_notice(argv)
    assert notice is not None and "/srv/records.db" in notice and "(--database-url)" in notice


@pytest.mark.parametrize("argv", [
    ["retrain", "--if-new-labels", "50"], ["classifier", "relabel"], ["model", "promote", "run"],
    ["label"],
])
def test_every_record_writer_says_it(argv, no_database_url):
    assert records_database_notice(argv) is not None


@pytest.mark.parametrize("argv", [
    ["ask", "hello"], ["model", "ship"], ["model", "status"], ["index", "corpus.jsonl"],
    ["keys", "create", "--help"], [],
])
def test_commands_that_write_no_records_stay_quiet(argv, no_database_url):
    assert records_database_notice(argv) is None


def test_the_notice_is_one_stderr_line_of_the_real_command(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-m", "adaptive_rag.cli", "keys", "list"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    notices = [line for line in done.stderr.splitlines() if line.startswith("records database:")]
    assert notices == [f"records database: sqlite:///var/arag.db = {(tmp_path / 'var' / 'arag.db').resolve()} "
                       "(the default; DATABASE_URL selects another)"]
    assert "records database" not in done.stdout
