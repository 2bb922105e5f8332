"""Tier B prompt: read the retrieved passages once and answer in a few words.

Completion form: passages come first and one worked example follows them: on the 270M embedded
model this tripled F1 over an instruction-first prompt (30 train questions of SQuAD, HotpotQA,
TriviaQA: F1 0.27-0.36 against 0.06-0.17). The multi-step strategies reuse this reader for their
final answer, so one reader prompt serves every retrieval tier. `ABSTAIN` is the same reader for
support knowledge bases, allowed to answer with `NO_ANSWER_MARKER` (`SingleStep.reader_abstains`).
"""

from adaptive_rag.prompts import Prompt

_EXAMPLE_PASSAGES = (
    "[1] Vienna: Vienna is the capital of Austria. The Danube flows through the city."
)

PROMPT = Prompt(
    completion="""{passages}

Answer each question with a few words taken from the passages above.

Question: What is the name of the river mentioned above?
Answer: the Danube

Question: {question}
Answer:""",
    system="Answer the question using the passages. Reply with only the answer: a few words "
    "(a name, date, number or short phrase), no sentence, no explanation.",
    user="Passages:\n{passages}\n\nQuestion: {question}",
    examples=(
        ((f"Passages:\n{_EXAMPLE_PASSAGES}\n\nQuestion: Which river flows through the capital "
         "of Austria?"), "the Danube"),
    ),
    max_tokens=24,
    stop=("\n\n", "\nQuestion"),
    chat_stop=("\n",),
)

# --- abstaining reader (support semantics) ---------------------------------------------------------
# The same reader, allowed to say that the passages do not hold the answer by writing
# `NO_ANSWER_MARKER`; one worked example shows each case so the small model sees the marker used.
NO_ANSWER_MARKER = "not in the passages"

ABSTAIN = Prompt(
    completion="""{passages}

Answer each question with a few words taken from the passages above. If the passages above do not answer the question, answer: """ + NO_ANSWER_MARKER + """

Question: What is the name of the river mentioned above?
Answer: the Danube

Question: Who won the chess world championship in 1972?
Answer: """ + NO_ANSWER_MARKER + """

Question: {question}
Answer:""",
    system="Answer the question using only the passages, in a few words. If the passages do "
    f"not contain the answer, reply exactly: {NO_ANSWER_MARKER}",
    user="Passages:\n{passages}\n\nQuestion: {question}",
    examples=(
        ((f"Passages:\n{_EXAMPLE_PASSAGES}\n\nQuestion: Which river flows through the capital "
         "of Austria?"), "the Danube"),
        ((f"Passages:\n{_EXAMPLE_PASSAGES}\n\nQuestion: Who won the chess world championship "
         "in 1972?"), NO_ANSWER_MARKER),
    ),
    max_tokens=24,
    stop=("\n\n", "\nQuestion"),
    chat_stop=("\n",),
)
