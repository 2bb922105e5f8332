"""Importers (JSONL, CSV FAQ, Markdown, HTML) and chunking of a tenant's knowledge base."""

from __future__ import annotations

import itertools
import json
import shutil
import socket
from pathlib import Path

import pytest

from adaptive_rag.errors import AdaptiveRagError
from adaptive_rag.knowledge.chunking import chunk_document, chunk_documents
from adaptive_rag.knowledge.documents import Document, Section, derived_document_id
from adaptive_rag.knowledge.importers import (
    SUPPORTED_SUFFIXES,
    CsvColumns,
    DocumentImportError,
    import_path,
    import_paths,
)
from adaptive_rag.settings import Settings

REPO = Path(__file__).resolve().parents[2]
COVID_FAQ = "covid-faq_en_covid-qa.csv"


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def jsonl(path: Path, *objects: object) -> Path:
    return write(path, "\n".join(json.dumps(o, ensure_ascii=False) for o in objects) + "\n")


# ---------------------------------------------------------------------------------------------
# JSONL
# ---------------------------------------------------------------------------------------------


def test_jsonl_fields_sections_and_metadata(tmp_path: Path) -> None:
    file = jsonl(
        tmp_path / "kb.jsonl",
        {"id": "a-1", "title": "Reset", "text": "Hold the button.", "url": "https://x/a", "lang": "en", "rank": 3},
        {
            "title": "Wi-Fi",
            "sections": [{"heading": "Setup", "text": "Pick the network."}, {"heading": "Empty", "text": "  "}],
        },
        {"id": 7, "text": "Text only, line\u2028separator inside."},
    )
    a, b, c = import_path(file)
    assert (a.id, a.title, a.text, a.url, a.source) == ("a-1", "Reset", "Hold the button.", "https://x/a", "kb.jsonl")
    assert a.metadata == {"lang": "en"}  # only string fields become metadata
    assert b.id == derived_document_id("Wi-Fi")
    assert b.sections == (Section("Setup", "Pick the network."),)
    assert c.id == "7" and c.title == "" and "\u2028" in c.text


def test_jsonl_text_comes_before_sections(tmp_path: Path) -> None:
    sections = [{"heading": "H", "text": "Body."}]
    file = jsonl(tmp_path / "kb.jsonl", {"id": "x", "title": "T", "text": "Intro.", "sections": sections})
    (doc,) = import_path(file)
    assert doc.sections == (Section("", "Intro."), Section("H", "Body."))


def test_jsonl_repeated_derived_id_is_made_unique_with_a_warning(tmp_path: Path) -> None:
    file = jsonl(tmp_path / "kb.jsonl", {"title": "Same", "text": "one"}, {"title": "same ", "text": "two"})
    warnings: list[str] = []
    first, second = import_path(file, on_warning=warnings.append)
    assert first.id == derived_document_id("Same")
    assert second.id == f"{first.id}-2"
    assert len(warnings) == 1 and "line 2" in warnings[0] and "line 1" in warnings[0]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"id": "a", "title": "x"}\n{"id": "b", "title": }\n', r"kb\.jsonl: line 2: not valid JSON"),
        ('["a"]\n', r"line 1: expected a JSON object, got list"),
        ('{"id": "a", "url": "u"}\n', r"line 1: the document has neither a title nor any text"),
        ('{"id": "a", "title": "   ", "text": ""}\n', r"line 1: the document has neither a title nor any text"),
        ('{"id": [1], "title": "x"}\n', r"line 1: 'id' must be a string or an integer"),
        ('{"id": "", "title": "x"}\n', r"line 1: 'id' is empty"),
        ('{"id": "a", "title": 5}\n', r"line 1: 'title' must be a string, got int"),
        ('{"id": "a", "title": "x", "sections": "no"}\n', r"line 1: 'sections' must be a list"),
        ('{"id": "a", "title": "x", "sections": [{"text": 1}]}\n', r"line 1: sections\[0\]"),
        ('{"id": "a", "title": "x"}\n\n{"id": "a", "title": "y"}\n', r"line 3: id 'a' is already used on line 1"),
        ("\n  \n", r"kb\.jsonl: the file is empty"),
    ],
)
def test_jsonl_errors_name_file_and_line(tmp_path: Path, content: str, expected: str) -> None:
    file = write(tmp_path / "kb.jsonl", content)
    with pytest.raises(DocumentImportError, match=expected):
        import_path(file)


def test_undecodable_bytes_are_reported_with_their_line(tmp_path: Path) -> None:
    file = write(tmp_path / "kb.jsonl", b'{"id": "a", "title": "ok"}\n{"id": "b", "title": "caf\xe9"}\n')
    with pytest.raises(DocumentImportError, match=r"kb\.jsonl: line 2: bytes .* are not UTF-8"):
        import_path(file)


def test_import_error_is_a_library_error() -> None:
    assert issubclass(DocumentImportError, AdaptiveRagError)


# ---------------------------------------------------------------------------------------------
# CSV
# ---------------------------------------------------------------------------------------------


def test_csv_columns_parse() -> None:
    assert CsvColumns.parse("") == CsvColumns()
    parsed = CsvColumns.parse("title=q, text=a ,id=faq_id,url=,metadata=lang;topic,metadata=site")
    assert parsed == CsvColumns(id="faq_id", title="q", text="a", url=None, metadata=("lang", "topic", "site"))
    assert CsvColumns.parse("metadata=").metadata == ()
    with pytest.raises(DocumentImportError, match="expected key=column"):
        CsvColumns.parse("question")
    with pytest.raises(DocumentImportError, match="expected key=column"):
        CsvColumns.parse("colour=red")
    with pytest.raises(DocumentImportError, match="title needs a column name"):
        CsvColumns.parse("title=")


def test_csv_with_mapping_and_id_column(tmp_path: Path) -> None:
    file = write(
        tmp_path / "faq.csv",
        "\ufeffkey,q,a,topic,extra\n"
        'k1,How do I reset?,"Hold the button.\n\nThen wait.",router,\n'
        ",,,,\n"
        "k2,Where is the label?,Under the router.,router,x\n",
    )
    docs = import_path(file, csv_columns=CsvColumns.parse("id=key,title=q,text=a,url=,metadata=topic"))
    assert [d.id for d in docs] == ["k1", "k2"]
    assert docs[0].text == "Hold the button.\n\nThen wait."
    assert docs[0].metadata == {"topic": "router"} and docs[0].url == "" and docs[0].source == "faq.csv"


def test_csv_without_id_column_derives_faq_ids(tmp_path: Path) -> None:
    file = write(tmp_path / "faq.csv", "question,answer,link,lang\nWhat?,This.,\"\n https://x/1 \",en\n")
    (doc,) = import_path(file)
    assert doc.id == derived_document_id("What?", prefix="faq")
    assert doc.url == "https://x/1" and doc.metadata == {"lang": "en"}


@pytest.mark.parametrize(
    ("content", "columns", "expected"),
    [
        ("q,a\nx,y\n", None, r"faq\.csv: header: missing column\(s\) 'question', 'answer', 'link'"),
        ("question,answer\nx,y\n", "url=,metadata=topic", r"missing column\(s\) 'topic'"),
        ("question,answer\nx,y\nz\n", "url=", r"faq\.csv: row 2 \(line 3\): 1 fields, but the header has 2"),
        ('question,answer\n"x,y\n', "url=", r"faq\.csv: line \d+: not valid CSV"),
        ("question,answer\n", "url=", r"the file has a header but no rows"),
        ("question,answer\n , \n x, y\n", "url=", None),  # blank row skipped, not an error
        ("question,answer\nx,y\n,\n\t,  \n", "url=", None),
        ("question,answer,n\nx,y,1\n , ,2\n", "url=", r"row 2 \(line 3\): neither a title \('question'\) nor a text"),
        ("id,question,answer\n1,x,y\n1,z,w\n", "id=id,url=", r"row 2: id '1' is already used on row 1"),
        ("id,question,answer\n,x,y\n", "id=id,url=", r"row 1 \(line 2\): the id column 'id' is empty"),
    ],
)
def test_csv_errors_name_file_and_row(tmp_path: Path, content: str, columns: str | None, expected: str | None) -> None:
    file = write(tmp_path / "faq.csv", content)
    mapping = CsvColumns.parse(columns) if columns is not None else None
    if expected is None:
        assert import_path(file, csv_columns=mapping)
        return
    with pytest.raises(DocumentImportError, match=expected):
        import_path(file, csv_columns=mapping)


def covid_faq_path() -> Path:
    data_dir = Settings(_env_file=None).data_dir
    return (data_dir if data_dir.is_absolute() else REPO / data_dir).resolve() / COVID_FAQ


def test_covid_faq_imports_as_is_with_the_defaults() -> None:
    warnings: list[str] = []
    docs = import_path(covid_faq_path(), on_warning=warnings.append)
    assert len(docs) == 213
    assert len({d.id for d in docs}) == 213
    # Five questions are asked twice: the later row keeps its entry under "<id>-<row>".
    assert len(warnings) == 5
    assert sum(1 for d in docs if d.id.count("-") == 2) == 5
    assert all(d.id.startswith("faq-") and d.source == COVID_FAQ for d in docs)
    assert all(d.url.startswith("https://") for d in docs)  # the leading newline is stripped
    first = docs[0]
    assert first.title == "What is a novel coronavirus?"
    assert "\n\nA diagnosis with coronavirus 229E" in first.text  # multi-line quoted answer
    assert first.metadata["source"] == "Center for Disease Control and Prevention (CDC)"
    assert {"category", "country", "last_update", "lang"} <= set(first.metadata)
    assert not any("answer_html" in d.metadata for d in docs)
    assert all(d.title and d.text for d in docs)


def test_covid_faq_reimport_gives_identical_ids_and_chunks() -> None:
    first, second = import_path(covid_faq_path()), import_path(covid_faq_path())
    assert [d.id for d in first] == [d.id for d in second]
    chunks = chunk_documents(first)
    assert chunks == chunk_documents(second)
    assert len(chunks) == 261
    assert all(len(c.text.split()) <= 160 for c in chunks)


# ---------------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------------

MARKDOWN = """# Router *help*

Intro with **bold**, `code` and a [link](https://example.com/x).
Second line of the intro.

## Setup

Plug it in.

### Wi-Fi

- first item
- second item with *emphasis*
  - nested item

```bash
ping 192.168.1.1
```

| Light | Meaning |
|-------|---------|
| red   | broken  |

<div class="note">Raw <b>HTML</b> note<script>evil()</script></div>

![diagram of the router](router.png)

## Troubleshooting

#### Deep heading

Restart it.

# Appendix

Last words.
"""


def test_markdown_sections_follow_the_heading_path(tmp_path: Path) -> None:
    (doc,) = import_path(write(tmp_path / "router.md", MARKDOWN))
    assert doc.title == "Router help"
    assert doc.id == derived_document_id("router.md", prefix="md") and doc.source == "router.md"
    assert [s.heading for s in doc.sections] == [
        "", "Setup", "Setup > Wi-Fi", "Troubleshooting > Deep heading", "Appendix",
    ]
    intro, setup, wifi, deep, appendix = (s.text for s in doc.sections)
    assert intro == "Intro with bold, code and a link. Second line of the intro."
    assert setup == "Plug it in."
    assert wifi.splitlines()[:3] == ["first item", "second item with emphasis", "nested item"]
    assert "ping 192.168.1.1" in wifi and "red | broken" in wifi and "Raw HTML note" in wifi
    assert "diagram of the router" in wifi
    for markup in ("**", "`", "](", "<", "|---", "#", "evil"):
        assert markup not in doc.text
    assert (deep, appendix) == ("Restart it.", "Last words.")


def test_markdown_title_from_front_matter_or_file_stem(tmp_path: Path) -> None:
    front = write(tmp_path / "a.md", "---\ntitle: Wi-Fi help\nowner: support\ntags: [x]\n---\n# Wi-Fi help\n\nText.\n")
    (doc,) = import_path(front)
    assert doc.title == "Wi-Fi help" and doc.metadata == {"owner": "support"}
    assert doc.sections == (Section("", "Text."),)
    (plain,) = import_path(write(tmp_path / "no-heading.markdown", "## Part\n\nBody.\n"))
    assert plain.title == "no-heading" and plain.sections == (Section("Part", "Body."),)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("   \n\n", r"x\.md: the file is empty"),
        ("---\n\n---\n", r"x\.md: no text found"),
        ("---\ntitle: [unclosed\n---\nText.\n", r"x\.md: line \d+: the front matter is not valid YAML"),
    ],
)
def test_markdown_errors(tmp_path: Path, content: str, expected: str) -> None:
    with pytest.raises(DocumentImportError, match=expected):
        import_path(write(tmp_path / "x.md", content))


# ---------------------------------------------------------------------------------------------
# HTML
# ---------------------------------------------------------------------------------------------

HTML = """<!DOCTYPE html>
<html lang="en"><head>
<meta charset="utf-8"><title>Setting up your router</title>
<link rel="canonical" href="https://help.example.com/router">
<script>var tracker = "SCRIPTJUNK";</script><style>.x { color: red } /* STYLEJUNK */</style>
</head><body>
<nav class="menu"><ul><li><a href="/">Home NAVJUNK</a></li><li><a href="/products">Products</a></li></ul></nav>
<div id="cookie-banner" class="cookie-consent">We use cookies COOKIEJUNK to improve your visit. <button>Accept all</button></div>
<main><article>
<h1>Setting up your router</h1>
<p>This guide explains how to set up the Acme router at home. It takes about ten minutes and needs no tools.</p>
<h2>Setup</h2>
<p>Plug the router into the wall socket and wait for the light to turn green. Then connect the cable to your modem.</p>
<h3>Wi-Fi</h3>
<p>Open the Wi-Fi settings on your phone and pick the network printed on the label under the router.</p>
<ul><li>Network name: on the label</li><li>Password: also on the label</li></ul>
<h2>Troubleshooting</h2>
<p>If the light stays red, restart the router by holding the reset button for ten seconds.</p>
<script>document.write("INLINESCRIPTJUNK")</script>
</article></main>
<footer><p>Copyright 2024 Acme Inc FOOTERJUNK. All rights reserved.</p><a href="/privacy">Privacy policy</a></footer>
</body></html>
"""


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """HTML import must not fetch anything: any connection attempt fails the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the importer tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.mark.usefixtures("no_network")
def test_html_main_text_without_boilerplate(tmp_path: Path) -> None:
    (doc,) = import_path(write(tmp_path / "router.html", HTML))
    assert doc.title == "Setting up your router"
    assert doc.id == derived_document_id("router.html", prefix="html") and doc.source == "router.html"
    assert doc.url == "https://help.example.com/router"
    assert [s.heading for s in doc.sections] == ["", "Setup", "Setup > Wi-Fi", "Troubleshooting"]
    assert "takes about ten minutes" in doc.sections[0].text
    assert "Network name: on the label\nPassword: also on the label" in doc.sections[2].text
    assert "restart the router" in doc.sections[3].text
    junks = ("NAVJUNK", "COOKIEJUNK", "cookies", "SCRIPTJUNK", "STYLEJUNK", "INLINESCRIPTJUNK", "FOOTERJUNK", "Privacy")
    for junk in (*junks, "<", "Accept all"):
        assert junk not in doc.text


@pytest.mark.usefixtures("no_network")
def test_html_in_another_encoding_and_title_only_page(tmp_path: Path) -> None:
    latin = HTML.replace('charset="utf-8"', 'charset="iso-8859-1"').replace("ten minutes", "dix minutes à peine")
    (doc,) = import_path(write(tmp_path / "latin.htm", latin.encode("iso-8859-1")))
    assert "dix minutes à peine" in doc.text
    page = "<html><head><title>Only a title</title></head><body></body></html>"
    (titled,) = import_path(write(tmp_path / "t.html", page))
    assert titled.title == "Only a title" and titled.sections == ()
    with pytest.raises(DocumentImportError, match=r"empty\.html: the file is empty"):
        import_path(write(tmp_path / "empty.html", " \n"))
    with pytest.raises(DocumentImportError, match=r"blank\.html: no main text and no title"):
        import_path(write(tmp_path / "blank.html", "<html><body><div></div></body></html>"))


# ---------------------------------------------------------------------------------------------
# directories, dispatch, ids
# ---------------------------------------------------------------------------------------------


def make_help_centre(root: Path) -> Path:
    write(root / "setup" / "wifi.md", "# Wi-Fi\n\nPick the network.\n")
    write(root / "index.md", "# Home\n\nWelcome.\n")
    write(root / "pages" / "router.HTML", HTML)
    write(root / "faq.csv", "question,answer,link\nWhat?,This.,https://x\n")
    jsonl(root / "articles.jsonl", {"id": "art-1", "title": "Article", "text": "Body."})
    write(root / "notes.txt", "not imported")
    write(root / ".git" / "HEAD.md", "# hidden\n\nnever imported\n")
    return root


@pytest.mark.usefixtures("no_network")
def test_directory_walk_is_sorted_and_ids_are_relative(tmp_path: Path) -> None:
    root = make_help_centre(tmp_path / "help")
    docs = import_path(root)
    assert [d.title for d in docs] == ["Article", "What?", "Home", "Setting up your router", "Wi-Fi"]
    by_title = {d.title: d for d in docs}
    assert by_title["Wi-Fi"].id == derived_document_id("setup/wifi.md", prefix="md")
    assert by_title["Setting up your router"].id == derived_document_id("pages/router.HTML", prefix="html")
    assert by_title["Wi-Fi"].source == str(root)
    assert by_title["What?"].source == "faq.csv" and by_title["Article"].source == "articles.jsonl"
    # The same tree somewhere else gives the same ids (nothing machine-specific in them).
    moved = shutil.copytree(root, tmp_path / "elsewhere" / "copy")
    assert [d.id for d in import_path(moved)] == [d.id for d in docs]
    # A single file's id is its file name's.
    (single,) = import_path(root / "setup" / "wifi.md")
    assert single.id == derived_document_id("wifi.md", prefix="md") and single.source == "wifi.md"


def test_dispatch_errors(tmp_path: Path) -> None:
    unsupported = r"notes\.txt: unsupported file type '\.txt' \(supported: .*\.csv.*\.md"
    with pytest.raises(DocumentImportError, match=unsupported):
        import_path(write(tmp_path / "notes.txt", "x"))
    with pytest.raises(DocumentImportError, match="no such file or directory"):
        import_path(tmp_path / "missing.md")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DocumentImportError, match="no supported files in this directory"):
        import_path(tmp_path / "empty")
    assert ".htm" in SUPPORTED_SUFFIXES and ".markdown" in SUPPORTED_SUFFIXES


def test_import_paths_refuses_colliding_ids(tmp_path: Path) -> None:
    a = write(tmp_path / "a" / "page.md", "# One\n\nFirst.\n")
    b = write(tmp_path / "b" / "page.md", "# Two\n\nSecond.\n")
    with pytest.raises(DocumentImportError, match="is given twice"):
        import_paths([a, b])
    c = write(tmp_path / "c.md", "# Three\n\nThird.\n")
    assert [d.title for d in import_paths([a, c])] == ["One", "Three"]


# ---------------------------------------------------------------------------------------------
# chunking
# ---------------------------------------------------------------------------------------------


def numbered_text(sentences: int, words_per_sentence: int, start: int = 0) -> str:
    """Sentences of unique words w<i>, so a chunk's position in the text is unambiguous."""
    out, index = [], start
    for _ in range(sentences):
        words = [f"w{index + k}" for k in range(words_per_sentence)]
        index += words_per_sentence
        out.append(" ".join(words) + ".")
    return " ".join(out)


def word_positions(chunk: str) -> list[int]:
    return [int(word.strip(".")[1:]) for word in chunk.split()]


def doc_of(*sections: Section, title: str = "Doc") -> Document:
    return Document("d1", title, tuple(sections))


def assert_tiles(chunks: list[str], total: int, max_words: int) -> list[tuple[int, int]]:
    """Chunks are contiguous word ranges, within bounds, moving forward, covering every word."""
    spans = []
    for chunk in chunks:
        positions = word_positions(chunk)
        assert positions == list(range(positions[0], positions[0] + len(positions)))
        assert 0 < len(positions) <= max_words
        spans.append((positions[0], positions[-1] + 1))
    assert spans[0][0] == 0 and spans[-1][1] == total
    for (s1, e1), (s2, e2) in itertools.pairwise(spans):
        assert s1 < s2 <= e1 < e2  # forward, no gap
    return spans


def test_chunk_ids_titles_sections_and_positions() -> None:
    doc = Document(
        "kb-1",
        "Router",
        (Section("Setup", numbered_text(30, 10)), Section("", "   \n "), Section("Setup > Wi-Fi", "Short one.")),
    )
    chunks = chunk_document(doc)
    assert [c.id for c in chunks] == [f"kb-1#{i}" for i in range(len(chunks))]
    assert all(c.doc_id == "kb-1" and c.title == "Router" and c.text.strip() == c.text and c.text for c in chunks)
    assert [c.section for c in chunks][-1] == "Setup > Wi-Fi" and chunks[-1].text == "Short one."
    assert {c.section for c in chunks[:-1]} == {"Setup"}  # never crosses a section


def test_chunks_cover_the_section_with_about_the_overlap() -> None:
    text = numbered_text(60, 9)  # 540 words, sentence ends every 9 words
    chunks = [c.text for c in chunk_document(doc_of(Section("S", text)), max_words=100, overlap_words=20)]
    spans = assert_tiles(chunks, 540, 100)
    for (_, e1), (s2, _) in itertools.pairwise(spans):
        assert 10 <= e1 - s2 <= 20
    # Chunk ends and overlap starts fall on sentence boundaries when there are some.
    assert all(c.endswith(".") for c in chunks)
    assert all(start % 9 == 0 for start, _ in spans)


def test_paragraph_ends_are_preferred_to_sentence_ends() -> None:
    paragraphs = [numbered_text(5, 10, start=p * 50) for p in range(4)]  # 4 paragraphs of 50 words
    chunks = [c.text for c in chunk_document(doc_of(Section("S", "\n\n".join(paragraphs))), max_words=120, overlap_words=0)]
    assert [word_positions(c)[-1] + 1 for c in chunks] == [100, 200]
    assert chunks[0].count("\n\n") == 1  # the exact text, line breaks kept


def test_a_sentence_longer_than_the_budget_is_cut_by_words() -> None:
    text = " ".join(f"w{i}" for i in range(250)) + "."
    chunks = [c.text for c in chunk_document(doc_of(Section("S", text)), max_words=100, overlap_words=10)]
    spans = assert_tiles(chunks, 250, 100)
    assert spans[0] == (0, 100) and spans[1][0] == 90


def test_no_overlap_and_tiny_budgets() -> None:
    text = numbered_text(10, 7)
    spans = assert_tiles([c.text for c in chunk_document(doc_of(Section("S", text)), 16, 0)], 70, 16)
    assert all(e1 == s2 for (_, e1), (s2, _) in itertools.pairwise(spans))
    assert_tiles([c.text for c in chunk_document(doc_of(Section("S", text)), 1, 0)], 70, 1)
    assert_tiles([c.text for c in chunk_document(doc_of(Section("S", text)), 2, 1)], 70, 2)


def test_title_only_and_empty_documents() -> None:
    (only,) = chunk_document(Document("t", "  Just a title ", (Section("H", " \t\n "),)))
    assert (only.id, only.text, only.section, only.doc_id) == ("t#0", "Just a title", "", "t")
    assert chunk_document(Document("e", "", ())) == []


def test_unicode_and_very_long_words() -> None:
    text = "東京タワーは電波塔です。本当に高い！\u00a0Café\u00a0naïve résumé… « Ça va ? » " + "x" * 5000 + " end."
    chunks = chunk_document(doc_of(Section("S", text)), max_words=16, overlap_words=4)
    assert len(chunks) == 1 and chunks[0].text == text.strip()
    long_words = " ".join("y" * 3000 + str(i) for i in range(40))
    chunks = chunk_document(doc_of(Section("S", long_words)), max_words=16, overlap_words=4)
    assert all(0 < len(c.text.split()) <= 16 for c in chunks)
    assert chunks[-1].text.endswith("y39")
    # CJK sentence ends and closing quotes end sentences too.
    sentences = "。".join("字" * 3 for _ in range(3))
    assert chunk_document(doc_of(Section("S", sentences)))[0].text == sentences


def test_chunking_is_deterministic_and_validates_sizes() -> None:
    doc = doc_of(Section("A", numbered_text(40, 11)), Section("B", numbered_text(3, 5)))
    assert chunk_document(doc) == chunk_document(doc)
    assert chunk_documents([doc, doc]) == chunk_document(doc) * 2
    for max_words, overlap in ((0, 0), (10, 10), (10, -1)):
        with pytest.raises(ValueError, match="_words"):
            chunk_document(doc, max_words, overlap)


def test_settings_defaults_match_the_chunker_defaults() -> None:
    settings = Settings(_env_file=None)
    doc = doc_of(Section("A", numbered_text(40, 11)))
    assert chunk_document(doc) == chunk_document(doc, settings.chunk_words, settings.chunk_overlap_words)
