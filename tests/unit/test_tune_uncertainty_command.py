"""`arag routers tune-uncertainty` as a user runs it: drafts and single-step outcomes on `train`
questions, written resumably, and the chosen threshold printed; bad options are refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab.harness.instant_llm import running_instant_llm

DATA_DIR = Path(os.environ.get("ARAG_DATA_DIR", "../shared/data"))


def arag(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from adaptive_rag.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})


def test_tuning_runs_on_train_questions_and_resumes(tmp_path: Path) -> None:
    if not (DATA_DIR / "squad-v1.1_train-dev-mix_mrc-odqa-tutorial.json").is_file():
        pytest.skip(f"benchmark data not found in {DATA_DIR}")
    index = tmp_path / "index"
    built = arag("index", "--benchmark", "--data-dir", str(DATA_DIR), "--index-dir", str(index))
    assert built.returncode == 0, built.stderr
    out = tmp_path / "tuning"
    args = ("routers", "tune-uncertainty", "--limit", "2", "--datasets", "squad,nq", "--cost", "steps",
            "--data-dir", str(DATA_DIR), "--index-dir", str(index), "--out", str(out))
    with running_instant_llm(tmp_path / "llm.log") as url:
        done = arag(*args, env={"LLM_BASE_URL": url})
        assert done.returncode == 0, done.stdout + done.stderr
        assert "ARAG_UNCERTAINTY_THRESHOLD=" in done.stdout
        tuned = json.loads((out / "tuning.json").read_text())
        assert tuned["split"] == "train" and tuned["questions"] == 4 and tuned["cost"] == "steps"
        assert {a["aggregate"] for a in tuned["aggregates"]} == {"min", "mean"}
        drafts = (out / "drafts.jsonl").read_text().splitlines()
        assert len(drafts) == 4 and all(json.loads(d)["token_logprobs"] for d in drafts)
        again = arag(*args, env={"LLM_BASE_URL": url})
        assert again.returncode == 0, again.stderr
    assert (out / "drafts.jsonl").read_text().splitlines() == drafts  # resumed: nothing run twice
    assert len((out / "single_step.jsonl").read_text().splitlines()) == 4


@pytest.mark.parametrize(("option", "message"), [
    (("--cost", "dollars"), "--cost is seconds or steps"),
    (("--limit", "0"), "--limit is at least 1"),
])
def test_bad_options_are_refused(tmp_path: Path, option: tuple[str, str], message: str) -> None:
    done = arag("routers", "tune-uncertainty", *option, "--out", str(tmp_path))
    assert done.returncode == 2 and message in done.stdout + done.stderr


def test_the_evaluation_takes_the_tuned_threshold_only_from_train_and_the_same_reader(tmp_path: Path) -> None:
    import typer

    from adaptive_rag.cli.evaluation import _tuned_uncertainty

    def tuning(**changes) -> Path:
        path = tmp_path / "tuning.json"
        path.write_text(json.dumps({"split": "train", "reader": "qwen-1.5b",
                                    "chosen": {"aggregate": "mean", "threshold": 0.42}, **changes}))
        return path

    assert _tuned_uncertainty(tuning(), "qwen-1.5b") == {"uncertainty_threshold": 0.42,
                                                         "uncertainty_aggregate": "mean"}
    for changes, message in (({"reader": "gemma-270m"}, "tuned for reader 'gemma-270m'"),
                             ({"split": "test"}, "only `train` may choose it"),
                             ({"chosen": {"aggregate": "median", "threshold": 0.4}}, "not a tuning.json"),
                             ({"chosen": {"threshold": 0.4}}, "not a tuning.json")):
        with pytest.raises(typer.BadParameter, match=message):
            _tuned_uncertainty(tuning(**changes), "qwen-1.5b")
    with pytest.raises(typer.BadParameter, match="not a tuning.json"):
        _tuned_uncertainty(tmp_path / "missing.json", "qwen-1.5b")
