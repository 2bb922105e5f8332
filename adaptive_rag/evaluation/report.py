"""Tables and plots from evaluation outcomes: per-dataset and averaged EM/F1/Acc/Steps/Time, the
oracle row, time relative to single step; written as JSON, markdown and a PNG plot."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

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

    `tiers` lists the A, B, C strategies cheapest first. When none is correct the dataset's
    inductive bias decides, as for the classifier's labels: single-hop -> B, multi-hop -> C.
    """
    chosen = []
    for question in questions:
        candidates = [outcomes.get((question.dataset, question.id, name)) for name in tiers]
        if any(c is None for c in candidates):
            continue
        pick = next((c for c in candidates if c.correct), None)
        if pick is None:
            pick = candidates[2] if question.multi_hop else candidates[1]
        chosen.append(pick)
    return chosen


def summarise(rows: Mapping[str, Sequence[Outcome]]) -> dict[str, dict[str, dict[str, float]]]:
    """`{row: {dataset | 'average': {metric: value, 'n': count, 'relative_time': x}}}`.

    The average is the mean over datasets (each dataset weighs the same, as in the paper).
    Time is also given relative to the single-step row (= 1.00) when that row exists.
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
    baseline = table.get("single_step", {})
    for cells in table.values():
        for dataset, cell in cells.items():
            base = baseline.get(dataset, {}).get("seconds")
            cell["relative_time"] = cell["seconds"] / base if base else None
    return table


def markdown(table: Mapping[str, Mapping[str, Mapping[str, float]]]) -> str:
    """One markdown table per dataset and one for the average."""
    datasets = list(dict.fromkeys(d for cells in table.values() for d in cells))
    parts = []
    for dataset in datasets:
        hop = "multi-hop" if dataset in MULTI_HOP else ("" if dataset == AVERAGE else "single-hop")
        parts.append(f"### {dataset} {f'({hop})' if hop else ''}".rstrip())
        parts.append("| row | n | EM | F1 | Acc | Steps | Time (s/q) | Time vs single |")
        parts.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for row, cells in table.items():
            if dataset in cells:
                c = cells[dataset]
                parts.append(
                    f"| {row} | {int(c['n'])} | {100 * c['em']:.1f} | {100 * c['f1']:.1f} | "
                    f"{100 * c['acc']:.1f} | {c['steps']:.2f} | {c['seconds']:.2f} | "
                    f"{'-' if c['relative_time'] is None else format(c['relative_time'], '.2f')} |"
                )
        parts.append("")
    return "\n".join(parts)


def versus_reference(
    table: Mapping[str, Mapping[str, Mapping[str, float]]], reference: str
) -> dict[str, dict[str, dict[str, float]]]:
    """Each row's F1 and time as shares of the `reference` row's (the paper's adaptive claim:
    96-100 % of multi-step F1 at 41-44 % of its time), per dataset and averaged."""
    base = table.get(reference, {})
    shares: dict[str, dict[str, dict[str, float]]] = {}
    for row, cells in table.items():
        if row == reference:
            continue
        shares[row] = {
            dataset: {
                "f1_share": c["f1"] / base[dataset]["f1"] if base[dataset]["f1"] else None,
                "time_share": c["seconds"] / base[dataset]["seconds"] if base[dataset]["seconds"] else None,
            }
            for dataset, c in cells.items() if dataset in base
        }
    return shares


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.0f} %"


def versus_markdown(shares: Mapping[str, Mapping[str, Mapping[str, float]]], reference: str) -> str:
    datasets = list(dict.fromkeys(d for cells in shares.values() for d in cells))
    lines = [
        f"### F1 and time as a share of `{reference}` (F1 share / time share)",
        "| row | " + " | ".join(datasets) + " |",
        "| --- |" + " ---: |" * len(datasets),
    ]
    for row, cells in shares.items():
        lines.append(f"| {row} | " + " | ".join(
            f"{_percent(cells[d]['f1_share'])} / {_percent(cells[d]['time_share'])}" if d in cells else "-"
            for d in datasets
        ) + " |")
    return "\n".join(lines) + "\n"


def plot(table: Mapping[str, Mapping[str, Mapping[str, float]]], path: Path) -> None:
    """F1 against seconds per query, one point per row, for the average and each dataset."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = [d for d in dict.fromkeys(d for c in table.values() for d in c)]
    if not datasets:
        return  # nothing evaluated yet: no plot
    fig, axes = plt.subplots(1, len(datasets), figsize=(3.2 * len(datasets), 3.4), squeeze=False)
    for axis, dataset in zip(axes[0], datasets):
        for row, cells in table.items():
            if dataset in cells:
                axis.scatter(cells[dataset]["seconds"], 100 * cells[dataset]["f1"], label=row)
                axis.annotate(row, (cells[dataset]["seconds"], 100 * cells[dataset]["f1"]),
                              fontsize=7, xytext=(3, 3), textcoords="offset points")
        axis.set_title(dataset)
        axis.set_xlabel("seconds / query")
        axis.set_ylabel("F1")
        axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(
    table: Mapping[str, Mapping[str, Mapping[str, float]]],
    out_dir: Path,
    meta: Mapping[str, object],
) -> list[Path]:
    """`report.json`, `report.md` and `f1_vs_time.png` in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path, png_path = (
        out_dir / "report.json", out_dir / "report.md", out_dir / "f1_vs_time.png"
    )
    reference = meta.get("multi_step_row")
    shares = versus_reference(table, str(reference)) if reference in table else {}
    json_path.write_text(json.dumps({"meta": meta, "table": table, "versus_multi_step": shares}, indent=2))
    header = ["# Evaluation report", "", f"Command: `{meta.get('command', '')}`", ""]
    header += [f"- {k}: {v}" for k, v in meta.items() if k != "command"]
    body = markdown(table) + ("\n" + versus_markdown(shares, str(reference)) if shares else "")
    md_path.write_text("\n".join(header) + "\n\n" + body)
    plot(table, png_path)
    return [json_path, md_path, png_path]
