"""How often would a question that stands alone be taken for a follow-up that names no subject of
its own (`strategies.follow_up.names_no_subject`: "how many can I have?")? Such a turn is searched
with the previous question's topic, so a standalone question it fires on is searched off its
subject. Counted over every question of the benchmark files and the support suite's questions,
and over the small-talk benchmark's utterances (a turn that only a conversation explains).

    python -m lab.experiments.subjectless_turns --data-dir ../shared/data --out reports/conversations/subjectless
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from adaptive_rag.evaluation.datasets import DATASETS, load_dataset
from adaptive_rag.strategies.follow_up import names_no_subject

REPO = Path(__file__).resolve().parents[2]
SUPPORT = REPO / "adaptive_rag" / "evaluation" / "support_data"
SMALL_TALK = REPO / "lab" / "experiments" / "small_talk_data" / "rasa_demo_nlu.jsonl"


def _jsonl(path: Path, key: str) -> list[str]:
    return [json.loads(line)[key] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def question_sets(data: Path) -> dict[str, list[str]]:
    """Questions that stand alone, per source: every benchmark dataset (`evaluation.datasets`),
    the COVID FAQ's questions and their paraphrases, Quillbill's questions."""
    with (data / "covid-faq_en_covid-qa.csv").open(encoding="utf-8") as handle:
        covid = [row["question"] for row in csv.DictReader(handle)]
    with (data / "covid-faq_question-similarity-en_covid-qa.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    paraphrases = [row[c] for row in rows for c in row if c and "question" in c.lower() and row[c]]
    sets = {name: [q.question for q in load_dataset(data, name)] for name in DATASETS}
    return {**sets, "COVID FAQ questions": covid, "COVID FAQ paraphrases": paraphrases,
            "Quillbill questions": _jsonl(SUPPORT / "quillbill_questions.jsonl", "question")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "conversations" / "subjectless")
    args = parser.parse_args(argv)
    sets = {name: [q for q in qs if q] for name, qs in question_sets(args.data_dir).items()}
    rows = {name: {"questions": len(qs), "fires": [q for q in qs if names_no_subject(q)]} for name, qs in sets.items()}
    small_talk = [t for t in _jsonl(SMALL_TALK, "text") if t]
    total = sum(r["questions"] for r in rows.values())
    fired = sum(len(r["fires"]) for r in rows.values())
    summary = {"standalone": rows, "standalone_total": total, "standalone_fired": fired,
               "small_talk_utterances": len(small_talk),
               "small_talk_fired": [t for t in small_talk if names_no_subject(t)]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    lines = ["# Questions that stand alone, taken for a follow-up with no subject of its own", "",
             f"**Answer.** `names_no_subject` fires on **{fired} of {total:,}** questions that stand alone; "
             f"on {len(summary['small_talk_fired'])} of {len(small_talk):,} small-talk utterances (only inside a "
             "conversation does it matter: without earlier turns nothing is rewritten).", "",
             "| source | questions | fires on | examples |", "| --- | ---: | ---: | --- |"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['questions']:,} | {len(r['fires'])} | {'; '.join(r['fires'][:3])} |")
    lines += ["", f"Small-talk utterances it fires on: {'; '.join(summary['small_talk_fired'])}.", "",
              "    python -m lab.experiments.subjectless_turns --data-dir ../shared/data --out reports/conversations/subjectless", ""]
    (args.out / "README.md").write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
