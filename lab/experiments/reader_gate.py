"""The reader's judgment as a second abstention gate: after the retrieval gate lets a question
through, does the reader catch the on-topic questions the knowledge base does not answer, without
refusing the ones it does?

The retrieval gate (`strategies.abstention`: the best passage's relevance below the knowledge
base's own threshold, `knowledge.calibration`) misses questions that share a knowledge base's rare
words ("Can I create purchase orders in Quillbill?"). For every question it lets through, two
reader gates are asked, over the same top-5 passages the reader reads:

- `support_abstain`: the abstaining support prompt (`prompts.single_step.SUPPORT_ABSTAIN`, what
  `ARAG_READER_ABSTAINS` turns on). The reply is the answer, so the gate costs no extra call; it
  abstains when the reply opens with the no-answer marker (`says_no_answer`). Only the first
  `SUPPORT_TOKENS` tokens are generated here: greedy decoding makes them the same first tokens as
  the full answer's, and the marker fits in them, so the decision is the product's.
- `judge`: a one-word yes/no judgment (`prompts.answerable.PROMPT`, one extra call of one token,
  the static part first so the server's prompt cache serves it). Abstains on "no"
  (`judge`), or, calibrated, when p(yes) is below a threshold picked on `train`
  (`judge@t`); p(yes) is what any OpenAI-compatible endpoint gives the product: the chosen token's
  probability, or one minus it when the token is "no".

Selection on `train` only, over the help centre and the COVID FAQ (the abstention experiment's
two knowledge bases); Quillbill (held out) is never used to choose. The rule is the abstention
experiment's: the highest mean of (caught - false) over the two knowledge bases, at most 5 % false
abstentions on each. Then `test` is read once, for all three knowledge bases.

Sampling (the 1.5B reader takes 5-30 s a call on two shared cores): every question a knowledge
base must abstain on, and the first `--in-kb` of its in-KB questions in a stable hash order (all
of them, whatever the retrieval gate does, so every row is measured on the same questions and the
sample is unbiased). The retrieval gate alone over the whole split is reported beside it.

Every reader reply is cached in `reader_records.jsonl`, keyed by (prompt, prompt version,
knowledge base, question): a re-run costs no call, and `--report-only` recomputes every figure
from the records. One shared `llama-server` (parallel 2, threads 2) serves the calls; `--llm-url`
reuses a running one.

    python -m lab.experiments.reader_gate --data-dir ../shared/data --out reports/reader_gate
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import shlex
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from adaptive_rag.contracts import AnswerStyle
from adaptive_rag.evaluation.support import (
    EXPECT_ABSTAIN,
    HIT_K,
    SMALL_TALK,
    SupportQuery,
    _rank,
)
from adaptive_rag.evaluation.support_kbs import build_knowledge_base_suite
from adaptive_rag.knowledge.calibration import calibrate
from adaptive_rag.prompts import Prompt
from adaptive_rag.prompts import answerable, single_step
from adaptive_rag.retrieval.relevance import relevance
from adaptive_rag.settings import Settings
from adaptive_rag.strategies.abstention import Abstention
from adaptive_rag.strategies.single_step import clean_support_answer, reader_evidence, says_no_answer
from lab.harness.stack import unwind_on_stop_signals
from lab.harness.stats import mean_interval, paired_difference_interval, percentile

SELECT_KBS = ("help-centre", "covid-faq")  # the knowledge bases a gate is chosen on (`train` only)
HELD_OUT = "quillbill"
KB_LABELS = {"covid-faq": "COVID FAQ", "help-centre": "demo help centre", "quillbill": "Quillbill (held out)"}
SUPPORT_TOKENS = 6  # enough for the marker "not in the passages" (4 tokens) after an "Answer:"
PROMPTS: dict[str, tuple[Prompt, int]] = {
    "support_abstain": (single_step.SUPPORT_ABSTAIN, SUPPORT_TOKENS),
    "judge": (answerable.PROMPT, answerable.PROMPT.max_tokens),
}
NEVER, RETRIEVAL, SUPPORT, JUDGE = "never", "retrieval", "retrieval+support_abstain", "retrieval+judge"
JUDGE_AT = "retrieval+judge@t"
SUPPORT_AT = "retrieval+support_abstain@t"
# The retrieval gate at a share of the knowledge base's threshold, then the calibrated marker: with
# the reader as a second gate, the retrieval gate may refuse fewer covered questions.
RELAXED = "retrieval@a+support_abstain@t"
RELAXED_SHARE = "retrieval share"  # the key of the share in `cuts`
DEFAULT_CUTS = {JUDGE_AT: 0.5, SUPPORT_AT: 0.0, RELAXED: 0.0, RELAXED_SHARE: 1.0}
SHARES = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
MAX_FALSE = 0.05
P_GRID = tuple(round(0.02 * i, 2) for i in range(1, 50))  # thresholds on a probability, picked on `train`
DEFAULT_IN_KB = 15


def prompt_version(prompt: Prompt, max_tokens: int, evidence_tokens: int = 0) -> str:
    """A short hash of everything that shapes the reply: a changed prompt gets new calls; the
    evidence budget is part of it (whole passages, 0, keep the plain hash)."""
    text = json.dumps([prompt.messages(passages="{passages}", question="{question}"), max_tokens,
                       list(prompt.chat_stop)])
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return f"{digest}-e{evidence_tokens}" if evidence_tokens else digest


@dataclass
class Question:
    """One sampled question of one knowledge base and what retrieval made of it."""

    kb: str
    id: str
    split: str
    kind: str
    question: str
    expect_abstain: bool
    relevance: float | None
    threshold: float
    retrieved: int
    retrieval_abstained: bool
    passages: str  # as the reader reads them (`reader_evidence`: whole, or the best sentences)

    def record(self) -> dict[str, Any]:
        row = asdict(self)
        row.pop("passages")
        return row


def sample(queries: Sequence[SupportQuery], split: str, in_kb: int | None) -> list[SupportQuery]:
    """Every question of `split` to abstain on, and the first `in_kb` in-KB ones in stable hash
    order (all with None); small talk never reaches the knowledge base."""
    chosen = sorted((q for q in queries if q.split == split and q.kind != SMALL_TALK), key=lambda q: (_rank(q.id), q.id))
    out = [q for q in chosen if q.kind in EXPECT_ABSTAIN]
    inside = [q for q in chosen if q.kind not in EXPECT_ABSTAIN]
    return out + (inside if in_kb is None else inside[:in_kb])


def retrieval_full_split(suite: Any, retriever: Any, gate: Abstention, split: str) -> dict[str, Any]:
    """The retrieval gate alone over every question of the split (what reports/support shows)."""
    caught, false = [], []
    for q in suite.queries:
        if q.split != split or q.kind == SMALL_TALK:
            continue
        value = float(gate.reason(retriever, q.query, retriever.search(q.query, HIT_K)) is not None)
        (caught if q.kind in EXPECT_ABSTAIN else false).append(value)
    return {"caught": _cell(caught), "false_abstain": _cell(false), "n_out": len(caught), "n_in": len(false)}


def build_questions(kb: str, settings: Settings, split: str, in_kb: int | None,
                    evidence_tokens: int = 0) -> tuple[list[Question], dict[str, Any]]:
    from adaptive_rag.retrieval.tantivy_index import TantivyRetriever

    suite = build_knowledge_base_suite(kb, settings)
    with tempfile.TemporaryDirectory(prefix="arag-reader-gate-") as work:
        retriever = TantivyRetriever.build(Path(work) / "index", suite.passages, title_boost=settings.title_boost)
        derived = calibrate(retriever, len(suite.passages))
        threshold = derived.threshold if derived else 0.0
        gate = Abstention(min_relevance=threshold)
        questions = []
        for q in sample(suite.queries, split, in_kb):
            found = retriever.search(q.query, max(HIT_K, settings.top_k))
            questions.append(Question(
                kb=kb, id=q.id, split=split, kind=q.kind, question=q.query,
                expect_abstain=q.kind in EXPECT_ABSTAIN,
                relevance=relevance(retriever, q.query, found) if found else None, threshold=threshold,
                retrieved=len(found), retrieval_abstained=gate.reason(retriever, q.query, found) is not None,
                passages=reader_evidence(q.query, found, evidence_tokens),
            ))
        full = retrieval_full_split(suite, retriever, gate, split)
    info = {"description": suite.description, "passages": len(suite.passages), "threshold": threshold,
            "calibration": derived.describe() if derived else "none", "retrieval_full_split": full}
    return questions, info


# --- the reader calls, cached ----------------------------------------------------------------------


class ReaderCache:
    """Reader replies keyed by (prompt, version, knowledge base, question), appended as JSON lines."""

    def __init__(self, path: Path, evidence_tokens: int = 0) -> None:
        self.path = path
        self.evidence_tokens = evidence_tokens
        self.records: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self._lock = threading.Lock()
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    row = json.loads(line)
                    self.records[self.key(row)] = row

    @staticmethod
    def key(row: Mapping[str, Any]) -> tuple[str, str, str, str]:
        return row["prompt"], row["version"], row["kb"], row["question"]

    def get(self, prompt: str, kb: str, question: str) -> dict[str, Any] | None:
        template, tokens = PROMPTS[prompt]
        return self.records.get((prompt, prompt_version(template, tokens, self.evidence_tokens), kb, question))

    def add(self, row: dict[str, Any]) -> None:
        with self._lock:
            self.records[self.key(row)] = row
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(row, sort_keys=True) + "\n")


def call_reader(client: httpx.Client, base_url: str, prompt_name: str, q: Question,
                evidence_tokens: int = 0) -> dict[str, Any]:
    """One chat completion as the product's OpenAI-compatible client sends it (greedy, the chat
    form the Qwen reader takes, log-probabilities on), plus the top-5 alternatives and the
    server's timings, which the product does not read."""
    template, tokens = PROMPTS[prompt_name]
    payload: dict[str, Any] = {
        "model": "arag-reader", "temperature": 0.0, "max_tokens": tokens, "logprobs": True, "top_logprobs": 5,
        "messages": template.messages(passages=q.passages, question=q.question),
    }
    if template.chat_stop:
        payload["stop"] = list(template.chat_stop)[:4]
    started = time.perf_counter()
    response = client.post(f"{base_url}/chat/completions", json=payload, timeout=600.0)
    seconds = time.perf_counter() - started
    response.raise_for_status()
    body = response.json()
    choice = body["choices"][0]
    content = (choice.get("logprobs") or {}).get("content") or []
    timings = body.get("timings") or {}
    usage = body.get("usage") or {}
    return {
        "prompt": prompt_name, "version": prompt_version(template, tokens, evidence_tokens), "kb": q.kb, "question": q.question,
        "question_id": q.id, "reply": choice["message"]["content"], "seconds": round(seconds, 3),
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
        "prompt_ms": timings.get("prompt_ms"), "predicted_ms": timings.get("predicted_ms"),
        "tokens": [{"token": t["token"], "logprob": t["logprob"],
                    "top": {a["token"]: a["logprob"] for a in t.get("top_logprobs", [])}} for t in content[:2]],
    }


def call_order(questions: Sequence[Question], ask_all: bool = False) -> list[Question]:
    """The questions the retrieval gate lets through (the only ones that need a call), taking
    turns between the groups (each knowledge base's questions to abstain on, its in-KB ones; each
    group in its stable hash order): a run cut short still holds a balanced sample."""
    seen: dict[tuple[str, bool], int] = {}
    ranked = []
    for position, q in enumerate(x for x in questions if (x.retrieved if ask_all else not x.retrieval_abstained)):
        group = (q.kb, q.expect_abstain)
        turn = seen.get(group, 0)
        seen[group] = turn + 1
        ranked.append((turn, position, q))
    return [q for _, _, q in sorted(ranked, key=lambda item: item[:2])]


def run_calls(questions: Sequence[Question], cache: ReaderCache, base_url: str, workers: int = 2,
              prompts: Sequence[str] = tuple(PROMPTS), ask_all: bool = False) -> int:
    """Ask the reader gates (`prompts`) about every question the retrieval gate lets through, or
    with `ask_all` about every question that retrieved a passage (cached ones skipped); returns
    the number of calls made."""
    todo = [(name, q) for q in questions if (q.retrieved if ask_all else not q.retrieval_abstained) for name in prompts
            if cache.get(name, q.kb, q.question) is None]
    if not todo:
        return 0
    done = 0
    started = time.monotonic()
    with httpx.Client() as client, ThreadPoolExecutor(max_workers=workers) as pool:
        for row in pool.map(lambda item: call_reader(client, base_url, item[0], item[1], cache.evidence_tokens), todo):
            cache.add(row)
            done += 1
            print(f"  [{done}/{len(todo)}] {time.monotonic() - started:6.0f} s  {row['prompt']:15s} "
                  f"{row['seconds']:5.1f} s  {row['reply'][:40]!r}  ({row['kb']}: {row['question'][:50]})", flush=True)
    return done


# --- the gates ---------------------------------------------------------------------------------------


def p_yes(record: Mapping[str, Any]) -> float:
    """p("yes") as an OpenAI-compatible endpoint reports it to the product: the chosen token's
    probability when it is "yes", one minus it otherwise."""
    if not record["tokens"]:
        return 0.0
    first = record["tokens"][0]
    chance = math.exp(first["logprob"])
    return chance if judge_says_yes(record["reply"]) else 1.0 - chance


def p_marker(record: Mapping[str, Any]) -> float:
    """The probability of the support reply's first token when the reply is the no-answer marker
    (what an OpenAI-compatible endpoint reports for the chosen token), else 0: the marker counts
    only when the reader is that sure of it."""
    if not record["tokens"] or not support_says_no(record["reply"]):
        return 0.0
    return math.exp(record["tokens"][0]["logprob"])


def judge_says_yes(reply: str) -> bool:
    return reply.strip().lower().startswith(answerable.YES)


def support_says_no(reply: str) -> bool:
    return says_no_answer(clean_support_answer(reply), AnswerStyle.SUPPORT)


ROWS_OF_PROMPT = {"support_abstain": (SUPPORT, SUPPORT_AT), "judge": (JUDGE, JUDGE_AT)}


def decisions(q: Mapping[str, Any], replies: Mapping[str, Mapping[str, Any]],
              cuts: Mapping[str, float] = DEFAULT_CUTS) -> dict[str, bool]:
    """Whether each row abstains on one question (`replies`: its reader records by prompt; a
    question the retrieval gate stops needs none, and a reader row whose prompt was not asked is
    left out)."""
    cuts = {**DEFAULT_CUTS, **cuts}
    never = q["retrieved"] == 0
    stopped = q["retrieval_abstained"]
    rows = {NEVER: never, RETRIEVAL: stopped}
    support = replies.get("support_abstain")
    relaxed_stop = never or (q["relevance"] or 0.0) < cuts[RELAXED_SHARE] * q["threshold"]
    if relaxed_stop:
        rows[RELAXED] = True
    elif support is not None:
        rows[RELAXED] = support_says_no(support["reply"]) and p_marker(support) >= cuts[RELAXED]
    if stopped:
        rows.update({SUPPORT: True, SUPPORT_AT: True, JUDGE: True, JUDGE_AT: True})
        return rows
    if "support_abstain" in replies:
        rows[SUPPORT] = support_says_no(replies["support_abstain"]["reply"])
        rows[SUPPORT_AT] = rows[SUPPORT] and p_marker(replies["support_abstain"]) >= cuts[SUPPORT_AT]
    if "judge" in replies:
        rows[JUDGE] = not judge_says_yes(replies["judge"]["reply"])
        rows[JUDGE_AT] = p_yes(replies["judge"]) < cuts[JUDGE_AT]
    return rows


def _cell(values: Sequence[float]) -> dict[str, Any] | None:
    found = mean_interval(list(values))
    if found is None:
        return {"estimate": values[0], "low": values[0], "high": values[0], "n": 1} if values else None
    return {"estimate": found.estimate, "low": found.low, "high": found.high, "n": len(values)}


def _diff(before: Sequence[float], after: Sequence[float]) -> dict[str, Any] | None:
    found = paired_difference_interval(list(before), list(after))
    return None if found is None else {"estimate": found.estimate, "low": found.low, "high": found.high}


def gate_table(questions: Sequence[Mapping[str, Any]], replies: Mapping[tuple[str, str], Mapping[str, Mapping[str, Any]]],
               cuts: Mapping[str, float], rows: Sequence[str]) -> dict[str, Any]:
    """Caught / false abstained per row with intervals, and each reader row's paired difference
    against the retrieval gate alone, over `questions` (in their order)."""
    per_row: dict[str, dict[bool, list[float]]] = {row: {True: [], False: []} for row in rows}
    for q in questions:
        made = decisions(q, replies.get((q["kb"], q["question"]), {}), cuts)
        for row in rows:
            per_row[row][q["expect_abstain"]].append(float(made[row]))
    table: dict[str, Any] = {"n_out": sum(q["expect_abstain"] for q in questions),
                             "n_in": sum(not q["expect_abstain"] for q in questions), "rows": {}}
    for row in rows:
        table["rows"][row] = {"caught": _cell(per_row[row][True]), "false_abstain": _cell(per_row[row][False])}
        if row not in (NEVER, RETRIEVAL):
            table["rows"][row]["vs_retrieval"] = {
                "caught": _diff(per_row[RETRIEVAL][True], per_row[row][True]),
                "false_abstain": _diff(per_row[RETRIEVAL][False], per_row[row][False]),
            }
    return table


def rates(questions: Sequence[Mapping[str, Any]], replies: Mapping, row: str, cuts: Mapping[str, float]) -> tuple[float, float]:
    out = [decisions(q, replies.get((q["kb"], q["question"]), {}), cuts)[row] for q in questions if q["expect_abstain"]]
    inside = [decisions(q, replies.get((q["kb"], q["question"]), {}), cuts)[row] for q in questions if not q["expect_abstain"]]
    return (sum(out) / len(out) if out else 0.0), (sum(inside) / len(inside) if inside else 0.0)


def select(train: Sequence[Mapping[str, Any]], replies: Mapping, asked: Sequence[str] = tuple(PROMPTS)) -> dict[str, Any]:
    """Every candidate gate on `train`, per selection knowledge base, and the pick: the highest
    mean (caught - false) over them with at most `MAX_FALSE` false abstentions on each (the first
    on a tie, candidates in order: retrieval alone first, so "nothing better" keeps it). Each
    calibrated row's threshold is its own best candidate by the same rule."""
    candidates: list[tuple[str, str, float | None]] = [(RETRIEVAL, RETRIEVAL, None), (SUPPORT, SUPPORT, None),
                                                       (JUDGE, JUDGE, None)]
    candidates += [(f"{SUPPORT_AT}: marker with p >= {t:g}", SUPPORT_AT, t) for t in P_GRID]
    candidates += [(f"{JUDGE_AT}: p(yes) < {t:g}", JUDGE_AT, t) for t in P_GRID]
    relaxed = all_asked(train, replies)
    if relaxed:
        candidates += [(f"{RELAXED}: relevance < {a:g} x threshold, or marker with p >= {t:g}", RELAXED, (a, t))
                       for a in SHARES for t in P_GRID]
    available = {RETRIEVAL, *(row for name in asked for row in ROWS_OF_PROMPT[name]), *([RELAXED] if relaxed else [])}
    table = []
    for name, row, t in (c for c in candidates if c[1] in available):
        cuts = {**DEFAULT_CUTS, **({row: t} if t is not None else {})}
        if row == RELAXED:
            cuts.update({RELAXED_SHARE: t[0], RELAXED: t[1]})
        cells = {kb: rates([q for q in train if q["kb"] == kb], replies, row, cuts) for kb in SELECT_KBS}
        table.append({"candidate": name, "row": row, "threshold": t, "cells": cells,
                      "mean_j": sum(c - f for c, f in cells.values()) / len(cells)})
    allowed = [c for c in table if all(f <= MAX_FALSE for _, f in c["cells"].values())]
    best = max(allowed, key=lambda c: c["mean_j"]) if allowed else table[0]
    best["picked"] = True
    cuts = dict(DEFAULT_CUTS)
    for row in (SUPPORT_AT, JUDGE_AT, RELAXED):
        mine = [c for c in allowed if c["row"] == row]
        if mine:
            cuts[row] = max(mine, key=lambda c: c["mean_j"])["threshold"]
    if isinstance(cuts[RELAXED], tuple):
        cuts[RELAXED_SHARE], cuts[RELAXED] = cuts[RELAXED]
    return {"table": table, "picked": best["candidate"], "picked_row": best["row"], "cuts": cuts}


def all_asked(questions: Sequence[Mapping[str, Any]], replies: Mapping) -> bool:
    """Whether every question that retrieved a passage has a support reply (an `--ask-all` run):
    only then can the retrieval gate's threshold be relaxed."""
    return bool(questions) and all("support_abstain" in replies.get((q["kb"], q["question"]), {})
                                   for q in questions if q["retrieved"])


def timing(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    rows = list(records)
    secs = [r["seconds"] for r in rows]
    return {"calls": len(rows), "mean_s": sum(secs) / len(secs) if secs else None, "p50_s": percentile(secs, 50),
            "p95_s": percentile(secs, 95),
            "prompt_tokens_mean": sum(r["prompt_tokens"] or 0 for r in rows) / len(rows) if rows else None,
            "cached_tokens_mean": sum(r["cached_tokens"] or 0 for r in rows) / len(rows) if rows else None,
            "prompt_ms_mean": sum(r["prompt_ms"] or 0 for r in rows) / len(rows) if rows else None,
            "predicted_ms_mean": sum(r["predicted_ms"] or 0 for r in rows) / len(rows) if rows else None}


# --- the report -----------------------------------------------------------------------------------------

ROWS = (NEVER, RETRIEVAL, SUPPORT, SUPPORT_AT, JUDGE, JUDGE_AT)


def _pct(cell: Mapping[str, Any] | None) -> str:
    if not cell:
        return "-"
    return f"{100 * cell['estimate']:.1f} % [{100 * cell['low']:.1f}, {100 * cell['high']:.1f}]"


def _pts(cell: Mapping[str, Any] | None) -> str:
    if not cell:
        return "-"
    return f"{100 * cell['estimate']:+.1f} [{100 * cell['low']:+.1f}, {100 * cell['high']:+.1f}]"


def row_label(row: str, cuts: Mapping[str, float]) -> str:
    if row == JUDGE_AT:
        return f"retrieval+judge, p(yes) < {cuts[row]:g}"
    if row == SUPPORT_AT:
        return f"retrieval+support_abstain, marker p >= {cuts[row]:g}"
    if row == RELAXED:
        return f"retrieval at {cuts[RELAXED_SHARE]:g} x threshold + support_abstain, marker p >= {cuts[row]:g}"
    return row


def summarise(questions: Sequence[Mapping[str, Any]], records: Sequence[Mapping[str, Any]], kb_info: Mapping[str, Any],
              meta: Mapping[str, Any]) -> dict[str, Any]:
    """Every figure of the report from the question records and the reader records."""
    evidence = int(meta.get("evidence_tokens") or 0)
    versions = {name: prompt_version(template, tokens, evidence) for name, (template, tokens) in PROMPTS.items()}
    replies: dict[tuple[str, str], dict[str, Mapping[str, Any]]] = {}
    for r in records:
        if r["version"] == versions[r["prompt"]]:
            replies.setdefault((r["kb"], r["question"]), {})[r["prompt"]] = r
    # The prompts asked on a split (`--test-prompts` may leave one out); a question that passed
    # the retrieval gate without a reply to each of them (a run stopped part-way) is left out, and counted.
    asked = {split: [name for name in PROMPTS if any(r["prompt"] == name for q in questions if q["split"] == split
                                                      for r in [replies.get((q["kb"], q["question"]), {}).get(name)] if r)]
             for split in ("train", "test")}
    missing = [q for q in questions if not q["retrieval_abstained"]
               and not set(asked[q["split"]]) <= set(replies.get((q["kb"], q["question"]), {}))]
    questions = [q for q in questions if q not in missing]
    train = [q for q in questions if q["split"] == "train"]
    test = [q for q in questions if q["split"] == "test"]
    selection = select(train, replies, asked["train"])
    cuts = selection["cuts"]
    out: dict[str, Any] = {"meta": dict(meta), "prompt_versions": versions, "selection": selection,
                           "cuts": cuts, "splits": {},
                           "questions_without_replies": len(missing), "prompts_asked": asked}
    for split, chosen in (("train", train), ("test", test)):
        per_kb = {}
        for kb in dict.fromkeys(q["kb"] for q in chosen):
            mine = [q for q in chosen if q["kb"] == kb]
            passed = [q for q in mine if not q["retrieval_abstained"]]
            rows = (NEVER, RETRIEVAL, *(row for name in asked[split] for row in ROWS_OF_PROMPT[name]),
                    *([RELAXED] if all_asked(mine, replies) else []))
            unsure = [p_marker(r) < cuts[SUPPORT_AT] for q in passed
                      for r in [replies.get((q["kb"], q["question"]), {}).get("support_abstain")]
                      if r and support_says_no(r["reply"])]
            per_kb[kb] = {**gate_table(mine, replies, cuts, rows),
                          "reasked": {"unsure_markers": sum(unsure), "passed": len(passed)},
                          "passed_retrieval": {"out": sum(q["expect_abstain"] for q in passed),
                                               "in": sum(not q["expect_abstain"] for q in passed)},
                          **kb_info.get(f"{kb}/{split}", {})}
        out["splits"][split] = per_kb
    used = {(q["kb"], q["question"]) for q in questions}
    calls = [r for r in records if (r["kb"], r["question"]) in used and r["version"] == versions[r["prompt"]]]
    out["timing"] = {name: timing(r for r in calls if r["prompt"] == name) for name in PROMPTS}
    return out


def markdown(summary: Mapping[str, Any]) -> str:
    meta = summary["meta"]
    t = summary["cuts"]
    lines = ["# Reader gate report", "", f"Command: `{meta['command']}`", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items() if k != "command"]
    lines += [f"- prompt versions: {summary['prompt_versions']}",
              f"- thresholds picked on train: judge abstains at p(yes) < {t[JUDGE_AT]:g}; the support marker counts "
              f"at p >= {t[SUPPORT_AT]:g}", f"- picked gate (train): {summary['selection']['picked']}"]
    for split in ("test", "train"):
        for kb, data in summary["splits"].get(split, {}).items():
            full = data.get("retrieval_full_split") or {}
            lines += ["", f"## {KB_LABELS.get(kb, kb)}, `{split}`", "",
                      f"Sample: {data['n_out']} questions to abstain on (all), {data['n_in']} in-KB (stable-hash sample); "
                      f"passed the retrieval gate (threshold {data.get('threshold', 0):g}): {data['passed_retrieval']['out']} to "
                      f"abstain on, {data['passed_retrieval']['in']} in-KB. Retrieval gate alone over the whole split: "
                      f"caught {_pct(full.get('caught'))} of {full.get('n_out')}, false {_pct(full.get('false_abstain'))} of {full.get('n_in')}.",
                      f"The calibrated support gate asks again (one more call) on {data.get('reasked', {}).get('unsure_markers', 0)} "
                      f"of the {data.get('reasked', {}).get('passed', 0)} questions that passed the retrieval gate (an unsure marker).",
                      "", "| row | caught | false abstained | caught vs retrieval (points) | false vs retrieval (points) |",
                      "| --- | ---: | ---: | ---: | ---: |"]
            for row, cell in data["rows"].items():
                vs = cell.get("vs_retrieval") or {}
                lines.append(f"| {row_label(row, t)} | {_pct(cell['caught'])} | {_pct(cell['false_abstain'])} | "
                             f"{_pts(vs.get('caught'))} | {_pts(vs.get('false_abstain'))} |")
    lines += ["", "## Selection on `train` (help centre and COVID FAQ)", "",
              "Caught / false abstained (%), on the `train` sample; picked: the highest mean of caught - false "
              f"with at most {100 * MAX_FALSE:g} % false on each.", "",
              "| candidate | " + " | ".join(SELECT_KBS) + " | mean caught - false |", "| --- |" + " ---: |" * (len(SELECT_KBS) + 1)]
    for row in summary["selection"]["table"]:
        name = f"**{row['candidate']}** (picked)" if row.get("picked") else row["candidate"]
        cells = [f"{100 * row['cells'][kb][0]:.1f} / {100 * row['cells'][kb][1]:.1f}" for kb in SELECT_KBS]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {100 * row['mean_j']:+.1f} |")
    lines += ["", "## Time per reader call (all calls of the run, 2 in flight on one llama-server)", "",
              "| prompt | calls | mean s | p50 s | p95 s | prompt tokens | of them cached | prompt ms | generation ms |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, cell in summary["timing"].items():
        if cell["calls"]:
            lines.append(f"| {name} | {cell['calls']} | {cell['mean_s']:.1f} | {cell['p50_s']:.1f} | {cell['p95_s']:.1f} | "
                         f"{cell['prompt_tokens_mean']:.0f} | {cell['cached_tokens_mean']:.0f} | {cell['prompt_ms_mean']:.0f} | "
                         f"{cell['predicted_ms_mean']:.0f} |")
    return "\n".join(lines) + "\n"


def plot(summary: Mapping[str, Any], path: Path, split: str = "test") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = summary["splits"].get(split, {})
    fig, axes = plt.subplots(1, max(1, len(data)), figsize=(4.6 * max(1, len(data)), 4.2), sharey=True)
    axes = list(axes) if len(data) > 1 else [axes]
    markers = {NEVER: "o", RETRIEVAL: "s", SUPPORT: "^", SUPPORT_AT: "<", JUDGE: "D", JUDGE_AT: "v", RELAXED: "*"}
    for ax, (kb, table) in zip(axes, data.items()):
        for row, cell in table["rows"].items():
            c, f = cell["caught"], cell["false_abstain"]
            if not c or not f:
                continue
            ax.errorbar(100 * f["estimate"], 100 * c["estimate"],
                        xerr=[[100 * (f["estimate"] - f["low"])], [100 * (f["high"] - f["estimate"])]],
                        yerr=[[100 * (c["estimate"] - c["low"])], [100 * (c["high"] - c["estimate"])]],
                        fmt=markers[row], capsize=3, label=row_label(row, summary["cuts"]))
        ax.axhline(85, color="grey", ls=":", lw=1)
        ax.axvline(5, color="grey", ls=":", lw=1)
        ax.set_title(f"{KB_LABELS.get(kb, kb)} ({split})")
        ax.set_xlabel("in-KB falsely abstained (%)")
        ax.set_xlim(-2, 60)
        ax.set_ylim(-2, 102)
    axes[0].set_ylabel("to-abstain questions caught (%)")
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle("Abstention gates: target caught >= 85 %, false <= 5 % (dotted)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- the run ------------------------------------------------------------------------------------------


def run(args: argparse.Namespace, command: str) -> dict[str, Any]:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    settings = Settings(_env_file=None, data_dir=args.data_dir)
    plan = [(kb, "train", args.in_kb) for kb in SELECT_KBS]
    if args.split == "test":
        test_in_kb = args.in_kb if args.test_in_kb is None else args.test_in_kb
        plan += [(kb, "test", test_in_kb) for kb in (*SELECT_KBS, HELD_OUT)]
    questions: list[Question] = []
    kb_info: dict[str, Any] = {}
    for kb, split, n in plan:
        mine, info = build_questions(kb, settings, split, n, args.evidence_tokens)
        questions += mine
        kb_info[f"{kb}/{split}"] = info
    cache = ReaderCache(out / "reader_records.jsonl", args.evidence_tokens)
    if not args.report_only:
        server = None
        base_url = args.llm_url
        try:
            if base_url is None:
                from infra.local.llama_server import LlamaServerProcess

                server = LlamaServerProcess(args.model, parallel=2, threads=2).start()
                base_url = server.base_url
            for split in ("train", "test"):  # train first: `test` read after selection
                chosen = args.train_prompts if split == "train" else args.test_prompts
                made = run_calls(call_order([q for q in questions if q.split == split], args.ask_all), cache,
                                 base_url.rstrip("/"), prompts=chosen, ask_all=args.ask_all)
                print(f"{split}: {made} reader calls", flush=True)
        finally:
            if server is not None:
                server.stop()
    rows = [q.record() for q in questions]
    with (out / "questions.jsonl").open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, sort_keys=True) + "\n")
    meta = {
        "command": command, "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {platform.python_version()}",
        "reader": "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (the default reader), one llama-server, parallel 2, threads 2, chat form",
        "retriever": f"embedded tantivy, title boost {settings.title_boost:g}, top {max(HIT_K, settings.top_k)}",
        "sample": f"every question to abstain on; the first {args.in_kb} (train) and "
                  f"{args.in_kb if args.test_in_kb is None else args.test_in_kb} (test) in-KB questions per knowledge base "
                  "in a stable hash order",
        "support_abstain": f"prompts.single_step.SUPPORT_ABSTAIN, first {SUPPORT_TOKENS} tokens (the decision; no extra call)",
        "evidence_tokens": args.evidence_tokens,
        "evidence": (f"the passages' best sentences up to {args.evidence_tokens} tokens (`strategies.single_step.reader_evidence`, "
                     "what tier B's reader reads by default)" if args.evidence_tokens else "the top passages whole"),
        "judge": "prompts.answerable.PROMPT, 1 token, one extra call",
    }
    summary = summarise(rows, list(cache.records.values()), kb_info, meta)
    (out / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    (out / "report.md").write_text(markdown(summary), encoding="utf-8")
    plot(summary, out / "reader_gate.png", "test" if args.split == "test" else "train")
    return summary


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=Path("reports/reader_gate"))
    parser.add_argument("--split", choices=("train", "test"), default="test",
                        help="train: selection only; test: selection, then every knowledge base's test sample")
    parser.add_argument("--in-kb", type=int, default=DEFAULT_IN_KB, help="in-KB questions sampled per knowledge base and split")
    parser.add_argument("--test-in-kb", type=int, default=None, help="the same on `test` (default: --in-kb)")
    parser.add_argument("--test-prompts", type=lambda text: tuple(t.strip() for t in text.split(",") if t.strip()),
                        default=tuple(PROMPTS), help="reader gates asked on `test` (default: both)")
    parser.add_argument("--train-prompts", type=lambda text: tuple(t.strip() for t in text.split(",") if t.strip()),
                        default=tuple(PROMPTS), help="reader gates asked on `train` (default: both)")
    parser.add_argument("--ask-all", action="store_true",
                        help="ask the reader about every question that retrieved a passage, not only those the "
                             "retrieval gate lets through: measures the retrieval gate at a share of its threshold")
    parser.add_argument("--evidence-tokens", type=int, default=0,
                        help="what the reader reads: 0 the passages whole, N their best sentences up to N tokens "
                             "(the product's ARAG_EVIDENCE_TOKENS)")
    parser.add_argument("--llm-url", default=None, help="a running llama-server's /v1 URL (default: start one)")
    parser.add_argument("--model", type=Path, default=None, help="GGUF (default: the configured reader)")
    parser.add_argument("--report-only", action="store_true", help="no reader call: recompute from the records")
    args = parser.parse_args(argv)
    unwind_on_stop_signals()  # SIGTERM stops the llama-server started here too
    command = "python -m lab.experiments.reader_gate " + shlex.join(sys.argv[1:] if argv is None else argv)
    summary = run(args, command.strip())
    for split, per_kb in summary["splits"].items():
        for kb, data in per_kb.items():
            for row, cell in data["rows"].items():
                print(f"{split:5s} {kb:12s} {row_label(row, summary['cuts']):44s} caught {_pct(cell['caught'])}  "
                      f"false {_pct(cell['false_abstain'])}")
    print(f"picked on train: {summary['selection']['picked']}; wrote {args.out}")


if __name__ == "__main__":
    main()
