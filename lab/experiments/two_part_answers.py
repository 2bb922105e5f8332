"""Does tier C answer both parts of a two-part support question, and at what time against B?

A customer asks two things in one message ("Which plan is required for the Developer API, and what
is its rate limit?"). The service sends such a question to tier C. Three ways to answer it, side by
side on the same questions, the same retrieval and the same reader in one shared llama-server:

- `B`: single step over the whole question (top 5, one reader call): the baseline;
- `C whole`: decompose reading the whole question (a split call, up to 8 merged passages, one
  reader call): tier C before parts;
- `C parts`: tier C as served now (`strategies.parts`): each part read on its own over its own top 5,
  both parts at once on the server's slots, the replies joined.

Questions: every two-part question of the demo help centre (`demo/questions.json`, tier C) and of
the Quillbill help centre (the support suite's `two_pages`, Markdown pages held out from design).
All support style, each knowledge base's own abstention threshold (derived at import). Per answer:
wall time, tokens, and for each part of the gold answer (split at ";" in the gold, or the demo's
"X and Y") its token recall in the reply: a part counts as answered at recall >= 0.5. Nothing here
is tuned, so reading the held-out questions selects nothing.

    python -m lab.experiments.two_part_answers --out reports/two_part_answers   # ~20 minutes on 2 cores

Writes `README.md`, `summary.json`, `answers.jsonl` (one record per question and way) and
`parts.png`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lab.harness.stack import unwind_on_stop_signals
from lab.harness.stats import median, percentile_ratio_interval, wilson_interval

REPO = Path(__file__).resolve().parents[2]
DEMO_QUESTIONS = REPO / "demo" / "questions.json"
WAYS = ("B", "C whole", "C parts")
PART_RECALL = 0.5
_TOKEN = re.compile(r"\w+")


@dataclass
class Question:
    knowledge_base: str
    id: str
    question: str
    gold_parts: list[str]


@dataclass
class Reply:
    knowledge_base: str
    id: str
    way: str
    question: str
    answer: str
    answerable: bool
    seconds: float
    prompt_tokens: int
    completion_tokens: int
    llm_calls: int
    part_recall: list[float] = field(default_factory=list)

    @property
    def both_parts(self) -> bool:
        return all(r >= PART_RECALL for r in self.part_recall)


def tokens(text: str) -> list[str]:
    return [t.lower() for t in _TOKEN.findall(text)]


def recall(gold: str, answer: str) -> float:
    """The share of the gold part's tokens found in the answer (each token counted once)."""
    wanted = set(tokens(gold))
    return len(wanted & set(tokens(answer))) / len(wanted) if wanted else 0.0


def gold_parts(answer: str) -> list[str]:
    """The gold answer's parts: split at ";", else at the last " and " (the demo's "X and Y")."""
    if ";" in answer:
        return [p.strip() for p in answer.split(";") if p.strip()]
    if " and " in answer:
        first, _, second = answer.rpartition(" and ")
        return [first.strip(), second.strip()]
    return [answer]


def questions(settings: Any) -> dict[str, tuple[Any, list[Question]]]:
    """Per knowledge base: its suite (passages) and its two-part questions."""
    from adaptive_rag.evaluation.support_kbs import build_knowledge_base_suite

    demo_rows = [q for q in json.loads(DEMO_QUESTIONS.read_text()) if q.get("expected_tier") == "C"]
    demo = [Question("demo help centre", f"demo-{i}", q["question"], gold_parts(q["answer"]))
            for i, q in enumerate(demo_rows, 1)]
    quill_file = REPO / "adaptive_rag" / "evaluation" / "support_data" / "quillbill_questions.jsonl"
    quill = [Question("Quillbill", row["id"], row["question"], gold_parts(row["answer"]))
             for row in map(json.loads, quill_file.read_text().splitlines()) if row.get("kind") == "two_pages"]
    return {"help-centre": (build_knowledge_base_suite("help-centre", settings), demo),
            "quillbill": (build_knowledge_base_suite("quillbill", settings), quill)}


def run(console: Any, parallel: int, threads: int, limit: int | None) -> tuple[list[Reply], dict[str, Any]]:
    """Each way on a server of its own, started for it: no way reads from the prompt cache
    another way's prompts filled (the static prefix of its own prompts is cached, as in
    serving)."""
    from adaptive_rag.contracts import AnswerStyle
    from adaptive_rag.knowledge.calibration import calibrate
    from adaptive_rag.llm.openai_compat import OpenAICompatibleLLM
    from adaptive_rag.retrieval.tantivy_index import TantivyRetriever
    from adaptive_rag.settings import Settings
    from adaptive_rag.strategies import build_strategy
    from adaptive_rag.strategies.abstention import Abstention
    from adaptive_rag.strategies.base import run_metered
    from infra.local.llama_server import LlamaServerProcess

    replies: list[Reply] = []
    base = Settings(_env_file=None)
    facts: dict[str, Any] = {"parallel": parallel, "threads": threads, "reader": str(base.reader),
                             "top_k": base.top_k, "max_passages": base.max_passages}
    with tempfile.TemporaryDirectory(prefix="arag-two-parts-") as work:
        knowledge_bases = []
        for name, (suite, asked) in questions(base).items():
            index = TantivyRetriever.build(Path(work) / name, suite.passages, title_boost=base.title_boost)
            derived = calibrate(index, len(suite.passages))
            gate = Abstention(min_relevance=derived.threshold if derived else 0.0)
            facts[f"threshold {name}"] = gate.min_relevance
            knowledge_bases.append((index, gate, asked[:limit]))
        for way in WAYS:
            with LlamaServerProcess(parallel=parallel, threads=threads) as server:
                console.print(f"{way}: llama-server {server.base_url}, {parallel} slots, {threads} threads")
                llm = OpenAICompatibleLLM(server.base_url, "default", timeout_s=600.0, prompt_style="chat")
                settings = base.model_copy(update={"llm_base_url": server.base_url,
                                                   "answer_parts": way == "C parts"})
                name = "single_step" if way == "B" else "decompose"
                ask(llm, "hello", console)  # the model's pages in memory
                for index, gate, asked in knowledge_bases:
                    strategy = build_strategy(name, index, llm, settings, gate, AnswerStyle.SUPPORT)
                    for question in asked:
                        started = time.perf_counter()
                        result = run_metered(strategy, question.question)
                        seconds = time.perf_counter() - started
                        reply = Reply(question.knowledge_base, question.id, way, question.question, result.answer,
                                      result.answerable, seconds, result.usage.prompt_tokens,
                                      result.usage.completion_tokens, result.usage.llm_calls,
                                      [recall(part, result.answer) for part in question.gold_parts])
                        replies.append(reply)
                        console.print(f"  {question.id:10} {way:8} {seconds:6.1f} s  parts "
                                      f"{'/'.join(f'{r:.2f}' for r in reply.part_recall)}  {result.answer[:70]!r}")
                llm.close()
    return replies, facts


def ask(llm: Any, text: str, console: Any) -> None:
    started = time.perf_counter()
    llm.chat([{"role": "user", "content": text}], 4)
    console.print(f"  warm-up {time.perf_counter() - started:.1f} s")


def summarize(replies: Sequence[Reply], facts: dict[str, Any]) -> dict[str, Any]:
    ways: dict[str, Any] = {}
    for way in WAYS:
        mine = [r for r in replies if r.way == way]
        both = sum(r.both_parts for r in mine)
        low, high = wilson_interval(both, len(mine)) if mine else (0.0, 0.0)
        ways[way] = {
            "n": len(mine), "both_parts": both, "both_parts_share": both / len(mine) if mine else None,
            "both_parts_interval": [low, high],
            "median_s": median([r.seconds for r in mine]),
            "median_prompt_tokens": median([r.prompt_tokens for r in mine]),
            "median_llm_calls": median([r.llm_calls for r in mine]),
            "abstained": sum(not r.answerable for r in mine),
        }
    seconds = {way: {(r.knowledge_base, r.id): r.seconds for r in replies if r.way == way} for way in WAYS}
    keys = sorted(seconds["B"])
    ratios = {}
    for way in ("C whole", "C parts"):
        per_question = [seconds[way][k] / seconds["B"][k] for k in keys if k in seconds[way]]
        ratios[way] = {
            "median_ratio_to_b": median(per_question),
            "ratio_of_medians": (median(list(seconds[way].values())) or 0) / (median(list(seconds["B"].values())) or 1),
            "ratio_of_medians_interval": percentile_ratio_interval(list(seconds[way].values()),
                                                                   list(seconds["B"].values()), 50, 2000),
        }
    both = {way: {(r.knowledge_base, r.id): r.both_parts for r in replies if r.way == way} for way in WAYS}
    paired = {way: {"gained": sum(both[way].get(k, False) and not both["B"][k] for k in keys),
                    "lost": sum(both["B"][k] and not both[way].get(k, False) for k in keys)}
              for way in ("C whole", "C parts")}
    return {
        "question": "two-part support questions: both parts answered, and time against tier B",
        "paired_vs_b": paired,
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_average": os.getloadavg()},
        "setup": facts, "part_recall_threshold": PART_RECALL, "questions": len(keys),
        "ways": ways, "time_vs_b": ratios, "target_ratio": 2.2,
    }


def plot(replies: Sequence[Reply], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    shares = [sum(r.both_parts for r in replies if r.way == w) / max(1, sum(r.way == w for r in replies)) for w in WAYS]
    left.bar(WAYS, [100 * s for s in shares], color=["tab:grey", "tab:orange", "tab:green"])
    left.set_ylabel("replies with both parts (%)")
    left.set_ylim(0, 100)
    left.set_title("Both parts of the gold answer in the reply")
    right.boxplot([[r.seconds for r in replies if r.way == w] for w in WAYS], tick_labels=list(WAYS))
    right.set_ylabel("seconds per reply")
    right.set_title("Time per reply (one question at a time)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render(out: Path, summary: dict[str, Any]) -> None:
    ways, ratios = summary["ways"], summary["time_vs_b"]
    parts, whole, b = ways["C parts"], ways["C whole"], ways["B"]
    interval = ratios["C parts"]["ratio_of_medians_interval"]
    meets = ratios["C parts"]["ratio_of_medians"] <= summary["target_ratio"]
    lines = [
        "# Two-part support questions: both parts, and the time it takes",
        "",
        "**Question.** A customer asks two things in one message. Does tier C answer both, and how long",
        "does it take next to tier B?",
        "",
        f"**Answer.** Tier C as served now (each part read on its own, both at once on the server's slots)",
        f"answers both parts in **{parts['both_parts']} of {parts['n']}** replies "
        f"({100 * parts['both_parts_share']:.0f} %, [{100 * parts['both_parts_interval'][0]:.0f}, "
        f"{100 * parts['both_parts_interval'][1]:.0f}]), against {whole['both_parts']} of {whole['n']} for decompose reading",
        f"the whole question and {b['both_parts']} of {b['n']} for tier B. Its median time is "
        f"**{ratios['C parts']['ratio_of_medians']:.2f}x B's**"
        + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")
        + f" ({fmt(parts['median_s'])} s against {fmt(b['median_s'])} s; decompose on the whole question "
        f"{ratios['C whole']['ratio_of_medians']:.2f}x); the target was <= {summary['target_ratio']:g}x"
        + (": met." if meets else ": not met."),
        "",
        f"Paired with B on the same questions, reading by parts gains both parts on "
        f"{summary['paired_vs_b']['C parts']['gained']} and loses them on {summary['paired_vs_b']['C parts']['lost']}: "
        f"with {summary['questions']} questions that is not shown to be better than B (it needs more two-part",
        "questions); the time budget is what this run shows.",
        "",
        "| way | replies with both parts | median s | median prompt tokens | reader calls | abstained |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for way in WAYS:
        w = ways[way]
        lines.append(f"| {way} | {w['both_parts']} of {w['n']} | {fmt(w['median_s'])} | {fmt(w['median_prompt_tokens'], 0)} "
                     f"| {fmt(w['median_llm_calls'], 0)} | {w['abstained']} |")
    lines += [
        "",
        f"A part counts as answered when the reply holds at least {100 * summary['part_recall_threshold']:.0f} % of that",
        "part's gold tokens (the gold answer split at \";\", or the demo's \"X and Y\"). Intervals: Wilson for",
        "shares, bootstrap for the ratio of medians. Questions: the demo help centre's tier-C questions and",
        f"the Quillbill help centre's two-page questions ({summary['questions']} in all), support style, each",
        "knowledge base's own abstention threshold, one question at a time.",
        "",
        "![parts](parts.png)",
        "",
        "```bash",
        "python -m lab.experiments.two_part_answers --out reports/two_part_answers",
        "```",
        "",
        f"Setup: {summary['setup']}. Machine: {summary['machine']['cpus']} CPUs, load average at the end "
        f"{', '.join(f'{v:.2f}' for v in summary['machine']['load_average'])}; {summary['when']}.",
        "Raw records: `answers.jsonl`; figures: `summary.json`.",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "two_part_answers")
    parser.add_argument("--parallel", type=int, default=4, help="llama-server slots (the stack's default)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None, help="questions per knowledge base")
    parser.add_argument("--render-only", action="store_true", help="rewrite README.md from answers.jsonl")
    args = parser.parse_args(argv)
    unwind_on_stop_signals()  # SIGTERM stops the llama-server started here too
    console = Console()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.render_only:
        replies = [Reply(**row) for row in map(json.loads, (args.out / "answers.jsonl").read_text().splitlines())]
        facts = json.loads((args.out / "summary.json").read_text())["setup"]
    else:
        replies, facts = run(console, args.parallel, args.threads, args.limit)
        with (args.out / "answers.jsonl").open("w") as handle:
            for reply in replies:
                handle.write(json.dumps(asdict(reply)) + "\n")
    summary = summarize(replies, facts)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(replies, args.out / "parts.png")
    render(args.out, summary)
    console.print((args.out / "README.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
