"""Bad input to the `arag` CLI ends in one clear line and exit code 2, before any model loads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def run_arag(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from adaptive_rag.cli import main; main()", *args],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["ask", ""], None, "query is empty"),
        (["ask", "abc\x07def"], None, "control character U+0007 at position 3"),
        (["ask", "x" * 5000], None, "query is 5000 characters; the limit is 4000"),
        (["ask", "hello?", "--strategy", "zzz"], None, "unknown strategy 'zzz'"),
        (["ask", "hello?", "--index-dir", "/nonexistent/index"], None, "no tantivy index in /nonexistent/index"),
        (["ask", "hello?"], {"ARAG_RETRIEVER": "elastic"}, "invalid configuration: ARAG_RETRIEVER"),
        (["ask", "hello?", "--retriever", "opensearch"], {"OPENSEARCH_URL": ""}, "needs OPENSEARCH_URL"),
        (["index", "/nonexistent.jsonl"], None, "corpus file not found"),
        (["eval", "--datasets", "foo", "--report-only"], None, "unknown dataset(s) ['foo']"),
        (["eval", "--data-dir", "/nonexistent", "--report-only"], None, "benchmark file missing"),
    ],
)
def test_bad_input_is_one_clear_error(args: list[str], env: dict[str, str] | None, message: str) -> None:
    result = run_arag(*args, env=env)
    assert result.returncode == 2, result.stderr
    assert message in " ".join(result.stderr.split()), result.stderr
    assert "Traceback" not in result.stderr


def test_model_commands_refuse_bad_input(tmp_path) -> None:
    result = run_arag("model", "promote", str(tmp_path / "missing-run"),
                      "--database-url", f"sqlite:///{tmp_path}/labels.db")
    assert result.returncode == 2 and "is not a training run" in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr


def test_model_bootstrap_keeps_an_existing_version(tmp_path) -> None:
    version = tmp_path / "complexity" / "3"
    version.mkdir(parents=True)
    (version / "model.onnx").write_bytes(b"")
    result = run_arag("model", "bootstrap", "--repository", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "already has versions [3]; nothing to do" in result.stdout


def test_python_m_runs_the_same_cli_without_loading_heavy_libraries() -> None:
    """`python -m adaptive_rag.cli` (the demo's bootstrap subprocess) lists every command, and
    importing the CLI loads neither torch, transformers nor matplotlib (only commands do)."""
    help_text = subprocess.run(
        [sys.executable, "-m", "adaptive_rag.cli", "--help"], capture_output=True, text=True,
        timeout=60, env={**os.environ, "COLUMNS": "200"},
    )
    assert help_text.returncode == 0, help_text.stderr
    for command in ("index", "ask", "eval", "retrieval-bench", "demo", "label", "train", "calibrate",
                    "relabel", "retrain", "classifier", "model", "keys"):
        assert f" {command} " in help_text.stdout, command
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, adaptive_rag.cli; "
         "print(sorted({'torch', 'transformers', 'matplotlib', 'onnxruntime'} & set(sys.modules)))"],
        capture_output=True, text=True, timeout=60,
    )
    assert loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr
