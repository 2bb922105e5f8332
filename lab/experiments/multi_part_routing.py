"""Do questions that ask several things reach tier C, in the ways people write them, and do single
questions stay out of it?

A customer writes two or three questions in one message: "X and can I Y?", "How do I A and B?",
"compare X with Y", "X, and if so Y?", lists ("the fees for A, B and C?", "1) ... 2) ..."),
several sentences ("X? Also, Y?"). Each part needs its own look-up, so serving sends such a query
to C (`routing.rules.escalate_several_things`), where each part is answered from its own passages
(`strategies.parts`); a comparison is read at once over both sides.

Questions (`adaptive_rag/evaluation/support_data/multi_part_questions.jsonl`): 40 per help centre in
seven forms, written for this measure; the demo help centre's set was used to design the rules
(`routing.question_parts`), Quillbill's was written before them and read once, after. Beside them
the help centres' own questions: Quillbill's joined (`two_pages`) questions and the covered ones
that ask two things count as multi-part; every other question of the suite (covered, uncovered,
off-topic) is a single question, the false-C side.

Per question, no model call: the parts found (`question_parts`), and the tier under two routers,
each followed by the escalation as serving does it: the rules router (`ARAG_ROUTER=rules`) and the
shipped bag-of-words router (`models/router/router.json`, the graph Triton serves; its argmax tier).
Rates carry Wilson 95 % intervals.

And the passages C reads for them: for the suites' joined questions (the COVID FAQ's `test` split,
every Quillbill two-page question), whether every part's FAQ entry or page is among the passages
read, B's top 5 for the whole question against C's top 5 per part (`strategies.parts`), BM25 over
the knowledge base's own index.

    python -m lab.experiments.multi_part_routing --out reports/multi_part_routing   # seconds

Writes `README.md`, `summary.json` and `questions.jsonl` (one record per question).
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from adaptive_rag.contracts import RoutingDecision, Tier
from adaptive_rag.evaluation import help_centre, quillbill
from adaptive_rag.evaluation.support import JOINED
from adaptive_rag.evaluation.support_kbs import build_knowledge_base_suite
from adaptive_rag.retrieval.tantivy_index import TantivyRetriever
from adaptive_rag.settings import Settings
from adaptive_rag.routing.rules import escalate_several_things, question_parts, rules_router
from adaptive_rag.training.bag_of_words import BagOfWordsRouter
from lab.harness.stats import wilson_interval

QUESTIONS = Path(quillbill.DATA) / "multi_part_questions.jsonl"
SHIPPED_ROUTER = Path("models/router/router.json")
DESIGN, HELD_OUT = "help-centre", "quillbill"
TARGET_REACH, TARGET_FALSE = 0.85, 0.05


@dataclass(frozen=True)
class Asked:
    """One question of the measure and what the routing made of it."""

    id: str
    kb: str
    form: str  # the multi-part form, or "single"
    question: str
    expected_parts: int  # 1 for a single question
    parts: list[str]
    rules_tier: str
    shipped_tier: str

    @property
    def multi_part(self) -> bool:
        return self.form != "single"


def load_questions(path: Path = QUESTIONS) -> list[tuple[str, str, str, str, int]]:
    """(id, kb, form, question, parts) for every question of the measure: the written set, the
    suites' own multi-part questions, and every other suite question as a single one."""
    written = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    suite_multi = {row["id"]: row for row in written if "question" not in row}
    rows = [(r["id"], r["kb"], r["form"], r["question"], r["parts"]) for r in written if "question" in r]
    for item in (json.loads(line) for line in quillbill.QUESTIONS_FILE.read_text(encoding="utf-8").splitlines()
                 if line.strip()):
        if item["kind"] == "two_pages":
            rows.append((item["id"], HELD_OUT, "suite", item["question"], 2))
        elif item["id"] in suite_multi:
            rows.append((item["id"], HELD_OUT, "suite", item["question"], suite_multi[item["id"]]["parts"]))
        else:
            rows.append((item["id"], HELD_OUT, "single", item["question"], 1))
    coverage = json.loads((help_centre.DEMO_DIR / "coverage_questions.json").read_text(encoding="utf-8"))
    rows += [(item["id"], DESIGN, "single", item["question"], 1) for item in coverage]
    return rows


def route_all(rows: Sequence[tuple[str, str, str, str, int]],
              shipped: Callable[[Sequence[str]], list[str]]) -> list[Asked]:
    questions = [row[3] for row in rows]
    shipped_tiers = shipped(questions)
    asked = []
    for (qid, kb, form, question, expected), tier in zip(rows, shipped_tiers):
        decision = RoutingDecision(tier=Tier(tier), reason="shipped router")
        asked.append(Asked(
            id=qid, kb=kb, form=form, question=question, expected_parts=expected,
            parts=question_parts(question),
            rules_tier=escalate_several_things(question, rules_router(question)).tier.value,
            shipped_tier=escalate_several_things(question, decision).tier.value,
        ))
    return asked


def rate(hits: int, n: int) -> dict[str, Any]:
    low, high = wilson_interval(hits, n) if n else (0.0, 0.0)
    return {"hits": hits, "n": n, "rate": hits / n if n else 0.0, "low": low, "high": high}


def summarise(asked: Sequence[Asked]) -> dict[str, Any]:
    """Per knowledge base: multi-part questions reaching C and split as written (a comparison is
    read whole: one part), single questions sent to C, each router; and per form."""
    summary: dict[str, Any] = {}
    for kb in (DESIGN, HELD_OUT):
        mine = [a for a in asked if a.kb == kb]
        multi, single = [a for a in mine if a.multi_part], [a for a in mine if not a.multi_part]
        split_right = sum(len(a.parts) == (1 if a.form == "compare" else a.expected_parts) for a in multi)
        by_form: dict[str, list[Asked]] = defaultdict(list)
        for a in multi:
            by_form[a.form].append(a)
        summary[kb] = {
            "multi_part": len(multi), "single": len(single),
            "reach_c": {router: rate(sum(getattr(a, f"{router}_tier") == "C" for a in multi), len(multi))
                        for router in ("rules", "shipped")},
            "false_c": {router: rate(sum(getattr(a, f"{router}_tier") == "C" for a in single), len(single))
                        for router in ("rules", "shipped")},
            "split_as_written": rate(split_right, len(multi)),
            "forms": {form: {"n": len(items), "reach_c_shipped": sum(a.shipped_tier == "C" for a in items),
                             "split_as_written": sum(len(a.parts) == (1 if form == "compare" else a.expected_parts)
                                                     for a in items)}
                      for form, items in sorted(by_form.items())},
        }
    return summary


def parts_retrieval(settings: Settings, top_k: int = 5) -> dict[str, Any]:
    """Per knowledge base with joined questions: every part's entry among the passages read, B
    (the whole question's top k) against C by parts (each part's own top k, merged)."""
    found: dict[str, Any] = {}
    for kb, split in (("covid-faq", "test"), (HELD_OUT, None)):
        suite = build_knowledge_base_suite(kb, settings)
        joined = [q for q in suite.queries if q.kind == JOINED and (split is None or q.split == split)]
        with tempfile.TemporaryDirectory(prefix="parts-index-") as folder:
            retriever = TantivyRetriever.build(Path(folder), suite.passages, title_boost=settings.title_boost)

            def complete(queries: Sequence[str], groups: Sequence[Sequence[str]]) -> bool:
                read = {p.doc_id for query in queries for p in retriever.search(query, top_k)}
                return all(any(entry in read for entry in group) for group in groups)

            b = sum(complete([q.query], q.gold_groups) for q in joined)
            c = sum(complete(question_parts(q.query), q.gold_groups) for q in joined)
            split_in_parts = sum(len(question_parts(q.query)) > 1 for q in joined)
        found[kb] = {"n": len(joined), "split": split or "all", "split_in_parts": split_in_parts,
                     "b": rate(b, len(joined)), "c_parts": rate(c, len(joined))}
    return found


def _pct(r: Mapping[str, Any]) -> str:
    return f"{100 * r['rate']:.1f} % [{100 * r['low']:.1f}, {100 * r['high']:.1f}] ({r['hits']} of {r['n']})"


def markdown(summary: Mapping[str, Any], asked: Sequence[Asked], command: str) -> str:
    held = summary[HELD_OUT]
    reach, false = held["reach_c"]["shipped"], held["false_c"]["shipped"]
    if reach["rate"] >= TARGET_REACH and false["rate"] <= TARGET_FALSE:
        sure = reach["low"] >= TARGET_REACH and false["high"] <= TARGET_FALSE
        verdict = "meets" if sure else "meets, on the point estimates (not on both intervals),"
    else:
        verdict = "does not meet"
    lines = [
        "# Multi-part questions reach tier C, in the ways people write them",
        "",
        "**Question.** Do questions that ask several things (\"X and can I Y?\", \"How do I A and B?\", "
        "\"compare X with Y\", \"X, and if so Y?\", lists, several sentences) reach tier C, and do single "
        "questions stay out of it?",
        "",
        f"**Answer.** On Quillbill, held out from the rules' design, {_pct(reach)} of the multi-part "
        f"questions reach C with the shipped router and the escalation, and {_pct(false)} of its single "
        f"questions are sent to C: this {verdict} the targets (>= {TARGET_REACH:.0%} reached, <= "
        f"{TARGET_FALSE:.0%} false). The parts are split as written for "
        f"{_pct(held['split_as_written'])} of them.",
        "",
        "Quillbill was read twice. First with the router fitted on benchmark labels only: 14 of 150 "
        "single questions went to C, all but one by the router itself (words such as \"both\", \"if\" "
        "and \"does\" are multi-hop words in the benchmark). The router now shipped also learns from "
        "the support suites' `train` questions (COVID FAQ and the demo help centre, never Quillbill; "
        "`arag routers fit-words`, on by default): a change made for that reason, no value chosen on "
        "Quillbill. The rules and the question set were not changed after the first read.",
        "",
        "| knowledge base | multi-part | reach C, shipped router | reach C, rules router | single | "
        "single sent to C, shipped | single sent to C, rules | split as written |",
        "| --- | ---: | --- | --- | ---: | --- | --- | --- |",
    ]
    for kb, label in ((DESIGN, "demo help centre (design)"), (HELD_OUT, "Quillbill (held out)")):
        s = summary[kb]
        lines.append(f"| {label} | {s['multi_part']} | {_pct(s['reach_c']['shipped'])} | {_pct(s['reach_c']['rules'])} "
                     f"| {s['single']} | {_pct(s['false_c']['shipped'])} | {_pct(s['false_c']['rules'])} "
                     f"| {_pct(s['split_as_written'])} |")
    retrieval = summary.get("parts_retrieval")
    if retrieval:
        lines += ["", "Every part's entry among the passages read, the suites' joined questions (BM25, top 5 "
                  "for the whole question in B, per part in C):", "",
                  "| knowledge base | questions | split in parts | B | C by parts |", "| --- | ---: | ---: | --- | --- |"]
        for kb, r in retrieval.items():
            lines.append(f"| {kb} ({r['split']}) | {r['n']} | {r['split_in_parts']} | {_pct(r['b'])} | {_pct(r['c_parts'])} |")
    lines += ["", "Per form (shipped router; reached C / split as written / questions):", "",
              "| form | " + " | ".join((DESIGN, HELD_OUT)) + " |", "| --- | --- | --- |"]
    forms = sorted({f for kb in (DESIGN, HELD_OUT) for f in summary[kb]["forms"]})
    for form in forms:
        cells = []
        for kb in (DESIGN, HELD_OUT):
            f = summary[kb]["forms"].get(form)
            cells.append(f"{f['reach_c_shipped']} / {f['split_as_written']} / {f['n']}" if f else "-")
        lines.append(f"| {form} | " + " | ".join(cells) + " |")
    missed = [a for a in asked if a.multi_part and a.shipped_tier != "C"]
    wrong = [a for a in asked if not a.multi_part and a.shipped_tier == "C"]
    lines += ["", "Multi-part questions that did not reach C:", ""]
    lines += [f"- `{a.kb}` {a.form}: {a.question}" for a in missed] or ["- none"]
    lines += ["", "Single questions sent to C (shipped router, then the escalation):", ""]
    lines += [f"- `{a.kb}`: {a.question} ({'escalated: ' + ' | '.join(a.parts) if len(a.parts) > 1 else 'the router'})"
              for a in wrong] or ["- none"]
    lines += [
        "", "**How measured.** No model call: the parts found by `routing.question_parts`, and the tier "
        "of each router followed by the escalation serving applies. A comparison counts as split as "
        "written when it stays whole (C reads both sides at once). The forms' questions are in "
        "`adaptive_rag/evaluation/support_data/multi_part_questions.jsonl`; `questions.jsonl` here has "
        "every question with its parts and tiers.", "",
        f"`{command}` on {platform.machine()}, Python {platform.python_version()}, "
        f"{datetime.now(timezone.utc).strftime('%Y-%m-%d')}.", "",
    ]
    return "\n".join(lines)


def run(out: Path, router_path: Path, command: str) -> dict[str, Any]:
    shipped = BagOfWordsRouter.load(router_path)
    asked = route_all(load_questions(), shipped.route_many)
    summary = {**summarise(asked), "parts_retrieval": parts_retrieval(Settings())}
    out.mkdir(parents=True, exist_ok=True)
    (out / "questions.jsonl").write_text("".join(json.dumps(asdict(a)) + "\n" for a in asked), encoding="utf-8")
    (out / "summary.json").write_text(json.dumps({"command": command, **summary}, indent=2) + "\n", encoding="utf-8")
    (out / "README.md").write_text(markdown(summary, asked, command), encoding="utf-8")
    return summary


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("reports/multi_part_routing"))
    parser.add_argument("--router", type=Path, default=SHIPPED_ROUTER, help="the shipped bag-of-words router")
    args = parser.parse_args(argv)
    command = "python -m lab.experiments.multi_part_routing " + shlex.join(sys.argv[1:] if argv is None else argv)
    summary = run(args.out, args.router, command)
    for kb in (DESIGN, HELD_OUT):
        s = summary[kb]
        print(f"{kb}: reach C {_pct(s['reach_c']['shipped'])}; single to C {_pct(s['false_c']['shipped'])}")


if __name__ == "__main__":
    main()
