"""Does the shipped router, priced on time for a budget, hold it on `test` and still beat always B?

The router's own decision sends about 70 % of always C's time. `arag routers fit-words
--time-budget 0.6` prices time (`adaptive_rag.training.time_price`: chosen out of fold on the
`train` labels with every tier's outcome) and `arag model ship` serves the price with the router
(`thresholds.json`, applied by `adaptive_rag.routing.policy`). This replays both routers over an
evaluation's recorded `test` outcomes (no reader call) through the served policy:

    arag routers fit-words --labels-file models/router/labels.jsonl --time-budget 0.6 --out var/router-priced
    python -m lab.experiments.time_budget --data-dir ../shared/data --priced var/router-priced/router.json

Rows: always B, always C, the dataset-identity rule, the shipped router (its argmax) and the priced
router; F1 (each dataset weighing the same) and its paired difference to always B, routed time as a
share of always C's, both with 95 % bootstrap intervals. The plot: F1 gain over always B against time
share for every price of the grid, out of fold on `train` and on `test` (the `test` curve is
descriptive: the price served is the one chosen on `train`, marked on both).

Writes README.md, summary.json, records.jsonl.gz (per `test` question: each row's tier, F1 and
seconds) and price_curve.png to `--out`.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from adaptive_rag.contracts import TIER_VALUES
from adaptive_rag.evaluation.bootstrap import difference_interval, mean_interval, ratio_interval
from adaptive_rag.evaluation.datasets import dataset_tier, limit_per_dataset, load_questions
from adaptive_rag.evaluation.runner import Outcome, load_outcomes
from adaptive_rag.routing.policy import PolicyThresholds, RoutingPolicy
from adaptive_rag.training.bag_of_words import BagOfWordsRouter, served_thresholds
from lab.harness.records import write_summary_and_records

TIER_STRATEGIES = {"A": "no_retrieval", "B": "single_step", "C": "evidence"}
ROWS = ("always B", "always C", "dataset-identity rule", "shipped router")
Keyed = dict[tuple[str, str], float]


def priced_row(card: Mapping[str, Any]) -> str:
    """A priced router's row name: by the confidence its budget is held with (none: its estimate)."""
    confidence = card.get("confidence")
    return "priced router" if confidence is None else f"priced router ({confidence:.0%} bound)"


def same_weights(shipped: BagOfWordsRouter, priced: BagOfWordsRouter) -> bool:
    """The priced router is the shipped one with a price: the same vocabulary and weights."""
    return (shipped.vocabulary == priced.vocabulary and np.array_equal(shipped.token_weights, priced.token_weights)
            and np.array_equal(shipped.bias, priced.bias) and np.array_equal(shipped.length_weight,
                                                                             priced.length_weight))


def routes(router: BagOfWordsRouter, policy: RoutingPolicy, questions: Sequence[str]) -> list[str]:
    """The served decision per question: the router's probabilities through the policy."""
    return [policy.tier(list(map(float, row)))[0].value for row in router.probabilities(list(questions))]


def complete(questions: Sequence[Any], outcomes: Mapping[tuple[str, str, str], Outcome]) -> list[Any]:
    """The questions with every tier's outcome, in the order of the evaluation's records (the
    bootstrap draws by position, as `lab.results` does)."""
    first_seen: dict[tuple[str, str], int] = {}
    for dataset, question_id, _ in outcomes:
        first_seen.setdefault((dataset, question_id), len(first_seen))
    kept = [q for q in questions if all((q.dataset, q.id, TIER_STRATEGIES[t]) in outcomes for t in TIER_VALUES)]
    return sorted(kept, key=lambda q: first_seen[(q.dataset, q.id)])


def replay(shipped: BagOfWordsRouter, priced: Sequence[BagOfWordsRouter], questions: Sequence[Any],
           outcomes: Mapping[tuple[str, str, str], Outcome]) -> list[dict[str, Any]]:
    """Per `test` question with every tier's outcome (`complete`): each row's tier, F1 and seconds
    (one row per priced router, `priced_row`)."""
    kept = complete(questions, outcomes)
    texts = [q.question for q in kept]
    own = routes(shipped, RoutingPolicy(served_thresholds(shipped)), texts)
    paid = {priced_row(r.card["time_budget"]): routes(r, RoutingPolicy(served_thresholds(r)), texts)
            for r in priced}
    records = []
    for i, (question, own_tier) in enumerate(zip(kept, own)):
        rule = dataset_tier(question.dataset)
        tiers = {"always B": "B", "always C": "C", "dataset-identity rule": rule.value if rule is not None else "B",
                 "shipped router": own_tier, **{row: tiers_[i] for row, tiers_ in paid.items()}}
        record: dict[str, Any] = {"dataset": question.dataset, "question_id": question.id, "rows": {}}
        for name, tier in tiers.items():
            outcome = outcomes[(question.dataset, question.id, TIER_STRATEGIES[tier])]
            record["rows"][name] = {"tier": tier, "f1": outcome.f1, "seconds": outcome.seconds}
        records.append(record)
    return records


def _keyed(records: Sequence[Mapping[str, Any]], row: str, value: str) -> Keyed:
    return {(r["dataset"], r["question_id"]): float(r["rows"][row][value]) for r in records}


def summarise(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    always_b, always_c = _keyed(records, "always B", "f1"), _keyed(records, "always C", "seconds")
    found = {}
    for row in records[0]["rows"]:
        f1, seconds = _keyed(records, row, "f1"), _keyed(records, row, "seconds")
        found[row] = {
            "f1": mean_interval(f1).as_dict(),  # type: ignore[union-attr]
            "f1_minus_always_b": difference_interval(f1, always_b).as_dict(),  # type: ignore[union-attr]
            "time_share_of_always_c": ratio_interval(seconds, always_c).as_dict(),  # type: ignore[union-attr]
            "routed": {t: Counter(r["rows"][row]["tier"] for r in records).get(t, 0) for t in TIER_VALUES},
        }
    return found


def curve_on_test(priced: BagOfWordsRouter, questions: Sequence[Any], outcomes: Mapping[tuple[str, str, str], Outcome],
               prices: Sequence[float]) -> list[dict[str, float]]:
    """F1 gain over always B and time share on `test` for each price (descriptive only)."""
    kept = complete(questions, outcomes)
    texts = [q.question for q in kept]
    costs = tuple(priced.card["time_budget"]["tier_costs"])
    always_b = {(q.dataset, q.id): outcomes[(q.dataset, q.id, "single_step")].f1 for q in kept}
    always_c = {(q.dataset, q.id): outcomes[(q.dataset, q.id, "evidence")].seconds for q in kept}
    curve = []
    for price in prices:
        tiers = routes(priced, RoutingPolicy(PolicyThresholds(None, None, time_price=price,
                                                              tier_costs=costs)), texts)  # type: ignore[arg-type]
        chosen = {(q.dataset, q.id): outcomes[(q.dataset, q.id, TIER_STRATEGIES[t])] for q, t in zip(kept, tiers)}
        gain = difference_interval({k: o.f1 for k, o in chosen.items()}, always_b)
        share = ratio_interval({k: o.seconds for k, o in chosen.items()}, always_c)
        curve.append({"price": float(price), "f1_minus_always_b": gain.estimate,  # type: ignore[union-attr]
                      "time_share_of_c": share.estimate})  # type: ignore[union-attr]
    return curve


def plot(summary: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    priced = summary["time_budget"]
    train = priced["grid"]
    base_b = priced["out_of_fold"]["always_b_f1"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot([100 * g["time_share_of_c"] for g in train], [100 * (g["f1"] - base_b) for g in train],
            "o-", ms=3, color="tab:blue", label="train, out of fold (price chosen here)")
    test = summary["curve_on_test"]
    ax.plot([100 * g["time_share_of_c"] for g in test], [100 * g["f1_minus_always_b"] for g in test],
            "s-", ms=3, color="tab:orange", label="test (descriptive)")
    chosen_train = next(g for g in train if g["price"] == priced["price"])
    chosen_test = next(g for g in test if g["price"] == priced["price"])
    ax.plot(100 * chosen_train["time_share_of_c"], 100 * (chosen_train["f1"] - base_b), "*", ms=14,
            color="tab:blue", label=f"the served price ({priced['price']:g}) on train")
    ax.plot(100 * chosen_test["time_share_of_c"], 100 * chosen_test["f1_minus_always_b"], "*", ms=14,
            color="tab:orange", label="the same price on test")
    ax.axvline(100 * priced["budget"], color="grey", ls="--", lw=1, label=f"budget {priced['budget']:.0%}")
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xlabel("routed time, % of always C's")
    ax.set_ylabel("F1 minus always B (points)")
    ax.set_title("The shipped router under a price on time")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _signed(cell: Mapping[str, Any]) -> str:
    return f"{100 * cell['estimate']:+.1f} [{100 * cell['low']:+.1f}, {100 * cell['high']:+.1f}]"


def _share(cell: Mapping[str, Any]) -> str:
    return f"{100 * cell['estimate']:.0f} % [{100 * cell['low']:.0f}, {100 * cell['high']:.0f}]"


def _routed(row: Mapping[str, Any]) -> str:
    return "/".join(str(row["routed"][t]) for t in TIER_VALUES)


def _verdict(row: Mapping[str, Any], budget: float) -> str:
    held = row["time_share_of_always_c"]["estimate"] <= budget
    return ("holds the budget and beats always B" if held and row["f1_minus_always_b"]["low"] > 0 else
            "holds the budget but is not shown to beat always B" if held else
            "does not hold the budget")


def _choice(card: Mapping[str, Any]) -> str:
    oof = card["out_of_fold"]
    upper = "" if "time_share_upper" not in oof else f" (upper bound {100 * oof['time_share_upper']:.1f} %)"
    return (f"price {card['price']:g}: out of fold ({oof['n']} labels, 5 hash folds) F1 {100 * oof['f1']:.1f} "
            f"against always B's {100 * oof['always_b_f1']:.1f} at {100 * oof['time_share_of_c']:.1f} % of always "
            f"C's time{upper}")


def readme(summary: Mapping[str, Any]) -> str:
    rows, first = summary["test"], summary["time_budget"]
    priced = summary.get("priced") or [{"row": priced_row(first), "time_budget": first}]
    budget = float(first["budget"])
    sample = summary.get("sample", "the evaluation's `test` questions")
    answers = [f"**{p['row']}** {_verdict(rows[p['row']], budget)}: **{_signed(rows[p['row']]['f1_minus_always_b'])} "
               f"F1 over always B at {_share(rows[p['row']]['time_share_of_always_c'])} of always C's time** "
               f"({_routed(rows[p['row']])} routed A/B/C)" for p in priced]
    choices = [f"{p['row']}, {_choice(p['time_budget'])}" for p in priced]
    lines = [
        "# A time budget for the shipped router",
        "",
        f"**Question.** Priced on time to stay within {budget:.0%} of always C's time (the price chosen out of "
        "fold on `train`), does the shipped router hold that on `test`, and what F1 does it keep over always B? "
        f"Sample: {sample}.",
        "",
        "**Answer.** " + "; ".join(answers) + ". Unpriced, the shipped router: "
        f"{_signed(rows['shipped router']['f1_minus_always_b'])} at "
        f"{_share(rows['shipped router']['time_share_of_always_c'])}. A price fixed on `train` holds the budget "
        "only as well as the tiers' costs carry over: on the `train` labels B took "
        f"{100 * first['tier_costs'][1]:.0f} % of C's time, here always B takes "
        f"{_share(rows['always B']['time_share_of_always_c'])} of always C's. Always C itself: "
        f"{_signed(rows['always C']['f1_minus_always_b'])} over always B (a router gains over B only where C does).",
        "",
        f"**How measured.** {'; '.join(f'`{c}`' for c in summary['fit_commands'])}, then `{summary['command']}` "
        f"(no reader call: the routes are replayed over `{summary['eval']}`'s recorded outcomes, through the "
        "policy a served version runs). Chosen on `train` before these questions were read, tier costs A/B/C "
        f"{' / '.join(f'{c:.2f}' for c in first['tier_costs'])} of C's time: " + "; ".join(choices) + ". "
        "F1 with each dataset weighing the same; 95 % bootstrap intervals (2000 resamples, seed 0), "
        "paired with always B; time shares resampled jointly with always C's.",
        "",
        f"## `test` ({rows['always B']['f1']['n']} questions)",
        "",
        f"Questions with every tier's outcome, per dataset: {summary.get('per_dataset', '-')}"
        + ("" if "asked" not in summary else f" ({rows['always B']['f1']['n']} of the {summary['asked']} asked)") + ".",
        "",
        "| row | F1 | F1 minus always B | time vs always C | routed A/B/C |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, r in rows.items():
        lines.append(f"| {name} | {100 * r['f1']['estimate']:.1f} | {_signed(r['f1_minus_always_b'])} | "
                     f"{_share(r['time_share_of_always_c'])} | {_routed(r)} |")
    lines += ["", "![price curve](price_curve.png)", "",
              "**Records.** `records.jsonl.gz`: per `test` question each row's tier, F1 and seconds; "
              "`summary.json`: the table, the `train` choice with its whole price grid, and the `test` curve.", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--shipped", type=Path, default=Path("models/router/router.json"))
    parser.add_argument("--priced", type=Path, action="append",
                        help="the shipped router fitted again with --time-budget (repeatable: one row each; "
                             "default var/router-priced/router.json)")
    parser.add_argument("--eval", type=Path, default=Path("reports/eval-qwen-1.5b-t400"))
    parser.add_argument("--limit", type=int, default=100, help="test questions per dataset (the evaluation's)")
    parser.add_argument("--skip", type=int, default=0, help="test questions per dataset before them (the evaluation's)")
    parser.add_argument("--out", type=Path, default=Path("reports/time_budget"))
    args = parser.parse_args(argv)
    paths = args.priced or [Path("var/router-priced/router.json")]
    shipped, priced = BagOfWordsRouter.load(args.shipped), [BagOfWordsRouter.load(p) for p in paths]
    for path, router in zip(paths, priced):
        if "time_budget" not in router.card:
            parser.error(f"{path} carries no price: fit it with `arag routers fit-words --time-budget`")
        if not same_weights(shipped, router):
            parser.error(f"{path} is not {args.shipped} with a price: fit both from the same labels")
    outcomes = load_outcomes(args.eval / "results.jsonl.gz")
    questions = limit_per_dataset(load_questions(args.data_dir, split="test"), args.limit, args.skip)
    records = replay(shipped, priced, questions, outcomes)
    cards = [r.card["time_budget"] for r in priced]
    sample = (f"the evaluation's first {args.limit} questions per dataset" if not args.skip else
              f"questions {args.skip + 1}-{args.skip + args.limit} per dataset, never read by the earlier "
              "evaluation of the first ones, every tier timed side by side in one run")
    summary = {
        "command": "python -m lab.experiments.time_budget " + shlex.join(sys.argv[1:] if argv is None else argv),
        "fit_commands": [
            f"arag routers fit-words --labels-file models/router/labels.jsonl --time-budget {card['budget']:g}"
            + ("" if card.get("confidence") is None else f" --budget-confidence {card['confidence']:g}")
            + f" --out {path.parent}" for card, path in zip(cards, paths)],
        "eval": str(args.eval), "sample": sample, "shipped": str(args.shipped), "priced_paths": [str(p) for p in paths],
        "time_budget": cards[0], "priced": [{"row": priced_row(c), "time_budget": c} for c in cards],
        "asked": len(questions),
        "per_dataset": ", ".join(f"{d} {n}" for d, n in sorted(Counter(r["dataset"] for r in records).items())),
        "test": summarise(records),
        "curve_on_test": curve_on_test(priced[0], questions, outcomes, [g["price"] for g in cards[0]["grid"]]),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_summary_and_records(args.out, summary, records)
    plot(summary, args.out / "price_curve.png")
    (args.out / "README.md").write_text(readme(summary), encoding="utf-8")
    print(readme(summary))


if __name__ == "__main__":
    main()
