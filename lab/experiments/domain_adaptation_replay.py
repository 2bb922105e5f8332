"""Re-decide a finished domain-adaptation run's rounds with today's labelling and tenant-prior code,
on the traffic that run recorded: what would `arag relabel` and the tenant step have done?

    .venv/bin/python -m lab.experiments.domain_adaptation_replay var/domain_adaptation/<run> \
        [--out reports/domain_adaptation/replay.md]

For round k it copies the run's records (`stack/arag.db`), keeps the feedback of rounds 1..k only,
drops every live label and relabels (`relabel_from_records`, the current rule), then runs the
tenant step (`adapt_tenants`) over the run's version 1 with the prior the previous round kept, and
routes every support `test` query in-process as the front door does (`LocalOnnxClassifier`, the
small-talk detector first, the tenant's prior, the two-questions escalation) against the suite's
gold tiers. Global challengers are not retrained:
the replay holds the served router at version 1.

It is only faithful to a run whose traffic version 1 served in every round (no challenger
promoted before the last round), because the replies and feedback are the recorded ones: a router
that routed differently would have been answered and rated differently. The live measurement is
`lab.experiments.domain_adaptation`; this is a cheap check of a labelling or prior rule on recorded
outcomes, and it says so in its output.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adaptive_rag.evaluation.support import build_suite
from adaptive_rag.routers.local_classifier import LocalOnnxClassifier
from adaptive_rag.routing.model_repository import open_version
from adaptive_rag.routing.rules import escalate_several_things
from adaptive_rag.routing.small_talk import small_talk_intent
from adaptive_rag.routing.tenant_priors import TENANT_PRIORS_FILE, TenantPriors
from adaptive_rag.settings import Settings
from adaptive_rag.storage import LabelStore, make_engine
from adaptive_rag.training.relabel import relabel_from_records
from adaptive_rag.training.tenant_adaptation import adapt_tenants
from lab.experiments.domain_adaptation import (
    TENANT,
    RoutedQuery,
    _pct,
    _prior_cell,
    summarise_routes,
)


def records_up_to(source: Path, target: Path, later_requests: Sequence[str]) -> None:
    """A copy of the run's records without later rounds' feedback and without live labels.

    Copied through SQLite's backup API, not as a file: in write-ahead-log mode the newest rows may
    still be in `<db>-wal` (a connection left open keeps them there), which a file copy leaves out."""
    source_db, target_db = sqlite3.connect(source), sqlite3.connect(target)
    try:
        source_db.backup(target_db)
    finally:
        source_db.close()
        target_db.close()
    with sqlite3.connect(target) as db:
        db.executemany("DELETE FROM feedback WHERE request_id = ?", [(r,) for r in later_requests])
        db.execute("DELETE FROM training_labels WHERE origin = 'live'")


def route_test(classifier: LocalOnnxClassifier, priors: TenantPriors, queries: Sequence[Any]) -> dict[str, Any]:
    """Every support `test` query as the front door would route it for the tenant."""
    rows = []
    for query in queries:
        if small_talk_intent(query.query) is not None:
            tier = "A"
        else:
            decision = priors.adjust(classifier.classify(query.query), TENANT, classifier.policy)
            tier = escalate_several_things(query.query, decision).tier.value
        rows.append(RoutedQuery(query.id, query.kind, query.gold_tier.value, tier, classifier.version.version))
    return summarise_routes(rows)


def replay(run: Path, data_dir: Path) -> dict[str, Any]:
    requests = [json.loads(line) for line in (run / "replay.jsonl").read_text(encoding="utf-8").splitlines() if line]
    rounds = sorted({r["round"] for r in requests})
    suite = build_suite(data_dir)
    test = [q for q in suite.queries if q.split == "test"]
    result: dict[str, Any] = {"run": str(run), "rounds": []}
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        shutil.copytree(run / "model_repository", scratch / "repo")
        version = open_version(scratch / "repo", version=1)
        (version.path / TENANT_PRIORS_FILE).unlink(missing_ok=True)
        classifier = LocalOnnxClassifier(version)
        result["start"] = route_test(classifier, TenantPriors(), test)
        for k in rounds:
            later = [r["request_id"] for r in requests if r["round"] > k and r.get("request_id")]
            db = scratch / f"round-{k}.db"
            records_up_to(run / "stack" / "arag.db", db, later)
            engine = make_engine(f"sqlite:///{db}")
            stats = relabel_from_records(engine)
            verdicts = adapt_tenants(LabelStore(engine).labels(split="train"), version, log=lambda _: None)
            engine.dispose()
            priors = TenantPriors.load_or_empty(version.path)
            result["rounds"].append({
                "round": k, "labels": stats.labels, "tenant_priors": [v.summary() for v in verdicts],
                "support": route_test(classifier, priors, test),
            })
    return result


def render(result: dict[str, Any]) -> str:
    lines = [f"# Replay of {result['run']} with the current relabel rule and tenant priors", "",
             f"Command: `python -m lab.experiments.domain_adaptation_replay {result['run']}`", "",
             "Recorded traffic (served by version 1 throughout), re-decided offline: not a live run. The "
             "global router is held at version 1 (no challenger retrained); only labels and the tenant "
             "prior are decided again.", "",
             "| after | live labels A / B / C | tenant prior (cross-validated vs champion) | support-test accuracy | under | over |",
             "| --- | ---: | --- | ---: | ---: | ---: |"]
    start = result["start"]
    lines.append(f"| start | - | - | {_pct(start['accuracy'])} | {start['under']} | {start['over']} |")
    for r in result["rounds"]:
        s = r["support"]
        tiers = " / ".join(str(r["labels"].get(t, 0)) for t in "ABC")
        lines.append(f"| round {r['round']} | {tiers} | {_prior_cell({'tenant_priors': r['tenant_priors']})} | "
                     f"{_pct(s['accuracy'])} | {s['under']} | {s['over']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a domain-adaptation scratch directory (var/domain_adaptation/<run>)")
    parser.add_argument("--data-dir", type=Path, default=None, help="benchmark + support data (default: ARAG_DATA_DIR)")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown table here")
    args = parser.parse_args(argv)
    for needed in ("replay.jsonl", "stack/arag.db", "model_repository"):
        if not (args.run / needed).exists():
            parser.error(f"{args.run} lacks {needed}: not a domain-adaptation run directory")
    text = render(replay(args.run, args.data_dir or Settings().data_dir))
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
