"""`arag smalltalk train | try`: the learned small-talk detector (`adaptive_rag.routing.small_talk_model`).

`train` rebuilds the shipped detector from the committed phrase banks (`models/small_talk/`) and
the data directory's `train` questions (needs the `train` extras: scikit-learn), choosing C and the
confidence floor on a validation split of those, and writes the package data file
`adaptive_rag/routing/small_talk_detector.npz` (or `--out`): package data because the front door's
image ships the package, not the repository's `models/`. `try` shows what the detector and the
phrase rules make of some utterances.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from adaptive_rag.cli.common import DataDir, console, load_settings, progress_bar

smalltalk_app = typer.Typer(
    add_completion=False, no_args_is_help=True,
    help="The learned small-talk detector: train it, try it on utterances.",
)


@smalltalk_app.command()
def train(
    data_dir: DataDir = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="default: the shipped model file")] = None,
    held_out: Annotated[Optional[list[Path]], typer.Option(
        "--held-out", help="an evaluation file never to train on: its utterances and their near copies are "
                           "dropped from the examples (repeatable; the shipped model: make small-talk-model)")] = None,
) -> None:
    """Train the detector on the phrase banks and the data directory's `train` questions."""
    from contextlib import ExitStack

    from adaptive_rag.routing.small_talk_model import DEFAULT_MODEL
    from adaptive_rag.training.small_talk import fit_detector

    settings = load_settings()
    with ExitStack() as stack:
        def progress(description: str, total: int):
            return stack.enter_context(progress_bar(description, total))

        _, card = fit_detector(Path(data_dir or settings.data_dir), Path(out or DEFAULT_MODEL),
                               log=console.print, progress=progress, held_out_files=tuple(held_out or ()))
    table = Table(title="validation split (held-out phrase lines and real questions)")
    for column in ("C", "floor", "recall", "intent accuracy", "FP real", "FP written", "chosen"):
        table.add_column(column)
    for row in card["validation"]:
        table.add_row(f"{row['c']:g}", f"{row['min_confidence']:g}", f"{100 * row['recall']:.1f} %",
                      f"{100 * row['intent_accuracy']:.1f} %", f"{100 * row['real_false_positive_rate']:.2f} %",
                      f"{100 * row['written_false_positive_rate']:.2f} %",
                      "*" if row == card["chosen_validation"] else "")
    console.print(table)


@smalltalk_app.command(name="try")
def try_(utterances: Annotated[list[str], typer.Argument(help="utterances to classify")]) -> None:
    """What the learned detector and the phrase rules make of each utterance."""
    from adaptive_rag.routing.small_talk import learned_intent, normalise, rule_intent, shipped_model

    model = shipped_model()
    table = Table()
    for column in ("utterance", "learned", "P(not a request)", "rules"):
        table.add_column(column)
    for text in utterances:
        learned = learned_intent(text, model) if model else None
        clauses = normalise(text)
        chance = f"{model.score_clauses(clauses).not_none:.2f}" if model and clauses else "-"
        rules = rule_intent(text)
        table.add_row(text, learned.intent if learned else "request", chance, rules.intent if rules else "request")
    console.print(table)
