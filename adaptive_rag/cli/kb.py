"""`arag kb`: a tenant's knowledge base from the operator's side: import, describe, delete, the
abstention threshold (derived on every import; `threshold` overrides it, `calibrate` derives it
again) and the answer style (`style`: support or short).

These commands write the configured backend's index (tantivy under ARAG_KB_DIR, or OpenSearch)
and the records of DATABASE_URL directly; clients use the KnowledgeBase gRPC service instead.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from adaptive_rag.cli.common import DbUrl, Retr, console, load_settings, progress_bar

if TYPE_CHECKING:
    from adaptive_rag.knowledge.service import ChangeSummary, KnowledgeBaseService

kb_app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
Tenant = Annotated[str, typer.Option("--tenant", help="the tenant whose knowledge base this is")]
KbDir = Annotated[Optional[Path], typer.Option("--kb-dir", help="tantivy knowledge bases (default: ARAG_KB_DIR)")]


def _service(retriever: str | None, kb_dir: Path | None, database_url: str | None) -> KnowledgeBaseService:
    from adaptive_rag.knowledge.service import open_knowledge_service
    from adaptive_rag.storage import make_engine, upgrade_database

    settings = load_settings(retriever=retriever, kb_dir=kb_dir, database_url=database_url)
    upgrade_database(settings.database_url)
    return open_knowledge_service(settings, make_engine(settings.database_url))


def _summary_line(summary: ChangeSummary) -> str:
    return (f"added {summary.added}, updated {summary.updated}, unchanged {summary.unchanged}, "
            f"deleted {summary.deleted}; chunks written {summary.chunks_written}, removed "
            f"{summary.chunks_removed}")


@kb_app.command("import")
def import_documents(
    tenant: Tenant,
    paths: Annotated[list[Path], typer.Argument(help="JSONL, CSV, Markdown or HTML files, or directories of them")],
    csv_columns: Annotated[Optional[str], typer.Option(
        help="CSV column mapping, e.g. 'title=question,text=answer,url=link' (that is the default)")] = None,
    rebuild: Annotated[bool, typer.Option(
        help="replace the whole knowledge base: build a new index beside the live one and switch "
             "atomically (queries keep being answered)")] = False,
    retriever: Retr = None,
    kb_dir: KbDir = None,
    database_url: DbUrl = None,
) -> None:
    """Import documents into TENANT's knowledge base.

    Without --rebuild each file is synchronised: its documents are added or updated in place (by
    id), and documents an earlier import of the same file had that are gone now are removed.
    """
    from adaptive_rag.knowledge.importers import CsvColumns, import_paths

    columns = CsvColumns.parse(csv_columns) if csv_columns else None
    for path in paths:
        if not path.exists():
            raise typer.BadParameter(f"{path} does not exist", param_hint="PATHS")
    documents = import_paths(paths, csv_columns=columns)
    service = _service(retriever, kb_dir, database_url)
    if rebuild:
        with console.status(f"rebuilding {tenant!r}'s knowledge base from {len(documents)} documents"):
            summary = service.rebuild(tenant, documents)
    else:
        by_source: dict[str, list] = defaultdict(list)
        for doc in documents:
            by_source[doc.source].append(doc)
        from adaptive_rag.knowledge.service import ChangeSummary

        summary = ChangeSummary()
        with progress_bar(f"importing into {tenant!r}", len(documents)) as advance:
            for source, docs in by_source.items():
                summary = summary.plus(service.sync_source(tenant, source, docs, advance))
    console.print(_summary_line(summary), highlight=False)
    _print_info(service, tenant)


@kb_app.command("describe")
def describe(tenant: Tenant, retriever: Retr = None, kb_dir: KbDir = None, database_url: DbUrl = None) -> None:
    """Documents, chunks, index generation and last update of TENANT's knowledge base."""
    _print_info(_service(retriever, kb_dir, database_url), tenant)


@kb_app.command("threshold")
def threshold(
    tenant: Tenant,
    value: Annotated[Optional[float], typer.Argument(
        help="the relevance below which TENANT's questions abstain (0: only when nothing is retrieved)",
        min=0.0)] = None,
    automatic: Annotated[bool, typer.Option("--auto", help="drop the override: the knowledge base's own threshold holds again")] = False,
    retriever: Retr = None, kb_dir: KbDir = None, database_url: DbUrl = None,
) -> None:
    """Override TENANT's abstention threshold (or, with --auto, go back to the derived one)."""
    if (value is None) == (not automatic):
        raise typer.BadParameter("give a threshold, or --auto to drop the override", param_hint="VALUE")
    service = _service(retriever, kb_dir, database_url)
    service.set_threshold(tenant, None if automatic else value)
    _print_info(service, tenant)


@kb_app.command("style")
def style(
    tenant: Tenant,
    value: Annotated[Optional[str], typer.Argument(
        help="support: a full answer citing its sources; short: the span QA benchmarks score")] = None,
    default: Annotated[bool, typer.Option("--default", help="drop the tenant's choice: the deployment's ARAG_ANSWER_STYLE holds again")] = False,
    retriever: Retr = None, kb_dir: KbDir = None, database_url: DbUrl = None,
) -> None:
    """Choose how TENANT's answers read (or, with --default, go back to the deployment's)."""
    from adaptive_rag.contracts import AnswerStyle

    if (value is None) == (not default):
        raise typer.BadParameter("give a style (support or short), or --default", param_hint="VALUE")
    if value is not None and value not in {s.value for s in AnswerStyle}:
        raise typer.BadParameter(f"{value!r} is not a style: support or short", param_hint="VALUE")
    service = _service(retriever, kb_dir, database_url)
    service.set_answer_style(tenant, None if default else AnswerStyle(value))
    _print_info(service, tenant)


@kb_app.command("calibrate")
def calibrate(tenant: Tenant, retriever: Retr = None, kb_dir: KbDir = None, database_url: DbUrl = None) -> None:
    """Derive TENANT's abstention threshold from its knowledge base again (every import does)."""
    service = _service(retriever, kb_dir, database_url)
    service.calibrate(tenant)
    _print_info(service, tenant)


@kb_app.command("delete")
def delete(
    tenant: Tenant,
    document_ids: Annotated[list[str], typer.Argument(help="ids of the documents to remove")],
    retriever: Retr = None, kb_dir: KbDir = None, database_url: DbUrl = None,
) -> None:
    """Remove documents (and all their chunks) from TENANT's knowledge base."""
    service = _service(retriever, kb_dir, database_url)
    summary = service.delete(tenant, document_ids)
    console.print(_summary_line(summary), highlight=False)
    if summary.not_found:
        console.print(f"{summary.not_found} of the ids were not in the knowledge base")


def _print_info(service: KnowledgeBaseService, tenant: str) -> None:
    from adaptive_rag.knowledge.calibration import Calibration

    info = service.describe(tenant)
    updated = info.updated_at.isoformat(timespec="seconds") if info.updated_at else "-"
    console.print(
        f"tenant {tenant!r}: {info.documents} documents, {info.chunks} chunks, generation "
        f"{info.generation}, updated {updated} ({info.backend})", highlight=False,
    )
    console.print(f"abstains when nothing is retrieved, or on {info.abstention.describe()}", highlight=False)
    console.print(f"answer style {info.answer_style.value} ({info.answer_style_source})", highlight=False)
    if info.calibration:
        derived = Calibration.from_record(info.calibration)
        console.print(f"automatic threshold {derived.threshold:g}: {derived.describe()}", highlight=False)
