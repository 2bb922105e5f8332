"""`arag keys`: create, list and revoke API keys of tenants (only their hashes are stored)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.table import Table

from adaptive_rag.cli.common import console, err_console, load_settings

if TYPE_CHECKING:
    from adaptive_rag.storage import RecordStore

keys_app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)


def _store() -> RecordStore:
    """The record store of `DATABASE_URL`, migrated to the latest schema first."""
    from adaptive_rag.storage import RecordStore, make_engine, upgrade_database

    url = load_settings().database_url
    upgrade_database(url)
    return RecordStore(make_engine(url))


@keys_app.command("create")
def create(
    tenant: Annotated[str, typer.Option("--tenant", help="tenant the key belongs to")],
    scope: Annotated[Optional[list[str]], typer.Option(
        "--scope", help="answer | feedback | kb:write; repeat for several (default: answer and feedback)")] = None,
) -> None:
    """Create a key for TENANT and print it once (it cannot be shown again)."""
    from adaptive_rag.contracts import DEFAULT_SCOPES, Scope

    try:
        scopes = frozenset(Scope(s) for s in scope) if scope else DEFAULT_SCOPES
    except ValueError:
        raise typer.BadParameter(
            f"unknown scope in {scope}; choose from {', '.join(s.value for s in Scope)}", param_hint="--scope"
        ) from None
    key = _store().create_api_key(tenant, scopes)
    print(key)
    err_console.print(
        f"key for tenant {tenant!r} ({', '.join(sorted(scopes))}): store it now, only its hash is kept",
        highlight=False,
    )


@keys_app.command("list")
def list_keys() -> None:
    """Every key: id, tenant, prefix, created, revoked."""
    table = Table("id", "tenant", "scopes", "prefix", "created", "revoked")
    for key in _store().list_api_keys():
        table.add_row(
            str(key.id), key.tenant, ",".join(sorted(key.scopes)), key.key_prefix + "...",
            key.created_at.isoformat(timespec="seconds"),
            key.revoked_at.isoformat(timespec="seconds") if key.revoked_at else "-",
        )
    console.print(table)


@keys_app.command("revoke")
def revoke(key_id: Annotated[int, typer.Argument(help="id shown by `arag keys list`")]) -> None:
    """Revoke one key; requests carrying it are then refused."""
    if not _store().revoke_api_key(key_id):
        raise typer.BadParameter(f"no active key with id {key_id}", param_hint="KEY_ID")
    console.print(f"revoked key {key_id}")
