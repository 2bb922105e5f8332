"""Prompt templates, one module per strategy, plus the passage formatting they share.

Each strategy's prompt comes in two forms, written side by side in its module: a few-shot
completion for base models (the Gemma 270M reader has no chat template) and a system + user chat
for instruction models, rendered by the model's own chat template. The reader's `prompt_style`
picks one (`adaptive_rag.readers`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from adaptive_rag.domain import Passage

# Passages are cut to this many characters in prompts: the small model reads short context best
# (400 kept single-step F1 and cut its time by half against 600 on a train sample).
PASSAGE_CHARS = 400


def format_passages(passages: Sequence[Passage], max_chars: int = PASSAGE_CHARS) -> str:
    """Numbered `Title: text` blocks, each bounded to `max_chars`."""
    blocks = []
    for number, passage in enumerate(passages, start=1):
        text = passage.text if len(passage.text) <= max_chars else passage.text[:max_chars] + "..."
        blocks.append(f"[{number}] {passage.title}: {text}")
    return "\n".join(blocks)


@dataclass(frozen=True)
class Prompt:
    """One strategy step's prompt in both forms, with its output bounds.

    `completion`, `system` and `user` are `str.format` templates over the same fields;
    `examples` are worked (user, assistant) turns shown before the real one in chat form.
    """

    completion: str
    system: str
    user: str
    max_tokens: int
    stop: tuple[str, ...]
    examples: tuple[tuple[str, str], ...] = ()
    # Chat answers end at the template's end-of-turn; these cut a rambling answer earlier.
    chat_stop: tuple[str, ...] = ()

    def text(self, **fields: str) -> str:
        return self.completion.format(**fields)

    def messages(self, **fields: str) -> list[dict[str, str]]:
        turns = [{"role": "system", "content": self.system}]
        for asked, answered in self.examples:
            turns += [{"role": "user", "content": asked}, {"role": "assistant", "content": answered}]
        turns.append({"role": "user", "content": self.user.format(**fields)})
        return turns
