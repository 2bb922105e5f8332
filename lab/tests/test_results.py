"""The results page states only figures that recompute from the committed records."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lab import results

PAGE = results.DEFAULT_DOCS.read_text(encoding="utf-8")


def _page(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "results.md"
    page.write_text(text, encoding="utf-8")
    return page


def test_every_figure_of_the_results_page_recomputes_from_the_committed_records(capsys) -> None:
    assert results.main([]) == 0
    assert "MISMATCH" not in capsys.readouterr().out


def test_the_page_states_every_figure_the_module_recomputes() -> None:
    stated = results.documented(PAGE)
    assert {figure.name for figure in results.FIGURES} == set(stated)


@pytest.mark.parametrize("stated, tampered", [
    ("| **117.0 Answers/s** |", "| **150.0 Answers/s** |"),       # the distinct ceiling
    ("| **+6.3 [+4.0, +8.8]** |", "| **-6.3 [+4.0, +8.8]** |"),   # the shipped router against always B
    ("| 94 / 94 |", "| 95 / 95 |"),                               # hostile inputs
])
def test_a_tampered_figure_is_a_mismatch_and_fails_the_run(tmp_path: Path, capsys, stated: str, tampered: str) -> None:
    assert stated in PAGE
    page = _page(tmp_path, PAGE.replace(stated, tampered))
    assert results.main(["--docs", str(page)]) == 1
    (failed,) = [c for c in results.check(page) if not c.ok]
    assert failed.documented == tampered.strip("| ").replace("**", "")
    assert "MISMATCH" in capsys.readouterr().out


def test_a_stated_figure_nothing_recomputes_fails(tmp_path: Path) -> None:
    page = _page(tmp_path, PAGE + "\n| A figure from nowhere | 42 | [somewhere](../reports/) |\n")
    assert results.main(["--docs", str(page)]) == 1
    (failed,) = [c for c in results.check(page) if not c.ok]
    assert (failed.name, failed.recomputed) == ("A figure from nowhere", None)


def test_a_figure_missing_from_the_page_fails(tmp_path: Path) -> None:
    kept = [line for line in PAGE.splitlines() if not line.startswith("| Hostile inputs passed |")]
    page = _page(tmp_path, "\n".join(kept))
    assert results.main(["--docs", str(page)]) == 1
    (failed,) = [c for c in results.check(page) if not c.ok]
    assert (failed.name, failed.documented) == ("Hostile inputs passed", None)


def test_gzipped_and_plain_records_read_alike(tmp_path: Path) -> None:
    import gzip
    rows = '{"a": 1}\n\n{"a": 2}\n'
    (tmp_path / "plain.jsonl").write_text(rows)
    with gzip.open(tmp_path / "packed.jsonl.gz", "wt") as handle:
        handle.write(rows)
    assert list(results.read_jsonl(tmp_path / "plain.jsonl")) == list(results.read_jsonl(tmp_path / "packed.jsonl.gz")) == [{"a": 1}, {"a": 2}]


def _experiments(reports: Path) -> set[str]:
    """Folders with a README.md, except the runs inside an experiment (whose parent has one)."""
    found = set()
    for readme in reports.rglob("README.md"):
        folder = readme.parent
        is_run = folder.parent != reports and (folder.parent / "README.md").exists()
        if folder != reports and not is_run:
            found.add(folder.relative_to(reports).as_posix())
    return found


def test_the_reports_index_links_every_experiment_and_only_existing_ones() -> None:
    reports = results.DEFAULT_REPORTS
    index = (reports / "README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([^)#]+)/\)", index))
    assert linked == _experiments(reports)


def test_every_report_the_results_page_links_exists() -> None:
    docs = results.DEFAULT_DOCS
    for target in re.findall(r"\]\((\.\./reports/[^)]*)\)", PAGE):
        assert (docs.parent / target).exists(), target


def test_a_figure_whose_records_are_gone_fails(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    (reports / "security").mkdir(parents=True)
    failed = {c.name: c for c in results.check(results.DEFAULT_DOCS, reports) if not c.ok}
    assert failed["Hostile inputs passed"].recomputed is None
    assert results.main(["--reports", str(reports)]) == 1
