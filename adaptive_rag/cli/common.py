"""What every `arag` command shares: the consoles, the progress bar, the error handling of the
entry point, the settings (read once per command) and the options several commands take.

Imports no other module of `adaptive_rag.cli` (the command modules import this one)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.progress import (
    BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn,
)

from adaptive_rag.contracts import StrategyName
from adaptive_rag.errors import AdaptiveRagError
from adaptive_rag.settings import ClassifierSettings, Settings, multi_step_strategy

if TYPE_CHECKING:
    from adaptive_rag.storage import LabelStore

console = Console()
err_console = Console(stderr=True)

# --- options several commands take ----------------------------------------------------------------
Retr = Annotated[Optional[str], typer.Option("--retriever", help="tantivy | opensearch")]
IndexDir = Annotated[Optional[Path], typer.Option("--index-dir", help="tantivy index directory")]
DataDir = Annotated[Optional[Path], typer.Option("--data-dir", help="benchmark data (default: ARAG_DATA_DIR)")]
Datasets = Annotated[Optional[str], typer.Option("--datasets", help="comma-separated subset of squad,nq,trivia,musique,hotpotqa,2wiki")]
DbUrl = Annotated[Optional[str], typer.Option("--database-url", help="default: DATABASE_URL or sqlite:///var/arag.db")]
RepoOpt = Annotated[Optional[Path], typer.Option("--repository", help="Triton model repository (default: ARAG_MODEL_REPOSITORY)")]


# --- settings --------------------------------------------------------------------------------------


def _given(overrides: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in overrides.items() if v is not None}


def load_settings(**overrides: object) -> Settings:
    """`Settings` from the environment, with the options the user gave (None: not given)."""
    return Settings(**_given(overrides))


def load_classifier_settings(**overrides: object) -> ClassifierSettings:
    """`ClassifierSettings` from the environment, with the options the user gave."""
    return ClassifierSettings(**_given(overrides))


def open_label_store(database_url: str) -> LabelStore:
    """The `training_labels` store of `database_url`, migrated to the latest schema first."""
    from adaptive_rag.storage import LabelStore, make_engine, upgrade_database

    upgrade_database(database_url)
    return LabelStore(make_engine(database_url))


# --- output ----------------------------------------------------------------------------------------


@contextmanager
def progress_bar(description: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """A rich progress bar on stderr; yields `advance(n)`."""
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TimeRemainingColumn(), console=err_console, transient=False,
    ) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n=1: progress.advance(task, n)


# --- strategies ------------------------------------------------------------------------------------

MULTI_STEP = "multi_step"  # the configured C variant (`ircot`, `decompose` or `evidence`)
STRATEGY_ALIASES = {"a": StrategyName.NO_RETRIEVAL, "b": StrategyName.SINGLE_STEP, "c": MULTI_STEP}


def resolve_strategy(name: str, settings: Settings) -> str:
    """A strategy name from a tier letter, `multi_step` (the configured C variant) or a name."""
    from adaptive_rag.strategies import ALL_STRATEGY_NAMES

    name = STRATEGY_ALIASES.get(name.lower(), name)
    name = multi_step_strategy(settings) if name == MULTI_STEP else name
    if name not in ALL_STRATEGY_NAMES:
        raise typer.BadParameter(
            f"unknown strategy {name!r}; choose a, b, c, auto or one of {', '.join(ALL_STRATEGY_NAMES)}"
        )
    return name


# --- which records database -----------------------------------------------------------------------

# Commands that write the records database (API keys, knowledge bases, labels, promotion verdicts),
# as the words they start with. Without DATABASE_URL they write to a SQLite file, which a front door
# or worker configured with DATABASE_URL never reads: each says where it writes before it does.
RECORD_WRITERS = frozenset({
    ("keys",), ("kb",), ("label",), ("relabel",), ("retrain",), ("classifier", "label"),
    ("classifier", "relabel"), ("classifier", "retrain"), ("model", "promote"), ("model", "rollback"),
})


def records_database_notice(argv: list[str]) -> str | None:
    """The stderr line naming the records database a command of `argv` writes to (None: the
    command writes no records, or only asks for help)."""
    from sqlalchemy.engine import make_url

    words = tuple(word for word in argv[:2] if not word.startswith("-"))
    if "--help" in argv or (words[:1] not in RECORD_WRITERS and words[:2] not in RECORD_WRITERS):
        return None
    given = [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "--database-url"]
    given += [word.partition("=")[2] for word in argv if word.startswith("--database-url=")]
    if given:
        url, source = given[-1], "--database-url"
    else:
        settings = Settings()
        url = settings.database_url
        source = "DATABASE_URL" if "database_url" in settings.model_fields_set else \
            "the default; DATABASE_URL selects another"
    parsed = make_url(url)
    file = f" = {Path(parsed.database).resolve()}" if parsed.get_backend_name() == "sqlite" and parsed.database else ""
    return f"records database: {parsed.render_as_string(hide_password=True)}{file} ({source})"


# --- entry point -----------------------------------------------------------------------------------


def run_app(app: typer.Typer) -> None:
    """Run `app`: library errors become one clear line and exit code 2, never a traceback."""
    from pydantic import ValidationError

    try:
        notice = records_database_notice(sys.argv[1:])
        if notice:
            err_console.print(notice, highlight=False, soft_wrap=True)
        app(standalone_mode=False)
    except AdaptiveRagError as exc:
        err_console.print(f"[bold red]error:[/] {exc}")
        sys.exit(2)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors()
        )
        err_console.print(f"[bold red]error:[/] invalid configuration: {problems}")
        sys.exit(2)
    except typer.TyperException as exc:  # usage errors (BadParameter ...) carry their exit code
        show = getattr(exc, "show", None)
        if show:
            show()
        sys.exit(getattr(exc, "exit_code", 2))
    except (typer.Exit, typer.Abort) as exc:
        sys.exit(getattr(exc, "exit_code", 1))
