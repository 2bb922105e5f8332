"""Tier C prompt (`evidence`): read the few passages the gatherer found, which together hold the
chain (one passage names the bridge entity, another tells about it), and answer at once.

The worked example is a bridge question whose answer needs both passages, so the small reader
sees the hop taken; the answer stays a few words, as the single-step reader's. `ABSTAIN` lets the
reader say the passages lack the answer (`prompts.single_step.NO_ANSWER_MARKER`), as single step's.
"""

from adaptive_rag.prompts import Prompt
from adaptive_rag.prompts.single_step import NO_ANSWER_MARKER

_EXAMPLE = (
    "Passages:\n"
    "[1] Heat (1995 film): Heat is a 1995 American crime film written and directed by Michael Mann.\n"
    "[2] Michael Mann: Michael Kenneth Mann (born February 5, 1943) is an American director. He was "
    "born in Chicago, Illinois.\n\n"
    "Question: Where was the director of the film Heat born?"
)
_EXAMPLE_ANSWER = "Chicago, Illinois"
_NO_ANSWER_QUESTION = "Who composed the music of the film Heat?"

_SYSTEM = (
    "Answer the question from the passages. The answer may need two passages: one names a person, "
    "place or work, another tells about it; follow that link. Reply with only the answer: a few "
    "words (a name, date, number, yes or no, or short phrase), no sentence, no explanation."
)

_COMPLETION = (
    "Answer each question with a few words taken from its passages. A question may need two "
    "passages: one names something, another tells about it.\n\n"
    + _EXAMPLE.removeprefix("Passages:\n") + "\nAnswer: " + _EXAMPLE_ANSWER
    + "\n\n{passages}\n\nQuestion: {question}\nAnswer:"
)

PROMPT = Prompt(
    completion=_COMPLETION,
    system=_SYSTEM,
    user="Passages:\n{passages}\n\nQuestion: {question}",
    examples=((_EXAMPLE, _EXAMPLE_ANSWER),),
    max_tokens=24,
    stop=("\n\n", "\nQuestion"),
    chat_stop=("\n",),
)

ABSTAIN = Prompt(
    completion=_COMPLETION.replace(
        "tells about it.", f"tells about it. If they do not answer it, answer: {NO_ANSWER_MARKER}", 1),
    system=_SYSTEM + f" If the passages do not contain the answer, reply exactly: {NO_ANSWER_MARKER}",
    user="Passages:\n{passages}\n\nQuestion: {question}",
    examples=(
        (_EXAMPLE, _EXAMPLE_ANSWER),
        (_EXAMPLE.replace("Where was the director of the film Heat born?", _NO_ANSWER_QUESTION),
         NO_ANSWER_MARKER),
    ),
    max_tokens=24,
    stop=("\n\n", "\nQuestion"),
    chat_stop=("\n",),
)

# --- comparison questions, read per side (`evidence.comparison`) ---------------------------------
# One side's passages in, that side's fact out (a date, a number, a place): a single-hop read. The
# worked example is a comparison whose fact needs the side's two passages (film -> its director).

_SIDE_EXAMPLE = (
    _EXAMPLE.removesuffix("Question: Where was the director of the film Heat born?")
    + "Question: Which film has the director born first, Heat or Thief?\n"
    "About Heat only: give the date (day, month and year) this question compares."
)
_SIDE_EXAMPLE_ANSWER = "February 5, 1943"

SIDE = Prompt(
    completion=(
        "Each question compares two things; answer about the one named, with only the fact the "
        "question compares, taken from its passages. The fact may need two passages: one names "
        "something, another tells about it.\n\n"
        + _SIDE_EXAMPLE.removeprefix("Passages:\n") + "\nAnswer: " + _SIDE_EXAMPLE_ANSWER
        + "\n\n{passages}\n\nQuestion: {question}\nAbout {side} only: give the {measure} this question "
        "compares.\nAnswer:"
    ),
    system=(
        "The question compares two things; answer about the one named only. Reply with only the "
        "fact the question compares, taken from the passages (a date, a number, a place): a few "
        "words, no sentence. The fact may need two passages: one names something, another tells "
        "about it; follow that link."
    ),
    user="Passages:\n{passages}\n\nQuestion: {question}\nAbout {side} only: give the {measure} this question compares.",
    examples=((_SIDE_EXAMPLE, _SIDE_EXAMPLE_ANSWER),),
    max_tokens=24,
    stop=("\n\n", "\nQuestion"),
    chat_stop=("\n",),
)
