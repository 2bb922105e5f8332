"""Cut documents into retrievable passages with stable ids (`<document id>#<position>`).

A chunk never crosses a section, so its `section` heading is true of all its text. Within a
section, chunks end at the strongest boundary in the last half of the word budget: a paragraph
end, else a sentence or line end, else anywhere (a sentence longer than the budget is cut by
words). The next chunk starts `overlap_words` back, moved forward to a sentence start when one is
close, so a fact cut by a chunk end is whole in one of the two.

Sentence rule (simple and predictable; no language model): a sentence ends after a word ending in
".", "!", "?", "…" or a CJK full stop, optionally followed by closing quotes or brackets, and at
every line break. Abbreviations ("e.g.") therefore end a sentence too: that only moves a chunk
boundary, never loses text. Words are runs of non-whitespace (Unicode whitespace included), so a
very long word or URL counts as one word.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from adaptive_rag.domain import Passage
from adaptive_rag.knowledge.documents import Document

_WORD = re.compile(r"\S+")
_SENTENCE_END = re.compile(r"[.!?…。！？][\"'”’»)\]]*$")

# Boundary strength after a word: none, sentence (or line), paragraph (blank line).
_NONE, _SENTENCE, _PARAGRAPH = 0, 1, 2


@dataclass(frozen=True, slots=True)
class _Word:
    start: int
    end: int
    # Strength of the boundary right after this word.
    boundary: int


def chunk_document(doc: Document, max_words: int = 160, overlap_words: int = 32) -> list[Passage]:
    """Passages of one document, numbered 0, 1, 2... across its sections in order.

    A document with a title and no text gives one passage holding the title, so it can still be
    found. Same document and parameters, same passages.
    """
    _check_sizes(max_words, overlap_words)
    texts = [
        (section.heading, text)
        for section in doc.sections
        for text in _chunk_text(section.text, max_words, overlap_words)
    ]
    if not texts and doc.title.strip():
        texts = [("", doc.title.strip())]
    return [
        Passage(id=f"{doc.id}#{position}", title=doc.title, text=text, doc_id=doc.id, section=heading)
        for position, (heading, text) in enumerate(texts)
    ]


def chunk_documents(docs: Iterable[Document], max_words: int = 160, overlap_words: int = 32) -> list[Passage]:
    """Passages of every document, document by document."""
    return [passage for doc in docs for passage in chunk_document(doc, max_words, overlap_words)]


def _check_sizes(max_words: int, overlap_words: int) -> None:
    if max_words < 1:
        raise ValueError(f"max_words must be at least 1, got {max_words}")
    if not 0 <= overlap_words < max_words:
        raise ValueError(
            f"overlap_words must be at least 0 and below max_words ({max_words}), got {overlap_words}"
        )


def _chunk_text(text: str, max_words: int, overlap_words: int) -> list[str]:
    """The chunks of one section's text, each an exact slice of it (line breaks kept)."""
    words = _words(text)
    spans = _spans(words, max_words, overlap_words)
    return [text[words[start].start : words[end - 1].end] for start, end in spans]


def _words(text: str) -> list[_Word]:
    matches = list(_WORD.finditer(text))
    words = []
    for index, match in enumerate(matches):
        gap = text[match.end() : matches[index + 1].start()] if index + 1 < len(matches) else "\n\n"
        if gap.count("\n") >= 2:
            boundary = _PARAGRAPH
        elif "\n" in gap or _SENTENCE_END.search(match.group()):
            boundary = _SENTENCE
        else:
            boundary = _NONE
        words.append(_Word(match.start(), match.end(), boundary))
    return words


def _spans(words: list[_Word], max_words: int, overlap_words: int) -> list[tuple[int, int]]:
    """[start, end) word ranges: at most `max_words` each, consecutive ones overlapping."""
    spans: list[tuple[int, int]] = []
    start = 0
    while start < len(words):
        end = _chunk_end(words, start, max_words, overlap_words)
        spans.append((start, end))
        if end == len(words):
            break
        start = _next_start(words, start, end, overlap_words)
    return spans


def _chunk_end(words: list[_Word], start: int, max_words: int, overlap_words: int) -> int:
    """The end of the chunk from `start`: the latest strongest boundary in the second half of
    the budget (and past the overlap, so the next chunk moves forward)."""
    limit = min(start + max_words, len(words))
    if limit == len(words):
        return limit
    earliest = start + max(max_words // 2, overlap_words + 1, 1)
    for strength in (_PARAGRAPH, _SENTENCE):
        for end in range(limit, earliest - 1, -1):
            if words[end - 1].boundary >= strength:
                return end
    return limit


def _next_start(words: list[_Word], start: int, end: int, overlap_words: int) -> int:
    """`overlap_words` before `end`, moved forward to the first sentence start within the
    overlap's later half when there is one (about that many words shared, whole sentences)."""
    if overlap_words == 0:
        return end
    target = max(end - overlap_words, start + 1)
    for candidate in range(target, end - overlap_words // 2):
        if words[candidate - 1].boundary >= _SENTENCE:
            return candidate
    return target
