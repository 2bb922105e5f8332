"""Turn a tenant's help-centre export (JSONL, CSV FAQ, Markdown, HTML) into `Document`s.

Ids are stable across re-imports and machines, so importing the same export again replaces the
documents in place: JSONL ids come from the file (or the title), CSV FAQ ids from an id column or
the question, Markdown and HTML ids from the file's path relative to the directory the user passed.
Bad input raises `DocumentImportError` naming the file, the line or row and what is wrong.
"""

from __future__ import annotations

import csv
import io
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from markdown_it import MarkdownIt
from markdown_it.token import Token
from mdit_py_plugins.front_matter import front_matter_plugin

from adaptive_rag.errors import AdaptiveRagError
from adaptive_rag.knowledge.documents import (
    Document,
    Section,
    derived_document_id,
    normalise_title,
)

if TYPE_CHECKING:
    from lxml.etree import _Element

LOG = logging.getLogger(__name__)

JSONL_SUFFIXES = (".jsonl",)
CSV_SUFFIXES = (".csv",)
MARKDOWN_SUFFIXES = (".md", ".markdown")
HTML_SUFFIXES = (".html", ".htm")
SUPPORTED_SUFFIXES = tuple(sorted(JSONL_SUFFIXES + CSV_SUFFIXES + MARKDOWN_SUFFIXES + HTML_SUFFIXES))

# Called with one human-readable line per recoverable oddity (a duplicate FAQ question...).
WarningSink = Callable[[str], None]


class DocumentImportError(AdaptiveRagError):
    """A file cannot be imported; the message names the file, the line or row, and the problem."""


def _log_warning(message: str) -> None:
    LOG.warning(message)


def _fail(path: Path | str, problem: str, where: str = "") -> DocumentImportError:
    location = f"{path}: {where}: " if where else f"{path}: "
    return DocumentImportError(location + problem)


# --------------------------------------------------------------------------------------------
# entry points
# --------------------------------------------------------------------------------------------


def import_path(
    path: Path,
    *,
    csv_columns: CsvColumns | None = None,
    on_warning: WarningSink | None = None,
) -> list[Document]:
    """Documents of one file, or of every supported file under a directory (sorted, recursive).

    Files and directories whose name starts with "." are skipped in a directory walk (VCS data,
    editor files). Two files of one directory giving the same document id is an error rather than
    one silently replacing the other in the index.
    """
    path = Path(path)
    warn = on_warning or _log_warning
    if path.is_dir():
        files = _supported_files(path)
        if not files:
            raise _fail(path, f"no supported files in this directory (supported: {_supported()})")
        docs: list[Document] = []
        for file in files:
            docs.extend(_import_file(file, root=path, source=str(path), columns=csv_columns, warn=warn))
        _check_unique(docs)
        return docs
    if not path.exists():
        raise _fail(path, "no such file or directory")
    return _import_file(path, root=path.parent, source=path.name, columns=csv_columns, warn=warn)


def import_paths(
    paths: Iterable[Path],
    *,
    csv_columns: CsvColumns | None = None,
    on_warning: WarningSink | None = None,
) -> list[Document]:
    """Documents of several files or directories, in the order given; ids must not collide."""
    docs: list[Document] = []
    for path in paths:
        docs.extend(import_path(path, csv_columns=csv_columns, on_warning=on_warning))
    _check_unique(docs)
    return docs


def _supported() -> str:
    return ", ".join(SUPPORTED_SUFFIXES)


def _supported_files(root: Path) -> list[Path]:
    """Supported files under `root`, sorted by their relative path so the order is stable."""
    found = []
    for file in root.rglob("*"):
        relative = file.relative_to(root)
        if any(part.startswith(".") for part in relative.parts):
            continue
        if file.is_file() and file.suffix.lower() in SUPPORTED_SUFFIXES:
            found.append(file)
    return sorted(found, key=lambda f: f.relative_to(root).as_posix())


def _import_file(
    file: Path, *, root: Path, source: str, columns: CsvColumns | None, warn: WarningSink
) -> list[Document]:
    suffix = file.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return import_jsonl(file, on_warning=warn)
    if suffix in CSV_SUFFIXES:
        return import_csv(file, columns, on_warning=warn)
    relative = file.relative_to(root).as_posix()
    if suffix in MARKDOWN_SUFFIXES:
        return [import_markdown(file, doc_id=derived_document_id(relative, prefix="md"), source=source)]
    if suffix in HTML_SUFFIXES:
        return [import_html(file, doc_id=derived_document_id(relative, prefix="html"), source=source)]
    raise _fail(file, f"unsupported file type {file.suffix or '(no extension)'!r} (supported: {_supported()})")


def _check_unique(docs: list[Document]) -> None:
    """Two documents with one id would replace each other in the index: refuse instead."""
    seen: dict[str, Document] = {}
    for doc in docs:
        first = seen.setdefault(doc.id, doc)
        if first is not doc:
            raise DocumentImportError(
                f"document id {doc.id!r} is given twice: by {first.title!r} from {first.source} and by "
                f"{doc.title!r} from {doc.source} (give the documents explicit ids, or import them separately)"
            )


# --------------------------------------------------------------------------------------------
# reading bytes
# --------------------------------------------------------------------------------------------


def _read_bytes(file: Path) -> bytes:
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise _fail(file, f"cannot read the file ({exc.strerror or exc})") from None
    if not data.strip():
        raise _fail(file, "the file is empty")
    return data


def _read_text(file: Path) -> str:
    """UTF-8 text (a byte-order mark is dropped); undecodable bytes are reported by line."""
    data = _read_bytes(file)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise _fail(
            file,
            f"bytes {data[exc.start:exc.end]!r} at offset {exc.start} are not UTF-8 (save the file as UTF-8)",
            f"line {line}",
        ) from None
    if not text.strip():
        raise _fail(file, "the file is empty")
    return text


def _unique_ids(
    items: list[tuple[str, int, bool]], file: Path, unit: str, warn: WarningSink
) -> list[str]:
    """Ids for (id, position, derived) items: a repeated derived id gets `-<position>` appended
    (the first keeps it); a repeated explicit id is an error, since the tenant chose it."""
    first_at: dict[str, int] = {}
    result = []
    for doc_id, position, derived in items:
        if doc_id not in first_at:
            first_at[doc_id] = position
            result.append(doc_id)
            continue
        if not derived:
            raise _fail(file, f"id {doc_id!r} is already used on {unit} {first_at[doc_id]}", f"{unit} {position}")
        unique = f"{doc_id}-{position}"
        warn(
            f"{file}: {unit} {position}: same title as {unit} {first_at[doc_id]} (derived id {doc_id}); "
            f"imported as {unique}"
        )
        first_at.setdefault(unique, position)
        result.append(unique)
    return result


# --------------------------------------------------------------------------------------------
# JSONL
# --------------------------------------------------------------------------------------------

_JSONL_FIELDS = frozenset({"id", "title", "text", "url", "sections"})


def import_jsonl(file: Path, *, on_warning: WarningSink | None = None) -> list[Document]:
    """One JSON object per line: `id`, `title`, `text`, optional `url` and `sections`
    ([{heading, text}]); other string fields become metadata. Blank lines are skipped."""
    warn = on_warning or _log_warning
    parsed: list[tuple[int, dict[str, Any]]] = []
    # Split on "\n" only: JSON strings may hold U+2028 and other characters `splitlines` splits on.
    for number, line in enumerate(_read_text(file).split("\n"), start=1):
        if line.strip():
            parsed.append((number, _json_object(file, number, line)))
    docs = [_jsonl_document(file, number, obj) for number, obj in parsed]
    ids = _unique_ids(
        [(doc.id, number, obj.get("id") is None) for doc, (number, obj) in zip(docs, parsed, strict=True)],
        file, "line", warn,
    )
    return [_with_id(doc, doc_id) for doc, doc_id in zip(docs, ids, strict=True)]


def _json_object(file: Path, number: int, line: str) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        raise _fail(file, f"not valid JSON ({exc.msg} at column {exc.colno})", f"line {number}") from None
    if not isinstance(value, dict):
        raise _fail(file, f"expected a JSON object, got {type(value).__name__}", f"line {number}")
    return value


def _jsonl_document(file: Path, number: int, obj: dict[str, Any]) -> Document:
    where = f"line {number}"

    def string(name: str) -> str:
        value = obj.get(name)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise _fail(file, f"{name!r} must be a string, got {type(value).__name__}", where)
        return value.strip()

    title, text = string("title"), string("text")
    sections = ([Section("", text)] if text else []) + _jsonl_sections(file, where, obj.get("sections"))
    if not title and not sections:
        raise _fail(file, "the document has neither a title nor any text", where)
    return Document(
        id=_jsonl_id(file, where, obj.get("id"), title or text),
        title=title,
        sections=tuple(sections),
        url=string("url"),
        source=file.name,
        metadata={k: v for k, v in obj.items() if k not in _JSONL_FIELDS and isinstance(v, str)},
    )


def _jsonl_id(file: Path, where: str, value: object, key: str) -> str:
    if value is None:
        return derived_document_id(key)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _fail(file, f"'id' must be a string or an integer, got {type(value).__name__}", where)
    doc_id = str(value).strip()
    if not doc_id:
        raise _fail(file, "'id' is empty (leave it out to derive one from the title)", where)
    return doc_id


def _jsonl_sections(file: Path, where: str, value: object) -> list[Section]:
    if value is None:
        return []
    if not isinstance(value, list):
        kind = type(value).__name__
        raise _fail(file, f"'sections' must be a list of {{heading, text}} objects, got {kind}", where)
    sections = []
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise _fail(file, f"sections[{index}] must be an object, got {type(item).__name__}", where)
        heading, text = item.get("heading") or "", item.get("text") or ""
        if not isinstance(heading, str) or not isinstance(text, str):
            raise _fail(file, f"sections[{index}]: 'heading' and 'text' must be strings", where)
        if text.strip():
            sections.append(Section(" ".join(heading.split()), text.strip()))
    return sections


def _with_id(doc: Document, doc_id: str) -> Document:
    if doc.id == doc_id:
        return doc
    return Document(doc_id, doc.title, doc.sections, doc.url, doc.source, doc.metadata)


# --------------------------------------------------------------------------------------------
# CSV FAQ
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CsvColumns:
    """Which CSV columns hold a FAQ entry's parts. The defaults read the COVID-QA FAQ layout.

    `id=None`: ids are derived from the question. `url=None`: no link column. `metadata=None`:
    every other column (except `ignore`) becomes metadata; a tuple names exactly which. Empty
    values are left out of the metadata.
    """

    id: str | None = None
    title: str = "question"
    text: str = "answer"
    url: str | None = "link"
    metadata: tuple[str, ...] | None = None
    # The COVID-QA layout carries an HTML copy of each answer: not useful as metadata.
    ignore: tuple[str, ...] = ("answer_html",)

    @classmethod
    def parse(cls, spec: str) -> CsvColumns:
        """From a CLI string such as `title=question,text=answer,id=faq_id,metadata=source;lang`.

        Keys not given keep their defaults; `id=`, `url=` or `metadata=` with no value turn that
        part off; list values (`metadata`, `ignore`) are separated by ";" or given repeatedly.
        """
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {}
        for item in (part.strip() for part in spec.split(",")):
            if not item:
                continue
            key, sep, value = (s.strip() for s in item.partition("="))
            if not sep or key not in known:
                raise DocumentImportError(
                    f"CSV column mapping {item!r}: expected key=column with key one of {', '.join(sorted(known))}"
                )
            if key in ("metadata", "ignore"):
                names = tuple(n.strip() for n in value.split(";") if n.strip())
                values[key] = tuple(values.get(key) or ()) + names
            elif key in ("title", "text") and not value:
                raise DocumentImportError(f"CSV column mapping {item!r}: {key} needs a column name")
            else:
                values[key] = value or None
        return cls(**values)

    def missing_from(self, header: list[str]) -> list[str]:
        wanted = [self.title, self.text, self.id, self.url, *(self.metadata or ())]
        return [name for name in wanted if name is not None and name not in header]

    def metadata_columns(self, header: list[str]) -> list[str]:
        if self.metadata is not None:
            return list(self.metadata)
        taken = {self.id, self.title, self.text, self.url, *self.ignore}
        return [name for name in header if name not in taken]


def import_csv(
    file: Path, columns: CsvColumns | None = None, *, on_warning: WarningSink | None = None
) -> list[Document]:
    """One document per row: the question is the title, the answer its one section.

    Without an id column the id is derived from the question; a question asked twice in one file
    keeps the id on its first row and gets `-<row>` appended on the later ones (with a warning),
    so no entry is lost and the ids stay the same on the next import of the same file.
    """
    columns = columns or CsvColumns()
    warn = on_warning or _log_warning
    rows = _csv_rows(file, _read_text(file))
    header = next(rows, None)
    if header is None:
        raise _fail(file, "the file is empty")
    names = [name.strip() for name in header[1]]
    missing = columns.missing_from(names)
    if missing:
        raise _fail(
            file,
            f"missing column(s) {', '.join(map(repr, missing))} (the header has {', '.join(map(repr, names))}; "
            "map columns with e.g. title=question,text=answer,url=)",
            "header",
        )
    meta_columns = columns.metadata_columns(names)
    docs: list[Document] = []
    positions: list[tuple[str, int, bool]] = []
    for number, (line, values) in enumerate(rows, start=1):
        if not any(v.strip() for v in values):
            continue
        where = f"row {number} (line {line})"
        if len(values) != len(names):
            raise _fail(file, f"{len(values)} fields, but the header has {len(names)}", where)
        row = dict(zip(names, values, strict=True))
        doc = _csv_document(file, where, row, columns, meta_columns)
        docs.append(doc)
        positions.append((doc.id, number, columns.id is None))
    if not docs:
        raise _fail(file, "the file has a header but no rows")
    ids = _unique_ids(positions, file, "row", warn)
    return [_with_id(doc, doc_id) for doc, doc_id in zip(docs, ids, strict=True)]


def _csv_rows(file: Path, text: str) -> Iterator[tuple[int, list[str]]]:
    """(first line number, fields) of each record; quoted fields may span lines."""
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    line = 1
    while True:
        try:
            values = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise _fail(file, f"not valid CSV ({exc})", f"line {reader.line_num}") from None
        yield line, values
        line = reader.line_num + 1


def _csv_document(
    file: Path, where: str, row: Mapping[str, str], columns: CsvColumns, meta_columns: list[str]
) -> Document:
    title, text = " ".join(row[columns.title].split()), row[columns.text].strip()
    if not title and not text:
        raise _fail(file, f"neither a title ({columns.title!r}) nor a text ({columns.text!r})", where)
    if columns.id is None:
        doc_id = derived_document_id(title or text, prefix="faq")
    else:
        doc_id = row[columns.id].strip()
        if not doc_id:
            raise _fail(file, f"the id column {columns.id!r} is empty", where)
    return Document(
        id=doc_id,
        title=title,
        sections=(Section("", text),) if text else (),
        url=row[columns.url].strip() if columns.url else "",
        source=file.name,
        metadata={name: row[name].strip() for name in meta_columns if row[name].strip()},
    )


# --------------------------------------------------------------------------------------------
# sections from a stream of headings and blocks (Markdown and HTML)
# --------------------------------------------------------------------------------------------


class _SectionBuilder:
    """Collects text blocks under the path of headings above them ("Setup > Wi-Fi").

    Lines (list items, table rows) following each other are joined by one newline, other blocks
    by a blank line, so the chunker sees paragraphs. Sections with no text are dropped: their
    heading lives on in the path of the sections below them.
    """

    def __init__(self) -> None:
        self._path: list[tuple[int, str]] = []
        self._sections: list[Section] = []
        self._parts: list[str] = []
        self._last_was_line = False

    def heading(self, level: int, text: str) -> None:
        self._flush()
        while self._path and self._path[-1][0] >= level:
            self._path.pop()
        if text:
            self._path.append((level, text))

    def block(self, text: str, *, line: bool = False) -> None:
        text = text.strip()
        if not text:
            return
        if self._parts:
            self._parts.append("\n" if line and self._last_was_line else "\n\n")
        self._parts.append(text)
        self._last_was_line = line

    def finish(self) -> tuple[Section, ...]:
        self._flush()
        return tuple(self._sections)

    def _flush(self) -> None:
        if self._parts:
            heading = " > ".join(text for _, text in self._path)
            self._sections.append(Section(heading, "".join(self._parts)))
        self._parts = []
        self._last_was_line = False


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _is_title_heading(level: int, text: str, title: str) -> bool:
    """The first H1 names the document (when nothing else did, or it says the same): it is the
    title, not a section heading."""
    return level == 1 and (not title or normalise_title(title) == normalise_title(text))


# --------------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------------


def _markdown_parser() -> MarkdownIt:
    return MarkdownIt("commonmark").enable(["table", "strikethrough"]).use(front_matter_plugin)


def import_markdown(file: Path, *, doc_id: str, source: str) -> Document:
    """A Markdown file: title from the front matter's `title`, else the first H1, else the file
    stem; one section per heading; plain text (markup dropped, list items and code kept)."""
    tokens = _markdown_parser().parse(_read_text(file))
    front = _front_matter(file, tokens)
    walker = _MarkdownWalker(front.pop("title", ""))
    for index, token in enumerate(tokens):
        walker.visit(token, tokens[index + 1] if index + 1 < len(tokens) else None)
    sections = walker.builder.finish()
    if not sections and not walker.title.strip():
        raise _fail(file, "no text found (the document has neither a title nor any text)")
    return _markup_document(file, doc_id, source, _one_line(walker.title) or file.stem, sections, metadata=front)


class _MarkdownWalker:
    """Turns markdown-it's flat token stream into headings and plain-text blocks."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.builder = _SectionBuilder()
        self._title_heading_seen = False
        self._in_heading = False
        self._list_depth = 0
        self._row: list[str] | None = None

    def visit(self, token: Token, following: Token | None) -> None:
        kind = token.type
        if kind in ("bullet_list_open", "ordered_list_open", "bullet_list_close", "ordered_list_close"):
            self._list_depth += 1 if kind.endswith("_open") else -1
        elif kind == "tr_open":
            self._row = []
        elif kind == "tr_close":
            self.builder.block(" | ".join(cell for cell in self._row or [] if cell), line=True)
            self._row = None
        elif kind == "heading_open" and following is not None:
            self._heading(int(token.tag[1:]), _inline_text(following))
        elif kind == "inline":
            self._inline(token)
        elif kind in ("fence", "code_block"):
            self.builder.block(token.content.rstrip("\n"), line=self._list_depth > 0)
        elif kind == "html_block":
            self.builder.block(_html_fragment_text(token.content), line=self._list_depth > 0)
        if kind in ("heading_open", "heading_close"):
            self._in_heading = kind == "heading_open"

    def _heading(self, level: int, text: str) -> None:
        if not self._title_heading_seen and _is_title_heading(level, text, self.title):
            # The title heading: not part of any section's heading path.
            self._title_heading_seen, self.title = True, self.title or text
            self.builder.heading(1, "")
        else:
            self.builder.heading(level, _one_line(text))

    def _inline(self, token: Token) -> None:
        if self._in_heading:
            return
        if self._row is not None:
            self._row.append(_one_line(_inline_text(token)))
        else:
            self.builder.block(_inline_text(token), line=self._list_depth > 0)


def _inline_text(token: Token) -> str:
    """Plain text of an inline token: text, code spans and image alt text; markup dropped."""
    parts = []
    for child in token.children or []:
        if child.type in ("text", "code_inline", "image"):
            parts.append(child.content)
        elif child.type == "softbreak":
            parts.append(" ")
        elif child.type == "hardbreak":
            parts.append("\n")
    return "".join(parts)


def _front_matter(file: Path, tokens: list[Token]) -> dict[str, str]:
    """String fields of a YAML front matter block (static-site exports put the title there)."""
    block = next((t for t in tokens if t.type == "front_matter"), None)
    if block is None:
        return {}
    try:
        data = yaml.safe_load(block.content)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 2}" if mark is not None else "front matter"
        raise _fail(file, f"the front matter is not valid YAML ({getattr(exc, 'problem', exc)})", where) from None
    if not isinstance(data, dict):
        return {}
    return {str(k): " ".join(v.split()) for k, v in data.items() if isinstance(v, str) and v.strip()}


def _html_fragment_text(markup: str) -> str:
    """Text of raw HTML inside Markdown (scripts, styles and comments dropped)."""
    from lxml import html as lxml_html
    from lxml.etree import ParserError

    try:
        root = lxml_html.fragment_fromstring(markup, create_parent="div")
    except (ParserError, ValueError):
        return ""
    for element in root.xpath(".//script|.//style"):
        element.drop_tree()
    return _one_line(root.text_content())


def _markup_document(
    file: Path, doc_id: str, source: str, title: str, sections: tuple[Section, ...],
    *, url: str = "", metadata: dict[str, str] | None = None,
) -> Document:
    if not title and not sections:
        raise _fail(file, "the document has neither a title nor any text")
    return Document(doc_id, title, sections, url=url, source=source, metadata=metadata or {})


# --------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------


def import_html(file: Path, *, doc_id: str, source: str) -> Document:
    """A web page's main text (trafilatura: navigation, footers, scripts and cookie banners are
    left out), split into sections by its headings. Nothing is fetched: the bytes are parsed as
    given (trafilatura detects their encoding from the page)."""
    import trafilatura  # imported here: it takes a while and only HTML needs it

    data = _read_bytes(file)
    extracted = trafilatura.bare_extraction(
        data,
        with_metadata=True,
        favor_precision=True,  # help pages: better lose a stray line than keep a menu
        include_comments=False,
        include_tables=True,
        include_formatting=True,
        include_links=False,
        include_images=False,
    )
    if extracted is None or extracted.body is None:
        metadata = trafilatura.extract_metadata(data)
        title = _one_line(metadata.title or "") if metadata is not None else ""
        if not title:
            raise _fail(file, "no main text and no title found in the page")
        return _markup_document(file, doc_id, source, title, ())
    title = _one_line(extracted.title or "")
    builder = _SectionBuilder()
    title = _html_sections(extracted.body, title, builder)
    sections = builder.finish()
    if not sections and not title:
        raise _fail(file, "no text found (the page has neither a title nor any main text)")
    return _markup_document(
        file, doc_id, source, title or file.stem, sections, url=(extracted.url or "").strip()
    )


def _html_sections(body: _Element, title: str, builder: _SectionBuilder) -> str:
    """Feed trafilatura's body (head/p/list/table/code/quote elements) to `builder`; returns the
    title (the first h1 when the page gave none)."""
    title_heading_seen = False
    for element in body:
        tag = element.tag
        if tag == "head":
            text = _one_line(_element_text(element))
            level = _heading_level(element.get("rend", ""))
            if not title_heading_seen and _is_title_heading(level, text, title):
                title_heading_seen, title = True, title or text
                builder.heading(1, "")
            else:
                builder.heading(level, text)
        elif tag == "list":
            for item in _list_items(element):
                builder.block(item, line=True)
        elif tag == "table":
            for table_row in element.iter("row"):
                cells = (_one_line(_element_text(cell)) for cell in table_row.iter("cell"))
                builder.block(" | ".join(c for c in cells if c), line=True)
        else:
            builder.block(_element_text(element))
    return title


def _heading_level(rend: str) -> int:
    """trafilatura writes the source heading as rend="h2"; unknown means a level-2 heading."""
    digits = rend[1:] if rend[:1].lower() == "h" else ""
    return int(digits) if digits.isdigit() and 1 <= int(digits) <= 6 else 2


def _list_items(element: _Element) -> list[str]:
    """One line per list item, nested lists flattened in document order."""
    items = []
    for item in element.iter("item"):
        own = [item.text or ""]
        for child in item:
            if child.tag != "list":
                own.append(_element_text(child))
            own.append(child.tail or "")
        items.append(_one_line("".join(own)))
    return [item for item in items if item]


def _element_text(element: _Element) -> str:
    """Text of an element with its line breaks (`lb`) kept; the other inline markup dropped."""
    parts = [element.text or ""]
    for child in element:
        parts.append("\n" if child.tag == "lb" else _element_text(child))
        parts.append(child.tail or "")
    return "".join(parts)
