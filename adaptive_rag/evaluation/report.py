"""Tables and plots from evaluation outcomes: per-dataset and averaged EM/F1/Acc/Steps/Time with
a bootstrap 95 % interval on every F1, time relative to single step, the claims (F1 differences
with paired intervals) and the routers' accuracy on the test labels; written as JSON,
markdown and a PNG plot."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from adaptive_rag.contracts import StrategyName, Tier
from adaptive_rag.evaluation.adaptive import DATASET_RULE, ORACLE, oracle_router
from adaptive_rag.evaluation.bootstrap import (
    DEFAULT_RESAMPLES, DEFAULT_SEED, Interval, bootstrap_mean, difference_interval, mean_interval,
    ratio_interval,
)
from adaptive_rag.evaluation.datasets import DATASETS, MULTI_HOP, Question
from adaptive_rag.evaluation.runner import Outcome

METRICS = ("em", "f1", "acc", "steps", "seconds")
AVERAGE = "average"


def oracle_outcomes(
    outcomes: Mapping[tuple[str, str, str], Outcome],
    questions: Iterable[Question],
    tiers: Sequence[str],
) -> list[Outcome]:
    """Per question, the outcome of the cheapest tier strategy that was correct.

    `tiers` lists the A, B, C strategies cheapest first. When none is correct the dataset-identity
    rule decides, as for the classifier's labels: single-hop -> B, multi-hop -> C. The outcomes
    keep their strategy's name (the report's oracle row is `adaptive.oracle_row`).
    """
    route = oracle_router(outcomes, tiers)
    chosen = []
    for question in questions:
        tier = route(question)
        if isinstance(tier, Tier):
            chosen.append(outcomes[(question.dataset, question.id, tiers[list(Tier).index(tier)])])
    return chosen


def summarise(rows: Mapping[str, Sequence[Outcome]]) -> dict[str, dict[str, dict[str, float]]]:
    """`{row: {dataset | 'average': {metric: value, 'n': count, 'relative_time': x}}}`.

    The average is the mean over datasets (each dataset weighs the same, as in the paper).
    Time is also given relative to the single-step row (= 1.00) when that row exists, on the
    row's own questions (`relative_time`).
    """
    table: dict[str, dict[str, dict[str, float]]] = {}
    for row, outcomes in rows.items():
        by_dataset: dict[str, list[Outcome]] = defaultdict(list)
        for outcome in outcomes:
            by_dataset[outcome.dataset].append(outcome)
        cells: dict[str, dict[str, float]] = {}
        for dataset in sorted(by_dataset, key=lambda d: DATASETS.index(d) if d in DATASETS else 99):
            group = by_dataset[dataset]
            cells[dataset] = {m: sum(getattr(o, m) for o in group) / len(group) for m in METRICS}
            cells[dataset]["n"] = len(group)
        if cells:
            cells[AVERAGE] = {
                m: sum(c[m] for c in cells.values()) / len(cells) for m in METRICS
            }
            cells[AVERAGE]["n"] = sum(c["n"] for c in list(cells.values())[:-1])
        table[row] = cells
    baseline = rows.get(StrategyName.SINGLE_STEP, ())
    for row, cells in table.items():
        ratios = relative_time(rows[row], baseline)
        for dataset, cell in cells.items():
            cell["relative_time"] = ratios.get(dataset)
    return table


def relative_time(outcomes: Iterable[Outcome], baseline: Iterable[Outcome]) -> dict[str, float | None]:
    """Per dataset (and averaged, each dataset weighing the same), the row's seconds over the
    baseline's on the questions both answered: a ratio of sums, so each question's own ratio
    counts by its weight. Pairing by question keeps the ratio true when the outcomes were run on
    machines of different speeds (each question's strategies run back to back on one) and when a
    row covers only a subset of the questions."""
    base = {(o.dataset, o.question_id): o.seconds for o in baseline}
    spent: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])  # row seconds, base seconds, n
    for outcome in outcomes:
        key = (outcome.dataset, outcome.question_id)
        if key in base:
            cell = spent[outcome.dataset]
            cell[0] += outcome.seconds
            cell[1] += base[key]
            cell[2] += 1
    ratios: dict[str, float | None] = {d: (row / ref if ref else None) for d, (row, ref, _) in spent.items()}
    if spent:
        # Mean seconds per dataset on both sides, so each dataset weighs the same.
        row_mean = sum(row / n for row, _, n in spent.values())
        ref_mean = sum(ref / n for _, ref, n in spent.values())
        ratios[AVERAGE] = row_mean / ref_mean if ref_mean else None
    return ratios


def add_intervals(
    table: dict[str, dict[str, dict[str, Any]]],
    rows: Mapping[str, Sequence[Outcome]],
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Add `f1_ci` ([low, high], bootstrap 95 %) to every cell of `table` (as made by `summarise`
    from `rows`); the average's interval is stratified by dataset like the average itself."""
    for row, outcomes in rows.items():
        values = f1_by_question(outcomes)
        for dataset, cell in table.get(row, {}).items():
            scoped = values if dataset == AVERAGE else {k: v for k, v in values.items() if k[0] == dataset}
            interval = mean_interval(scoped, resamples, seed)
            cell["f1_ci"] = [interval.low, interval.high] if interval else None
    return table


def f1_by_question(outcomes: Iterable[Outcome]) -> dict[tuple[str, str], float]:
    return {(o.dataset, o.question_id): o.f1 for o in outcomes}


def _f1_cell(cell: Mapping[str, Any]) -> str:
    interval = cell.get("f1_ci")
    text = f"{100 * cell['f1']:.1f}"
    return f"{text} [{100 * interval[0]:.1f}, {100 * interval[1]:.1f}]" if interval else text


def markdown(
    table: Mapping[str, Mapping[str, Mapping[str, Any]]],
    labels: Mapping[str, str] | None = None,
    datasets: Sequence[str] | None = None,
) -> str:
    """One markdown table per dataset and one for the average (or only `datasets`); F1 shows its
    bootstrap 95 % interval when the cells have one; rows are shown by their `labels`."""
    labels = labels or {}
    found = list(dict.fromkeys(d for cells in table.values() for d in cells))
    parts = []
    for dataset in (d for d in found if datasets is None or d in datasets):
        hop = "multi-hop" if dataset in MULTI_HOP else ("" if dataset == AVERAGE else "single-hop")
        parts.append(f"### {dataset} {f'({hop})' if hop else ''}".rstrip())
        parts.append("| row | n | EM | F1 | Acc | Steps | Time (s/q) | Time vs single |")
        parts.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for row, cells in table.items():
            if dataset in cells:
                c = cells[dataset]
                parts.append(
                    f"| {labels.get(row, row)} | {int(c['n'])} | {100 * c['em']:.1f} | {_f1_cell(c)} | "
                    f"{100 * c['acc']:.1f} | {c['steps']:.2f} | {c['seconds']:.2f} | "
                    f"{'-' if c['relative_time'] is None else format(c['relative_time'], '.2f')} |"
                )
        parts.append("")
    return "\n".join(parts)


# --- claims ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimSpec:
    """"Row `a` differs from row `b` in F1" on one dataset or on the average over datasets."""

    title: str
    a: str
    b: str
    scope: str = AVERAGE


def standard_claims(
    table: Mapping[str, Mapping[str, Mapping[str, Any]]],
    tiers: Sequence[str],
    routers: Sequence[str] = (),
    multi_step_rows: Sequence[str] = (),
    fixed_rows: Sequence[str] = (),
    labels: Mapping[str, str] | None = None,
) -> list[ClaimSpec]:
    """The comparisons the evaluation's conclusions rest on, among the rows present in `table`:
    each router vs always B and vs the dataset-identity rule, the oracle vs the best fixed
    strategy, each multi-step row vs single step on each multi-hop dataset, single step vs no
    retrieval."""
    labels = labels or {}
    no_retrieval, single, _ = tiers

    def name(row: str) -> str:
        return labels.get(row, row)

    specs = []
    for router in routers:
        specs.append(ClaimSpec(f"{name(router)} vs {name(single)}", router, single))
        if router != DATASET_RULE:
            specs.append(ClaimSpec(f"{name(router)} vs {name(DATASET_RULE)}", router, DATASET_RULE))
    best = best_fixed_row(table, fixed_rows)
    if best:
        specs.append(ClaimSpec(f"{name(ORACLE)} vs the best fixed strategy, {name(best)}", ORACLE, best))
    for dataset in (d for d in DATASETS if d in MULTI_HOP):
        for row in multi_step_rows:
            specs.append(ClaimSpec(f"{name(row)} vs {name(single)}", row, single, dataset))
    specs.append(ClaimSpec(f"{name(single)} vs {name(no_retrieval)}", single, no_retrieval))
    return [s for s in specs if s.scope in table.get(s.a, {}) and s.scope in table.get(s.b, {})]


def best_fixed_row(table: Mapping[str, Mapping[str, Mapping[str, Any]]], fixed_rows: Sequence[str]) -> str | None:
    """The fixed strategy with the highest average F1 (None when none has an average)."""
    fixed = [r for r in fixed_rows if AVERAGE in table.get(r, {})]
    return max(fixed, key=lambda r: table[r][AVERAGE]["f1"]) if fixed else None


def claims(
    specs: Sequence[ClaimSpec],
    rows: Mapping[str, Sequence[Outcome]],
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> list[dict[str, Any]]:
    """Each claim's F1 difference (a - b) on the questions both rows answered, with its paired
    bootstrap 95 % interval and whether that interval excludes 0."""
    found = []
    for spec in specs:
        a, b = f1_by_question(rows[spec.a]), f1_by_question(rows[spec.b])
        if spec.scope != AVERAGE:
            a = {k: v for k, v in a.items() if k[0] == spec.scope}
        interval = difference_interval(a, b, resamples, seed)
        if interval is None:
            continue
        found.append({**asdict(spec), "f1_difference": interval.as_dict(), "verdict": _verdict(interval)})
    return found


def points(value: float) -> str:
    """A difference of shares in signed F1 points (0.0 without a sign)."""
    rounded = round(100 * value, 1)
    return "0.0" if rounded == 0 else f"{rounded:+.1f}"


def _verdict(interval: Interval) -> str:
    if not interval.excludes_zero:
        return "the interval includes 0: no difference shown on these questions"
    return f"the interval excludes 0: the first row scores {'higher' if interval.low > 0 else 'lower'}"


def claims_markdown(found: Sequence[Mapping[str, Any]]) -> str:
    lines = ["## Claims", "",
             ("F1 difference (first row minus second, in F1 points) on the questions both rows "
              "answered, with its paired bootstrap 95 % interval (the average weighs datasets equally)."), ""]
    for claim in found:
        d = claim["f1_difference"]
        scope = "average over datasets" if claim["scope"] == AVERAGE else claim["scope"]
        lines.append(f"- **{claim['title']}** ({scope}, n = {d['n']}): {points(d['estimate'])} "
                     f"[{points(d['low'])}, {points(d['high'])}]; {claim['verdict']}.")
    return "\n".join(lines) + "\n"


# --- the router goals: as good as the best fixed strategy, half the gap to the oracle, half the time


GAP_SHARE_GOAL = 0.5
TIME_SHARE_GOAL = 0.5


def router_goals(
    table: Mapping[str, Mapping[str, Mapping[str, Any]]],
    rows: Mapping[str, Sequence[Outcome]],
    routers: Sequence[str],
    best_fixed: str,
    multi_step_row: str,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> dict[str, dict[str, Any]]:
    """Per router (averaged over datasets, on the questions it shares with the best fixed row and
    the oracle): its F1 minus the best fixed strategy's, the share of the best-fixed-to-oracle
    gap it closes (both with paired bootstrap intervals), its time as a share of the multi-step
    row's, and whether each goal is met by the estimate and by the whole interval."""
    if ORACLE not in rows or best_fixed not in rows:
        return {}
    best, oracle = f1_by_question(rows[best_fixed]), f1_by_question(rows[ORACLE])
    found = {}
    for router in routers:
        if router not in rows or router in (best_fixed, ORACLE):
            continue
        mine = {k: v for k, v in f1_by_question(rows[router]).items() if k in best and k in oracle}
        gain = difference_interval(mine, best, resamples, seed)
        gap = ratio_interval({k: v - best[k] for k, v in mine.items()},
                             {k: oracle[k] - best[k] for k in mine}, resamples, seed)
        time_share = _time_share(table[router][AVERAGE], table[multi_step_row][AVERAGE]) \
            if AVERAGE in table.get(router, {}) and AVERAGE in table.get(multi_step_row, {}) else None
        found[router] = {
            "f1_vs_best_fixed": gain.as_dict() if gain else None,
            "gap_closed": gap.as_dict() if gap else None,
            "time_share_of_multi_step": time_share,
            "met_by_estimate": bool(gain and gap and time_share is not None and gain.estimate >= 0
                                    and gap.estimate >= GAP_SHARE_GOAL and time_share <= TIME_SHARE_GOAL),
            "met_by_interval": bool(gain and gap and time_share is not None and gain.low >= 0
                                    and gap.low >= GAP_SHARE_GOAL and time_share <= TIME_SHARE_GOAL),
        }
    return found


def router_goals_markdown(
    found: Mapping[str, Mapping[str, Any]], best_fixed: str, multi_step_row: str,
    labels: Mapping[str, str] | None = None,
) -> str:
    labels = labels or {}
    lines = [
        "## Router goals", "",
        (f"Goal: a router's F1 at least the best fixed strategy's (`{labels.get(best_fixed, best_fixed)}`), "
         f"closing at least {GAP_SHARE_GOAL:.0%} of the gap from it to the oracle, at no more than "
         f"{TIME_SHARE_GOAL:.0%} of the multi-step row's (`{labels.get(multi_step_row, multi_step_row)}`) "
         "time. F1 difference in points and gap share with paired bootstrap 95 % intervals, on the "
         "questions the router shares with both rows; *met* by the estimates, *shown* when the "
         "intervals' lower ends meet it too."), "",
        "| row | n | F1 vs best fixed | gap to oracle closed | time / multi-step | goal |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]

    def share(d: Mapping[str, Any] | None) -> str:
        return "-" if d is None else f"{d['estimate']:.0%} [{d['low']:.0%}, {d['high']:.0%}]"

    for row, cell in found.items():
        gain = cell["f1_vs_best_fixed"]
        verdict = "shown" if cell["met_by_interval"] else ("met (estimate only)" if cell["met_by_estimate"] else "not met")
        lines.append(
            f"| {labels.get(row, row)} | {gain['n'] if gain else 0} | "
            + ("-" if gain is None else f"{points(gain['estimate'])} [{points(gain['low'])}, {points(gain['high'])}]")
            + f" | {share(cell['gap_closed'])} | {_percent(cell['time_share_of_multi_step'])} | {verdict} |"
        )
    return "\n".join(lines) + "\n"


# --- routing accuracy on the test labels (the oracle's tiers) --------------------------------


def tier_agreement(
    routed: Mapping[str, Mapping[tuple[str, str], Tier]],
    oracle: Mapping[tuple[str, str], Tier],
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> dict[str, dict[str, Any]]:
    """Per routing row, the share of questions routed to the oracle's tier (the question's test
    label: cheapest correct tier, else the dataset-identity rule), i.e. the router's accuracy on
    the test labels, pooled over questions like a classifier's accuracy, with its interval."""
    found = {}
    for row, tiers in routed.items():
        hits = [float(t == oracle[k]) for k, t in tiers.items() if k in oracle]
        interval = bootstrap_mean({"all": hits}, resamples, seed)
        if interval is None:
            continue
        counts = {t.value: sum(v == t for v in tiers.values()) for t in Tier}
        found[row] = {"accuracy": interval.as_dict(), "routed": counts}
    return found


def agreement_markdown(found: Mapping[str, Mapping[str, Any]], labels: Mapping[str, str]) -> str:
    lines = ["## Routing accuracy on the test labels", "",
             ("A question's test label is the oracle's tier (the cheapest tier answering correctly, "
              "else the dataset-identity rule), so a router's accuracy is its agreement with the "
              "oracle row: pooled over questions, with its bootstrap 95 % interval."), "",
             "| row | accuracy | n | routed A / B / C |",
             "| --- | ---: | ---: | ---: |"]
    for row, cell in found.items():
        a, r = cell["accuracy"], cell["routed"]
        lines.append(f"| {labels.get(row, row)} | {100 * a['estimate']:.1f} [{100 * a['low']:.1f}, "
                     f"{100 * a['high']:.1f}] | {a['n']} | {r['A']} / {r['B']} / {r['C']} |")
    return "\n".join(lines) + "\n"


# --- under- and over-retrieval ---------------------------------------------------------------


def retrieval_errors(
    routed: Mapping[str, Mapping[tuple[str, str], Tier]],
    cheapest: Mapping[tuple[str, str], Tier | None],
) -> dict[str, dict[str, Any]]:
    """Per routing row, how often it sent a question to a cheaper tier than the cheapest correct
    one (under-retrieval: the answer is lost), to exactly it, or to a dearer one (over-retrieval:
    time spent for nothing); questions no tier answered correctly are counted apart, by the tier
    they were sent to (there every tier is wrong, and cheaper is better)."""
    order = list(Tier)
    found = {}
    for row, tiers in routed.items():
        counts = {"under": 0, "exact": 0, "over": 0}
        none = {t.value: 0 for t in Tier}
        for key, tier in tiers.items():
            if key not in cheapest:
                continue
            best = cheapest[key]
            if best is None:
                none[tier.value] += 1
            else:
                diff = order.index(tier) - order.index(best)
                counts["under" if diff < 0 else "over" if diff > 0 else "exact"] += 1
        answerable = sum(counts.values())
        found[row] = {**counts, "answerable": answerable, "no_correct_tier": none,
                      "n": answerable + sum(none.values())}
    return found


def retrieval_errors_markdown(found: Mapping[str, Mapping[str, Any]], labels: Mapping[str, str]) -> str:
    lines = ["## Under- and over-retrieval per router", "",
             ("Against each question's cheapest tier that answered correctly (EM or Acc): *under* = "
              "sent to a cheaper tier (the correct answer is lost), *over* = sent to a dearer tier "
              "(time spent for nothing). Shares are of the questions some tier answered; questions no "
              "tier answered are counted apart, by the tier they were sent to."), "",
             "| row | n answerable | under | exact | over | no tier correct: n (sent A / B / C) |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]

    def share(count: int, total: int) -> str:
        return f"{count} ({100 * count / total:.1f} %)" if total else str(count)

    for row, cell in found.items():
        total, none = cell["answerable"], cell["no_correct_tier"]
        lines.append(f"| {labels.get(row, row)} | {total} | {share(cell['under'], total)} | "
                     f"{share(cell['exact'], total)} | {share(cell['over'], total)} | "
                     f"{sum(none.values())} ({none['A']} / {none['B']} / {none['C']}) |")
    return "\n".join(lines) + "\n"


def versus_reference(
    table: Mapping[str, Mapping[str, Mapping[str, float]]], reference: str
) -> dict[str, dict[str, dict[str, float]]]:
    """Each row's F1 and time as shares of the `reference` row's (the paper's adaptive claim:
    96-100 % of multi-step F1 at 41-44 % of its time), per dataset and averaged. Time shares go
    through each row's time relative to single step on its own questions when the table has it
    (comparable across machines), else through seconds."""
    base = table.get(reference, {})
    shares: dict[str, dict[str, dict[str, float]]] = {}
    for row, cells in table.items():
        if row == reference:
            continue
        shares[row] = {
            dataset: {
                "f1_share": c["f1"] / base[dataset]["f1"] if base[dataset]["f1"] else None,
                "time_share": _time_share(c, base[dataset]),
            }
            for dataset, c in cells.items() if dataset in base
        }
    return shares


def _time_share(cell: Mapping[str, Any], reference: Mapping[str, Any]) -> float | None:
    if cell.get("relative_time") is not None and reference.get("relative_time"):
        return cell["relative_time"] / reference["relative_time"]
    return cell["seconds"] / reference["seconds"] if reference["seconds"] else None


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.0f} %"


def versus_markdown(
    shares: Mapping[str, Mapping[str, Mapping[str, float]]], reference: str,
    labels: Mapping[str, str] | None = None,
) -> str:
    labels = labels or {}
    datasets = list(dict.fromkeys(d for cells in shares.values() for d in cells))
    lines = [
        f"### F1 and time as a share of `{reference}` (F1 share / time share)",
        "| row | " + " | ".join(datasets) + " |",
        "| --- |" + " ---: |" * len(datasets),
    ]
    for row, cells in shares.items():
        lines.append(f"| {labels.get(row, row)} | " + " | ".join(
            f"{_percent(cells[d]['f1_share'])} / {_percent(cells[d]['time_share'])}" if d in cells else "-"
            for d in datasets
        ) + " |")
    return "\n".join(lines) + "\n"


def plot(
    table: Mapping[str, Mapping[str, Mapping[str, Any]]],
    path: Path,
    labels: Mapping[str, str] | None = None,
    kinds: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """F1 against time per query, one point per row (error bar: the F1 interval), for the
    average and each dataset. Time is relative to single step on each row's own questions when the
    table has it (seconds differ between machines; these ratios do not), else seconds; one colour and marker per row throughout, the marker's shape by kind
    (square: fixed strategy, circle: router, star: oracle; past 20 rows the markers go hollow, so
    no two rows look alike). Every row of `table` is drawn and named in the legend; returns the
    legend's entries (`label`, `kind`, `colour`, `marker`, `hollow`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    labels, kinds = labels or {}, kinds or {}
    found = list(dict.fromkeys(d for c in table.values() for d in c))
    datasets = [d for d in found if d == AVERAGE] + [d for d in found if d != AVERAGE]
    if not datasets:
        return []  # nothing evaluated yet: no plot
    columns = min(4, len(datasets) + 1)
    n_rows = -(-(len(datasets) + 1) // columns)  # one spare panel for the legend
    fig, axes = plt.subplots(n_rows, columns, figsize=(3.6 * columns, 3.3 * n_rows), squeeze=False)
    panels = list(axes.flat)
    colours = plt.get_cmap("tab10" if len(table) <= 10 else "tab20")
    # tab20 pairs a dark and a light shade of each hue: all dark shades first, then the light ones.
    palette = [colours(i) for i in range(0, colours.N, 2)] + [colours(i) for i in range(1, colours.N, 2)] \
        if colours.N == 20 else [colours(i) for i in range(colours.N)]
    markers = {"fixed": "s", "strategy": "s", "router": "o", "oracle": "*"}
    styles = {}
    for index, row in enumerate(table):
        kind = kinds.get(row, "")
        styles[row] = {"label": labels.get(row, row), "kind": kind, "colour": to_hex(palette[index % len(palette)]),
                       "marker": markers.get(kind, "o"), "hollow": index >= len(palette)}
    relative = any(cell.get("relative_time") is not None for cells in table.values() for cell in cells.values())
    time_of = "relative_time" if relative else "seconds"
    for axis, dataset in zip(panels, datasets):
        for row, cells in table.items():
            if dataset not in cells or cells[dataset].get(time_of) is None:
                continue
            cell, style = cells[dataset], styles[row]
            f1 = 100 * cell["f1"]
            interval = cell.get("f1_ci")
            # max(0, .): on one question the interval is the point, give or take a rounding error
            yerr = [[max(0.0, f1 - 100 * interval[0])], [max(0.0, 100 * interval[1] - f1)]] if interval else None
            axis.errorbar(cell[time_of], f1, yerr=yerr, fmt=style["marker"], color=style["colour"], capsize=2,
                          markersize=10 if style["kind"] == "oracle" else 6, label=style["label"],
                          markerfacecolor="none" if style["hollow"] else style["colour"])
        axis.set_title("average over datasets" if dataset == AVERAGE else dataset)
        axis.set_xlabel("time / query (single step = 1)" if relative else "seconds / query")
        axis.set_ylabel("F1 (95 % interval)")
        axis.grid(alpha=0.3)
    legend = panels[len(datasets)]
    # Every row once, even one missing from the first panel.
    handles = {}
    for axis in panels[:len(datasets)]:
        for handle, name in zip(*axis.get_legend_handles_labels()):
            handles.setdefault(name, handle)
    entries = [styles[row] for row in table if styles[row]["label"] in handles]
    legend.legend([handles[e["label"]] for e in entries], [e["label"] for e in entries], loc="center",
                  fontsize=8 if len(entries) <= 14 else 6, frameon=False)
    for axis in panels[len(datasets):]:
        axis.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return entries


def _describe(value: Any) -> str:
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {_describe(v)}" for k, v in value.items())
    return str(value)


def rows_markdown(rows: Mapping[str, Mapping[str, Any]], absent: Mapping[str, str]) -> str:
    """What each row is and what made it (classifier version, thresholds, ...)."""
    lines = ["## Rows", ""]
    for row, described in rows.items():
        what = described.get("description", "")
        info = "; ".join(f"{k}: {_describe(v)}" for k, v in described.get("info", {}).items() if v is not None)
        lines.append(f"- **{described.get('label', row)}**" + (f": {what}" if what else "")
                     + (f" ({info})" if info else ""))
    for row, reason in absent.items():
        lines.append(f"- **{row}**: not in this report: {reason}")
    return "\n".join(lines) + "\n"


def write_report(
    table: Mapping[str, Mapping[str, Mapping[str, Any]]],
    out_dir: Path,
    meta: Mapping[str, object],
    rows: Mapping[str, Mapping[str, Any]] | None = None,
    found_claims: Sequence[Mapping[str, Any]] = (),
    agreement: Mapping[str, Mapping[str, Any]] | None = None,
    retrieval: Mapping[str, Mapping[str, Any]] | None = None,
    goals: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Path]:
    """`report.json`, `report.md` and `f1_vs_time.png` in `out_dir`.

    `rows`: per row its label, kind and what made it; `meta["regeneration"]` (set by a
    report-only run) and `meta["absent_rows"]` are stated at the top of the markdown.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path, png_path = (
        out_dir / "report.json", out_dir / "report.md", out_dir / "f1_vs_time.png"
    )
    rows = rows or {}
    labels = {row: str(r.get("label", row)) for row, r in rows.items()}
    reference = meta.get("multi_step_row")
    shares = versus_reference(table, str(reference)) if reference in table else {}
    json_path.write_text(json.dumps({
        "meta": meta, "rows": rows, "table": table, "claims": list(found_claims),
        "tier_agreement": agreement or {}, "retrieval_errors": retrieval or {}, "versus_multi_step": shares,
        "router_goals": goals or {},
        "bootstrap": {"resamples": DEFAULT_RESAMPLES, "seed": DEFAULT_SEED, "confidence": 0.95,
                      "method": "percentile; questions resampled within each dataset; paired for differences"},
    }, indent=2))
    header = ["# Evaluation report", "", f"Command: `{meta.get('command', '')}`", ""]
    if meta.get("regeneration"):
        header += [f"**{meta['regeneration']}**", ""]
    skipped = ("command", "regeneration", "absent_rows")
    header += [f"- {k}: {_describe(v)}" for k, v in meta.items() if k not in skipped]
    absent = meta.get("absent_rows") or {}
    body = [rows_markdown(rows, absent)] if rows or absent else []
    body.append("## Average over datasets\n\nEach dataset weighs the same. F1 with its bootstrap 95 % "
                f"interval ({DEFAULT_RESAMPLES} resamples of the questions within each dataset, seed "
                f"{DEFAULT_SEED}); Time vs single: time per query relative to single step (= 1.00), on "
                "the row's own questions (a ratio of sums per question pair: seconds differ between "
                "machines, these ratios do not).\n")
    body.append(markdown(table, labels, [AVERAGE]))
    if found_claims:
        body.append(claims_markdown(found_claims))
    if goals:
        body.append(router_goals_markdown(goals, str(meta.get("best_fixed_row", "")), str(reference), labels))
    if agreement:
        body.append(agreement_markdown(agreement, labels))
    if retrieval:
        body.append(retrieval_errors_markdown(retrieval, labels))
    body.append("## Per dataset\n")
    body.append(markdown(table, labels, [d for cells in table.values() for d in cells if d != AVERAGE]))
    if shares:
        body.append(versus_markdown(shares, str(reference), labels))
    md_path.write_text("\n".join(header) + "\n\n" + "\n".join(body))
    plot(table, png_path, labels, {row: str(r.get("kind", "")) for row, r in rows.items()})
    return [json_path, md_path, png_path]
