"""Writing an experiment's answer: its summary as JSON and its raw records as gzipped JSON lines,
the two files a report's figures are recomputed from."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def write_summary_and_records(out: Path, summary: dict[str, Any], records: Iterable[dict[str, Any]]) -> None:
    """`out/summary.json` and `out/records.jsonl.gz` (one record per line), `out` created."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    with gzip.open(out / "records.jsonl.gz", "wt", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
