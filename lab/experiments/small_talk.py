"""Small talk from real users: how much of it does the learned detector recognise, and how often
does it answer a real question with a canned reply, beside the phrase rules it replaces?

Sets (none used for fitting or selection; see `small_talk_data/SOURCES.md`):
- `rasa-demo`: the NLU training data of Rasa's demo assistant (`small_talk_data/rasa_demo_nlu.jsonl`,
  pinned commit): greetings, thanks, goodbyes and questions about the assistant (small talk, with
  the intents each may be answered with), affirm/deny (acknowledgements), the assistant's
  off-topic chit-chat requests (weather, time, "what is Rasa", "who am I": requests the detector
  must not answer) and "I have a question" turns (no question yet: a prompt for it is fine);
- `real-requests`: every question of the data directory's `test` split (the six QA benchmarks,
  the COVID FAQ questions and their paraphrases), the demo's `test` questions and the demo's
  coverage questions: a canned reply to any of them is a false positive.

Decontamination: `make small-talk-model` (`arag smalltalk train --held-out` this file) drops every training example that is a Rasa utterance or
a near copy of one (the rule in `adaptive_rag.training.small_talk`: equal after `near_key`, word
Jaccard >= 0.6, or difflib character ratio >= 0.85 in either order); the model card records how
many. Every Rasa record says whether a training example is still equal or near to it
(`in_training`; for real requests: equal after normalising), which the report counts (none).

Detectors: `learned` (the shipped `small_talk_detector.npz`) and `rules` (the phrase rules, the
old detector). A small-talk record counts as recalled when the detector gives it any small-talk
reply (not the acknowledgement prompt), and as correctly answered when the intent is one of its
accepted ones. Intervals: percentile bootstrap 95 % (`lab.harness.stats`); a proportion of 0 or
1 has a zero-width bootstrap interval, so the Wilson 95 % interval is given beside it.

Writes `records.jsonl.gz` (one line per utterance and detector), `summary.json`, `README.md` and
`recall.png` under `--out`:

    python -m lab.experiments.small_talk --data-dir ../shared/data --out reports/small_talk
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import shlex
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lab.harness.stats import mean_interval, paired_difference_interval, wilson_interval

HERE = Path(__file__).resolve().parent
RASA_FILE = HERE / "small_talk_data" / "rasa_demo_nlu.jsonl"
DEMO_COVERAGE = HERE.parents[1] / "demo" / "coverage_questions.json"
DETECTORS = ("learned", "rules")
SMALL_TALK, ACKNOWLEDGEMENT_KIND, REQUEST, OTHER = "small_talk", "acknowledgement", "request", "other"
TARGET_RECALL, TARGET_FALSE_POSITIVES = 0.85, 0.003


@dataclass(frozen=True)
class Record:
    """One utterance judged by one detector."""

    set: str  # rasa-demo | real-requests
    source: str  # the Rasa intent, or the dataset of a real request
    kind: str  # small_talk | acknowledgement | request | other
    text: str
    accepted: tuple[str, ...]  # intents a small-talk record may be answered with
    in_training: bool  # a training example is this text (or, for the Rasa file, a near copy of it)
    detector: str
    decided: str | None  # the intent answered with, None for "a request"


def load_rasa(path: Path = RASA_FILE) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _cell(values: Sequence[float]) -> dict[str, Any] | None:
    """A proportion with its bootstrap interval and its Wilson interval."""
    if not values:
        return None
    hits, n = int(sum(values)), len(values)
    boot = mean_interval(values)
    low, high = wilson_interval(hits, n)
    return {"estimate": hits / n, "hits": hits, "n": n,
            "low": boot.low if boot else None, "high": boot.high if boot else None,
            "wilson_low": low, "wilson_high": high}


def recalled(record: Record) -> bool:
    return record.decided is not None and record.decided != "acknowledgement"


def canned(record: Record) -> bool:
    """Any canned reply, the acknowledgement prompt included: what a real request must never get."""
    return record.decided is not None


def score(records: Iterable[Record]) -> dict[str, Any]:
    """The report's figures from the records (each detector on its own, and the paired difference
    of recall, learned minus rules)."""
    by: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        by[record.detector].append(record)
    out: dict[str, Any] = {"detectors": {}}
    paired: dict[str, dict[tuple[str, str], float]] = {}
    for detector, rows in sorted(by.items()):
        talk = [r for r in rows if r.set == "rasa-demo" and r.kind == SMALL_TALK]
        unseen = [r for r in talk if not r.in_training]
        per_intent: dict[str, list[Record]] = defaultdict(list)
        for r in talk:
            per_intent[r.source].append(r)
        real = [r for r in rows if r.set == "real-requests"]
        per_source: dict[str, list[Record]] = defaultdict(list)
        for r in real:
            per_source[r.source].append(r)
        off_topic = [r for r in rows if r.set == "rasa-demo" and r.kind == REQUEST]
        help_broad = [r for r in rows if r.set == "rasa-demo" and r.kind == OTHER]
        acks = [r for r in rows if r.set == "rasa-demo" and r.kind == ACKNOWLEDGEMENT_KIND]
        out["detectors"][detector] = {
            "recall": _cell([float(recalled(r)) for r in talk]),
            "recall_unseen": _cell([float(recalled(r)) for r in unseen]),
            "intent_correct": _cell([float(r.decided in r.accepted) for r in talk]),
            "recall_per_intent": {k: _cell([float(recalled(r)) for r in v]) for k, v in sorted(per_intent.items())},
            "recall_unseen_per_intent": {k: _cell([float(recalled(r)) for r in v if not r.in_training])
                                         for k, v in sorted(per_intent.items())},
            "false_positives": _cell([float(canned(r)) for r in real]),
            "false_positives_per_source": {k: _cell([float(canned(r)) for r in v]) for k, v in sorted(per_source.items())},
            "false_positive_examples": sorted({f"{r.text} -> {r.decided}" for r in real if canned(r)})[:40],
            "off_topic_requests_canned": _cell([float(canned(r)) for r in off_topic]),
            "off_topic_examples": sorted({f"{r.text} -> {r.decided}" for r in off_topic if canned(r)})[:40],
            "help_without_a_question_canned": _cell([float(canned(r)) for r in help_broad]),
            "acknowledgements_prompted": _cell([float(r.decided == "acknowledgement") for r in acks]),
            "acknowledgements_small_talk": _cell([float(recalled(r)) for r in acks]),
            "missed_examples": sorted({f"{r.source}: {r.text}" for r in talk if not recalled(r)})[:60],
        }
        paired[detector] = {(r.source, r.text): float(recalled(r)) for r in talk}
    if set(DETECTORS) <= set(paired):
        keys = sorted(set(paired["learned"]) & set(paired["rules"]))
        interval = paired_difference_interval([paired["rules"][k] for k in keys], [paired["learned"][k] for k in keys])
        out["recall_difference_learned_minus_rules"] = interval.as_dict() if interval else None
    learned = out["detectors"].get("learned")
    if learned and learned["recall"] and learned["false_positives"]:
        out["targets"] = {
            "recall": TARGET_RECALL, "false_positives": TARGET_FALSE_POSITIVES,
            "recall_met": learned["recall"]["estimate"] >= TARGET_RECALL,
            "recall_unseen_met": bool(learned["recall_unseen"]) and learned["recall_unseen"]["estimate"] >= TARGET_RECALL,
            "false_positives_met": learned["false_positives"]["estimate"] <= TARGET_FALSE_POSITIVES,
        }
    return out


def judge(utterances: Sequence[dict[str, Any]], detectors: Mapping[str, Callable[[str], str | None]]) -> list[Record]:
    """Every utterance through every detector."""
    return [Record(detector=name, decided=decide(u["text"]), **u)
            for name, decide in detectors.items() for u in utterances]


def utterances(data_dir: Path, training_keys: set[str], normalise: Callable[[str], list[str]],
               near_training: Callable[[str], bool] | None = None) -> list[dict[str, Any]]:
    """Every utterance to judge. A Rasa record is `in_training` when `near_training` says a
    training example is equal or near to it; a real request when its normalised text is one."""
    from adaptive_rag.training.small_talk import real_requests

    def seen(text: str) -> bool:
        return " | ".join(normalise(text)) in training_keys

    near = near_training or seen
    rows = [{"set": "rasa-demo", "source": r["rasa_intent"], "kind": r["kind"], "text": r["text"],
             "accepted": tuple(r["intents"]), "in_training": near(r["text"])} for r in load_rasa()]
    rows += [{"set": "real-requests", "source": source, "kind": REQUEST, "text": text, "accepted": (),
              "in_training": seen(text)}
             for source, _, text, split in real_requests(data_dir) if split == "test"]
    if DEMO_COVERAGE.is_file():  # written for the abstention experiment, never trained on
        rows += [{"set": "real-requests", "source": "demo-coverage", "kind": REQUEST, "text": q["question"],
                  "accepted": (), "in_training": seen(q["question"])}
                 for q in json.loads(DEMO_COVERAGE.read_text(encoding="utf-8"))]
    return rows


def _pct(cell: Mapping[str, Any] | None, digits: int = 1) -> str:
    if not cell:
        return "-"
    interval = (f"[{100 * cell['low']:.{digits}f}, {100 * cell['high']:.{digits}f}]"
                if cell["low"] is not None else "")
    wilson = (f" (Wilson {100 * cell['wilson_low']:.{digits}f}-{100 * cell['wilson_high']:.{digits}f})"
              if cell["hits"] in (0, cell["n"]) else "")
    return f"{100 * cell['estimate']:.{digits}f} % {interval} {cell['hits']}/{cell['n']}{wilson}"


def markdown(summary: Mapping[str, Any]) -> str:
    learned, rules = summary["detectors"]["learned"], summary["detectors"]["rules"]
    diff = summary.get("recall_difference_learned_minus_rules")
    targets = summary.get("targets", {})
    decon = summary.get("decontamination", {})
    near = summary["rasa_near_training"]
    hyper = summary.get("model", {}).get("hyperparameters") or {}
    lines = [
        "# Small talk from real users: learned detector against the phrase rules",
        "",
        "Question: how much real-user small talk does the shipped detector recognise, and how often does it",
        "answer a real question with a canned reply? Measured on sets used neither for fitting nor for",
        "selection (C and the confidence floor were chosen on a validation split of the training examples).",
        "",
        "    " + summary["command"],
        "",
        "## Headline",
        "",
        "| | learned | rules (old) | target |",
        "|---|---|---|---|",
        f"| recall, Rasa demo small talk | {_pct(learned['recall'])} | {_pct(rules['recall'])} | >= 85 % |",
        f"| answered with an accepted intent | {_pct(learned['intent_correct'])} | {_pct(rules['intent_correct'])} | |",
        f"| false positives, real requests | {_pct(learned['false_positives'], 2)} | {_pct(rules['false_positives'], 2)} | <= 0.3 % |",
        f"| Rasa off-topic requests (weather, time, \"what is Rasa\", \"who am I\") given a canned reply | {_pct(learned['off_topic_requests_canned'])} | {_pct(rules['off_topic_requests_canned'])} | |",
        f"| Rasa \"I have a question\" / \"I need help\" (no question yet) given a canned reply | {_pct(learned['help_without_a_question_canned'])} | {_pct(rules['help_without_a_question_canned'])} | |",
        f"| Rasa affirm/deny given the acknowledgement prompt | {_pct(learned['acknowledgements_prompted'])} | {_pct(rules['acknowledgements_prompted'])} | |",
        "",
        (f"Recall difference, learned minus rules (paired): {100 * diff['estimate']:+.1f} points "
         f"[{100 * diff['low']:+.1f}, {100 * diff['high']:+.1f}]." if diff else ""),
        "",
        f"Targets (learned): recall {'met' if targets.get('recall_met') else 'NOT met'}; false "
        f"positives {'met' if targets.get('false_positives_met') else 'NOT met'}.",
        "",
        "Off-topic requests are the closest the Rasa file comes to real questions phrased as chat; the",
        "learned detector's canned replies to them are listed below.",
        "",
        "## Method",
        "",
        f"- Training data decontaminated against the Rasa file ({decon.get('held_out_utterances', '?')} distinct "
        f"utterances, every kind): a training example is dropped when, after normalising (lower case, "
        f"punctuation and emoji stripped, whitespace collapsed), it equals a Rasa utterance, or their word "
        f"sets have a Jaccard index >= 0.6, or difflib's character ratio (either order) is >= 0.85. Removed: "
        f"{decon.get('removed', '?')} examples; {decon.get('kept', '?')} remain. Rasa records with a training "
        f"example equal or near to them after that: {near['hits']} of {near['n']}.",
        "- Question guard in front of the model: a question about a named thing other than the assistant "
        "(\"what does <X> do\", \"what is <X>\", \"who is <X>\", \"how does <X> work\", \"what can <X> do\", "
        "\"tell me about <X>\", \"explain <X>\") is a request; about the assistant (you, u, your, this bot, "
        "the assistant) or a chat phrase (\"what's up\", \"who is there\") the model decides.",
        "- Selection: C and the confidence floor on a validation split of the training examples only "
        f"(chosen: C={hyper.get('C')}, floor {hyper.get('min_confidence')}).",
        "",
        "## Recall per Rasa intent",
        "",
        "| Rasa intent | learned | rules |",
        "|---|---|---|",
    ]
    for intent in learned["recall_per_intent"]:
        lines.append(f"| {intent} | {_pct(learned['recall_per_intent'][intent])} | "
                     f"{_pct(rules['recall_per_intent'][intent])} |")
    lines += ["", "## False positives per source of real requests (`test` split)", "",
              "| source | learned | rules |", "|---|---|---|"]
    for source in learned["false_positives_per_source"]:
        lines.append(f"| {source} | {_pct(learned['false_positives_per_source'][source], 2)} | "
                     f"{_pct(rules['false_positives_per_source'][source], 2)} |")
    lines += ["", "Real requests the learned detector answered with a canned reply:", ""]
    lines += [f"- `{t}`" for t in learned["false_positive_examples"]] or ["- none"]
    lines += ["", "Rasa off-topic requests the learned detector answered with a canned reply:", ""]
    lines += [f"- `{t}`" for t in learned["off_topic_examples"]] or ["- none"]
    lines += ["", "Small talk the learned detector missed (first 60):", ""]
    lines += [f"- `{t}`" for t in learned["missed_examples"]] or ["- none"]
    lines += ["", "Files: `summary.json` (every figure), `records.jsonl.gz` (one line per utterance and "
              "detector; the figures recompute from it with `score`), `recall.png`.", ""]
    return "\n".join(lines)


def plot(summary: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    intents = list(summary["detectors"]["learned"]["recall_per_intent"])
    labels = [*intents, "ALL"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [4, 1]})
    width = 0.4
    for offset, detector in ((-width / 2, "learned"), (width / 2, "rules")):
        data = summary["detectors"][detector]
        cells = [*(data["recall_per_intent"][i] for i in intents), data["recall"]]
        values = [100 * c["estimate"] for c in cells]
        errors = [[100 * (c["estimate"] - (c["low"] if c["low"] is not None else c["estimate"])) for c in cells],
                  [100 * ((c["high"] if c["high"] is not None else c["estimate"]) - c["estimate"]) for c in cells]]
        left.bar([i + offset for i in range(len(labels))], values, width, yerr=errors, capsize=2, label=detector)
        fp = data["false_positives"]
        right.bar([offset], [100 * fp["estimate"]], width,
                  yerr=[[100 * (fp["estimate"] - fp["low"])], [100 * (fp["high"] - fp["estimate"])]],
                  capsize=3, label=detector)
    left.axhline(100 * TARGET_RECALL, color="grey", linestyle="--", linewidth=1, label="target 85 %")
    left.set_xticks(range(len(labels)), labels, rotation=35, ha="right", fontsize=8)
    left.set_ylabel("recall on Rasa demo small talk (%)")
    left.set_ylim(0, 105)
    left.legend(fontsize=8)
    right.axhline(100 * TARGET_FALSE_POSITIVES, color="grey", linestyle="--", linewidth=1, label="budget 0.3 %")
    right.set_xticks([-width / 2, width / 2], ["learned", "rules"])
    right.set_ylabel("real requests given a canned reply (%)")
    right.legend(fontsize=8)
    fig.suptitle("Small talk: recall per intent (95 % bootstrap) and false positives")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(data_dir: Path, out: Path, command: str) -> dict[str, Any]:
    from adaptive_rag.pinned import file_sha256
    from adaptive_rag.routing.small_talk import learned_intent, normalise, rule_intent
    from adaptive_rag.routing.small_talk_model import DEFAULT_MODEL, SmallTalkModel
    from adaptive_rag.training.small_talk import NearDuplicates, build_examples, held_out_texts

    model = SmallTalkModel.load(DEFAULT_MODEL)
    # The examples the shipped model was fitted on: decontaminated as `arag smalltalk train` does.
    rasa_texts = [r["text"] for r in load_rasa()]
    filtered = NearDuplicates(held_out_texts([RASA_FILE]))
    training = build_examples(data_dir, filtered)
    training_keys = {" | ".join(normalise(e.text)) for e in training}
    near_index = NearDuplicates(e.text for e in training)
    rows = utterances(data_dir, training_keys, normalise, lambda text: near_index.match(text) is not None)

    def learned(text: str) -> str | None:
        found = learned_intent(text, model)
        return found.intent if found else None

    def rules(text: str) -> str | None:
        found = rule_intent(text)
        return found.intent if found else None

    started = time.perf_counter()
    records = judge(rows, {"learned": learned, "rules": rules})
    seconds = time.perf_counter() - started
    summary = score(records)
    rasa_talk = [r for r in rows if r["set"] == "rasa-demo" and r["kind"] == SMALL_TALK]
    summary |= {
        "command": command,
        "rasa_near_training": {"hits": sum(r["in_training"] for r in rows if r["set"] == "rasa-demo"),
                               "n": sum(r["set"] == "rasa-demo" for r in rows)},
        "rasa_small_talk_near_training": {"hits": sum(r["in_training"] for r in rasa_talk), "n": len(rasa_talk)},
        "decontamination": {**(model.info.get("decontamination") or {}),
                            "kept": len(training), "removed_when_rebuilt": sum(filtered.removed.values()),
                            "rasa_records": len(rasa_texts)},
        "real_requests_in_training": sum(r["in_training"] for r in rows if r["set"] == "real-requests"),
        "model": {"file": str(DEFAULT_MODEL.relative_to(DEFAULT_MODEL.parents[2])), "sha256": file_sha256(DEFAULT_MODEL),
                  "hyperparameters": model.info.get("hyperparameters"),
                  "chosen_validation": model.info.get("chosen_validation")},
        "inputs": {"rasa_demo_nlu.jsonl": file_sha256(RASA_FILE)},
        "seconds_both_detectors": round(seconds, 2),
        "machine": platform.platform(),
    }
    out.mkdir(parents=True, exist_ok=True)
    with gzip.open(out / "records.jsonl.gz", "wt", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(asdict(record), ensure_ascii=False) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "README.md").write_text(markdown(summary), encoding="utf-8")
    plot(summary, out / "recall.png")
    return summary


def read_records(path: Path) -> list[Record]:
    """The records of a report, to recompute its figures (`score(read_records(...))`)."""
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [Record(**{**row, "accepted": tuple(row["accepted"])}) for row in map(json.loads, handle)]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=Path("reports/small_talk"))
    args = parser.parse_args(argv)
    command = "python -m lab.experiments.small_talk " + shlex.join(sys.argv[1:] if argv is None else argv)
    summary = run(args.data_dir, args.out, command.strip())
    for detector, data in summary["detectors"].items():
        print(f"{detector:8s} recall {_pct(data['recall'])}  "
              f"false positives {_pct(data['false_positives'], 2)}")
    print(f"wrote {args.out}/README.md, summary.json, records.jsonl.gz, recall.png")


if __name__ == "__main__":
    main()
