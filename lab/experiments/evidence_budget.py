"""Does tier B answer faster with evidence cut to a token budget, and as well? (`test`, read once)

Tier B as served (`strategies.single_step`: top 5, the knowledge base's own abstention threshold,
one reader call) runs twice on each `test` question, in one run on one llama-server, side by side:
`whole` (the passages whole, each cut to 400 characters: today's prompt) and `budget` (only their
best sentences up to `--budget` tokens, `evidence.sentences`, the budget chosen on `train` by
`lab.experiments.evidence_budget_curve`). The order alternates per question (whole first on odd
questions, budget first on even ones), so neither way profits more from the server's prompt cache
(the static prefix is cached for both, as in serving) or from a quiet moment on the shared machine.

Questions: the support suite's in-KB single questions on `test` (the demo help centre, whose B
answers the issue's target is about, and the COVID FAQ), support style; and the benchmark's
single-hop `test` questions (SQuAD, NQ, TriviaQA), short style. Per answer: wall time of the whole
strategy (retrieval, selection, the reader), prompt tokens and the tokens the server prefilled (not
from its cache: llama-server's `timings.prompt_n`), F1 against the gold answer, and a hit: support,
the reply cites a gold article; benchmark, a gold answer occurs in the reply. Figures: p50 latency
of each way and their ratio (with a bootstrap interval over questions), paired differences of F1
and hit (budget - whole) with paired bootstrap intervals, and the load average during the run (the
machine is shared: the ratio measured side by side is the figure, not the absolute times).

    python -m lab.experiments.evidence_budget --budget 120 --out reports/evidence_budget   # ~25 min on 2 cores

Writes `README.md`, `summary.json`, `answers.jsonl` (one record per question and way).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lab.harness.stack import unwind_on_stop_signals
from lab.harness.stats import median, paired_difference_interval, paired_percentile_ratio_interval

REPO = Path(__file__).resolve().parents[2]
WAYS = ("whole", "budget")
SUPPORT_KBS = ("help-centre", "covid-faq")
SUPPORT_KINDS = ("paraphrase", "faq", "question")
BENCHMARK = ("squad", "nq", "trivia")


@dataclass
class Question:
    suite: str  # support | benchmark
    source: str
    id: str
    question: str
    golds: list[str]
    gold_docs: list[str]


@dataclass
class Answer:
    suite: str
    source: str
    id: str
    way: str
    order: int  # 0: read first for its question, 1: second
    question: str
    answer: str
    answered: bool  # false: abstained before the reader (no reader call)
    seconds: float
    prompt_tokens: int
    prefilled_tokens: int | None
    completion_tokens: int
    f1: float
    hit: float
    load_1m: float


def questions(settings: Any, per_source: int, work: Path) -> tuple[list[Question], dict[str, Any]]:
    """`test` questions, at most `per_source` of each knowledge base and dataset (the help centre,
    the issue's target, twice as many), with each knowledge base's retriever and abstention gate."""
    from adaptive_rag.evaluation.datasets import interleaved, load_questions
    from adaptive_rag.evaluation.support_kbs import build_knowledge_base_suite
    from adaptive_rag.knowledge.calibration import calibrate
    from adaptive_rag.retrieval import open_retriever
    from adaptive_rag.retrieval.tantivy_index import TantivyRetriever
    from adaptive_rag.strategies.abstention import Abstention

    asked: list[Question] = []
    sources: dict[str, Any] = {}
    for name in SUPPORT_KBS:
        suite = build_knowledge_base_suite(name, settings)
        index = TantivyRetriever.build(work / name, suite.passages, title_boost=settings.title_boost)
        derived = calibrate(index, len(suite.passages))
        sources[name] = (index, Abstention(min_relevance=derived.threshold if derived else 0.0))
        picked = [q for q in suite.select("test") if q.kind in SUPPORT_KINDS and len(q.gold_groups) == 1]
        asked += [Question("support", name, q.id, q.query, list(q.gold_answers), list(q.gold_groups[0]))
                  for q in picked[:per_source * (2 if name == "help-centre" else 1)]]
    benchmark = open_retriever(settings)
    for dataset in BENCHMARK:
        sources[dataset] = (benchmark, Abstention())
        picked = interleaved(load_questions(settings.data_dir, [dataset], "test"))[:per_source]
        asked += [Question("benchmark", dataset, q.id, q.question, list(q.answers), []) for q in picked]
    return interleave(asked), sources


def interleave(asked: Sequence[Question]) -> list[Question]:
    """The sources mixed in proportion to their questions (each question placed at its fraction
    of its source), so a run stopped part way covers every source in the same shares."""
    by: dict[str, list[Question]] = {}
    for question in asked:
        by.setdefault(question.source, []).append(question)
    order = {source: rank for rank, source in enumerate(by)}
    placed = [((i + 0.5) / len(queue), order[source], question)
              for source, queue in by.items() for i, question in enumerate(queue)]
    return [question for *_, question in sorted(placed, key=lambda p: (p[0], p[1]))]


def timed_client(base_url: str) -> Any:
    """The service's OpenAI-compatible client, keeping the server's `timings` of its last reply."""
    from adaptive_rag.llm.openai_compat import OpenAICompatibleLLM

    class Timed(OpenAICompatibleLLM):
        last_timings: dict[str, Any] | None = None

        def _post_once(self, payload: dict) -> dict:
            body = super()._post_once(payload)
            self.last_timings = body.get("timings")
            return body

    return Timed(base_url, "default", timeout_s=600.0, prompt_style="chat")


def run(console: Any, budget: int, per_source: int, settings: Any,
        minutes: float) -> tuple[list[Answer], dict[str, Any]]:
    from adaptive_rag.contracts import AnswerStyle
    from adaptive_rag.evaluation.metrics import accuracy, f1_score
    from adaptive_rag.evaluation.support import doc_id_of
    from adaptive_rag.strategies import SingleStep
    from adaptive_rag.strategies.base import run_metered
    from adaptive_rag.strategies.single_step import cited
    from infra.local.llama_server import LlamaServerProcess

    answers: list[Answer] = []
    facts: dict[str, Any] = {"budget": budget, "reader": str(settings.reader), "top_k": settings.top_k,
                             "per_source": per_source, "minutes": minutes, "threads": 2, "parallel": 1,
                             "started": datetime.now(timezone.utc).isoformat(timespec="minutes"),
                             "load_at_start": os.getloadavg(), "cpus": os.cpu_count(), "python": platform.python_version()}
    with tempfile.TemporaryDirectory(prefix="arag-evidence-budget-") as work:
        asked, sources = questions(settings, per_source, Path(work))
        with LlamaServerProcess(parallel=1, threads=2) as server:
            llm = timed_client(server.base_url)
            llm.chat([{"role": "user", "content": "hello"}], 4)  # the model's pages in memory
            deadline = time.monotonic() + 60 * minutes
            for number, question in enumerate(asked, 1):
                if time.monotonic() > deadline:
                    console.print(f"time limit: {number - 1} of {len(asked)} questions asked")
                    break
                retriever, gate = sources[question.source]
                style = AnswerStyle.SUPPORT if question.suite == "support" else AnswerStyle.SHORT
                ways = WAYS if number % 2 else tuple(reversed(WAYS))
                for order, way in enumerate(ways):
                    strategy = SingleStep(retriever, llm, top_k=settings.top_k, abstention=gate, style=style,
                                          evidence_tokens=budget if way == "budget" else None)
                    llm.last_timings = None
                    started = time.perf_counter()
                    result = run_metered(strategy, question.question)
                    seconds = time.perf_counter() - started
                    text = result.answer if result.answerable else ""
                    if question.suite == "support":
                        docs = {doc_id_of(result.passages[n - 1].id, result.passages[n - 1].doc_id)
                                for n in cited(text, result.passages)}
                        hit = float(bool(docs & set(question.gold_docs)))
                    else:
                        hit = accuracy(text, question.golds) if text else 0.0
                    timings = llm.last_timings or {}
                    answers.append(Answer(
                        question.suite, question.source, question.id, way, order, question.question, text,
                        result.usage.llm_calls > 0, seconds, result.usage.prompt_tokens,
                        timings.get("prompt_n"), result.usage.completion_tokens,
                        f1_score(text, question.golds) if text else 0.0, hit, os.getloadavg()[0]))
                pair = answers[-2:]
                console.print(f"{number:3}/{len(asked)} {question.source:11} " + "  ".join(
                    f"{a.way} {a.seconds:5.1f}s {a.prompt_tokens:4}t/{a.prefilled_tokens}p f1 {a.f1:.2f}"
                    for a in sorted(pair, key=lambda a: a.way, reverse=True)))
            llm.close()
    facts["load_at_end"] = os.getloadavg()
    facts["finished"] = datetime.now(timezone.utc).isoformat(timespec="minutes")
    return answers, facts


def summarize(answers: Sequence[Answer], facts: dict[str, Any]) -> dict[str, Any]:
    """Per group (all, support, help centre, benchmark): p50 latency of each way over the questions
    both answered with the reader, the ratio budget / whole with its interval, prompt tokens,
    and paired F1 / hit differences over every question."""
    groups = {"all": lambda a: True, "support": lambda a: a.suite == "support",
              "help-centre": lambda a: a.source == "help-centre", "covid-faq": lambda a: a.source == "covid-faq",
              "benchmark": lambda a: a.suite == "benchmark"}
    out: dict[str, Any] = {"facts": facts, "groups": {}}
    for name, keep in groups.items():
        mine = [a for a in answers if keep(a)]
        by = {way: {(a.source, a.id): a for a in mine if a.way == way} for way in WAYS}
        ids = sorted(set(by["whole"]) & set(by["budget"]))
        if not ids:
            continue
        read = [i for i in ids if by["whole"][i].answered and by["budget"][i].answered]
        cell: dict[str, Any] = {"n": len(ids), "n_read": len(read)}
        for way in WAYS:
            rows = [by[way][i] for i in read]
            cell[way] = {
                "p50_s": median([r.seconds for r in rows]),
                "prompt_tokens_p50": median([r.prompt_tokens for r in rows]),
                "prefilled_tokens_p50": median([r.prefilled_tokens for r in rows if r.prefilled_tokens is not None]),
                "completion_tokens_p50": median([r.completion_tokens for r in rows]),
                "f1": sum(by[way][i].f1 for i in ids) / len(ids),
                "hit": sum(by[way][i].hit for i in ids) / len(ids),
            }
        if len(read) >= 2:
            ratio = paired_percentile_ratio_interval([by["budget"][i].seconds for i in read],
                                                     [by["whole"][i].seconds for i in read], 50)
            cell["p50_ratio"] = asdict(ratio) if ratio else None
        for metric in ("f1", "hit"):
            diff = paired_difference_interval([getattr(by["whole"][i], metric) for i in ids],
                                              [getattr(by["budget"][i], metric) for i in ids])
            cell[f"{metric}_diff"] = asdict(diff) if diff else None
        out["groups"][name] = cell
    return out


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def interval(cell: dict[str, Any] | None, scale: float = 1.0, digits: int = 2, sign: bool = False) -> str:
    if not cell:
        return "-"
    spec = f"{'+' if sign else ''}.{digits}f"
    return (f"{format(cell['estimate'] * scale, spec)} [{format(cell['low'] * scale, spec)}, "
            f"{format(cell['high'] * scale, spec)}]")


def train_section(out: Path) -> list[str]:
    """How the budget was chosen on `train` (`evidence_budget_curve`'s files), when they are here."""
    lines: list[str] = []
    curve_file, llm_file = out / "curve.json", out / "train_llm.json"
    if curve_file.is_file():
        from adaptive_rag.evidence.sentences import CONTEXT_WEIGHT

        rows = json.loads(curve_file.read_text())["rows"]
        lines += ["", "## Choosing the budget on `train`", "",
                  f"Retrieval only, no LLM (`curve.png`; sentences weigh their passage's similarity x{CONTEXT_WEIGHT:g}, "
                  "the weight of the best curve): evidence prompt tokens (the reader's tokenizer) and gold-answer "
                  "coverage (support: share of the gold answer's words in the evidence; benchmark: a gold answer "
                  "in it), and for support the share whose gold article still gives the reader a sentence.", "",
                  "| budget | support tokens | support coverage | support gold article kept | benchmark tokens | benchmark coverage |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for budget in sorted({r["budget"] for r in rows}):
            pick = {r["suite"]: r for r in rows if r["budget"] == budget
                    and (r["context"] is None or abs(r["context"] - CONTEXT_WEIGHT) < 1e-9)}
            sup, ben = pick.get("support"), pick.get("benchmark")
            if not sup or not ben:
                continue
            lines.append(f"| {'whole passages' if budget == 0 else budget} | {sup['tokens']['mean']:.0f} | "
                         f"{sup['coverage']['mean']:.3f} | {sup['hit']['mean']:.3f} | {ben['tokens']['mean']:.0f} | "
                         f"{ben['coverage']['mean']:.3f} |")
    if llm_file.is_file():
        check = json.loads(llm_file.read_text())
        lines += ["", f"The reader on {check['per_suite']} `train` questions of each knowledge base and dataset "
                  "(`train_llm.json`; the ways of a question read at once, so no latency here): F1 and hit, and "
                  "the paired difference to whole passages.", "",
                  "| questions | budget | n | prompt tokens p50 | F1 | F1 diff [95 % CI] | hit | hit diff [95 % CI] |",
                  "| --- | --- | ---: | ---: | ---: | --- | ---: | --- |"]
        for suite in ("support", "benchmark", "all"):
            cell = check.get(suite)
            if not cell:
                continue
            for key in ["whole", *(str(b) for b in check["budgets"])]:
                row = cell[key]
                lines.append(f"| {suite} | {key} | {cell['n']} | {fmt(row['prompt_tokens_p50'], 0)} | {row['f1']:.3f} | "
                             f"{interval(row.get('f1_diff'), 1, 3, True)} | {row['hit']:.3f} | "
                             f"{interval(row.get('hit_diff'), 1, 3, True)} |")
    if lines:
        lines += ["", "    python -m lab.experiments.evidence_budget_curve --out reports/evidence_budget",
                  "    python -m lab.experiments.evidence_budget_curve --out reports/evidence_budget --llm 6 --check 120,160"]
    return lines


def render(out: Path, summary: dict[str, Any], command: str) -> None:
    facts = summary["facts"]
    lines = [
        "# Evidence budget: tier B's reader on the passages' best sentences, against whole passages",
        "",
        "**Question.** Does tier B answer faster when its reader gets only the retrieved passages' best "
        f"sentences up to {facts['budget']} tokens (`ARAG_EVIDENCE_TOKENS`), and as well as with the "
        "passages whole?",
        "",
        f"**Setup.** {facts['reader']} in one llama-server (1 slot, 2 threads, prompt cache on, as served), "
        f"2 cores shared with other agents' stacks; load average (1/5/15 min) {', '.join(f'{v:.1f}' for v in facts['load_at_start'])} "
        f"at the start, {', '.join(f'{v:.1f}' for v in facts['load_at_end'])} at the end "
        f"({facts['started']} - {facts['finished']} UTC). `test` split, read once: at most {facts['per_source']} "
        f"questions of each source (the help centre {2 * facts['per_source']}), interleaved by source, asked "
        f"until {facts['minutes']:g} minutes had passed; both ways on every question, the order alternating per question.",
        "",
        "| questions | n (read) | p50 whole (s) | p50 budget (s) | ratio p50 [95 % CI] | prompt / prefilled tokens p50 (whole -> budget) | F1 whole -> budget | F1 diff [95 % CI] | hit whole -> budget | hit diff [95 % CI] |",
        "| --- | ---: | ---: | ---: | --- | --- | --- | --- | --- | --- |",
    ]
    for name, cell in summary["groups"].items():
        w, b = cell["whole"], cell["budget"]
        lines.append(
            f"| {name} | {cell['n']} ({cell['n_read']}) | {fmt(w['p50_s'])} | {fmt(b['p50_s'])} | "
            f"{interval(cell.get('p50_ratio'))} | {fmt(w['prompt_tokens_p50'], 0)} / {fmt(w['prefilled_tokens_p50'], 0)} -> "
            f"{fmt(b['prompt_tokens_p50'], 0)} / {fmt(b['prefilled_tokens_p50'], 0)} | {w['f1']:.3f} -> {b['f1']:.3f} | "
            f"{interval(cell.get('f1_diff'), 1, 3, True)} | {w['hit']:.3f} -> {b['hit']:.3f} | "
            f"{interval(cell.get('hit_diff'), 1, 3, True)} |")
    reading = out / "reading.md"  # the hand-written reading of the figures, kept across renders
    if reading.is_file():
        lines += ["", reading.read_text().strip()]
    lines += train_section(out)
    lines += [
        "",
        "Hit: support, the reply cites a gold article ([n] of a passage of the gold document); benchmark, a "
        "gold answer occurs in the reply. Retrieval is the same for both ways (hit@5 is equal by "
        "construction). Prefilled: the prompt tokens the server computed (not served from its cache), "
        "llama-server's `timings.prompt_n`. n (read): questions both ways sent to the reader (the rest "
        "abstained on retrieval, both ways alike); latency is over those, F1 and hit over all n.",
        "",
        "    " + command,
        "",
        "Raw records: `answers.jsonl`; figures: `summary.json`. The budget's choice on `train`: "
        "`curve.png`, `curve.json`, `train_llm.json` (`lab.experiments.evidence_budget_curve`).",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    from adaptive_rag.settings import Settings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, required=True, help="evidence tokens (chosen on train)")
    parser.add_argument("--per-source", type=int, default=15,
                        help="test questions per knowledge base / dataset (the help centre: twice as many)")
    parser.add_argument("--minutes", type=float, default=30.0,
                        help="stop asking new questions after this long (they are interleaved by source)")
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "evidence_budget")
    parser.add_argument("--data-dir", type=Path, default=Path("/work/shared/data"))
    parser.add_argument("--index-dir", type=Path, default=REPO / "var" / "index",
                        help="the benchmark corpus's tantivy index (`arag index --benchmark`)")
    parser.add_argument("--render-only", action="store_true", help="summarise answers.jsonl again")
    args = parser.parse_args(argv)
    unwind_on_stop_signals()  # SIGTERM stops the llama-server started here too
    console = Console()
    args.out.mkdir(parents=True, exist_ok=True)
    command = (f"python -m lab.experiments.evidence_budget --budget {args.budget} --per-source {args.per_source} "
               f"--minutes {args.minutes:g}")
    if args.render_only:
        answers = [Answer(**json.loads(line)) for line in (args.out / "answers.jsonl").read_text().splitlines()]
        facts = json.loads((args.out / "summary.json").read_text())["facts"]
    else:
        settings = Settings(_env_file=None, data_dir=args.data_dir, index_dir=args.index_dir)
        answers, facts = run(console, args.budget, args.per_source, settings, args.minutes)
        (args.out / "answers.jsonl").write_text("".join(json.dumps(asdict(a)) + "\n" for a in answers))
    summary = summarize(answers, facts)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    render(args.out, summary, command)
    console.print((args.out / "README.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
