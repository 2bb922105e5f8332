"""Tier B prompt: read the retrieved passages once and answer, in either answer style.

`PROMPT` / `ABSTAIN` answer in a few words (the `short` style QA benchmarks score); `SUPPORT` /
`SUPPORT_ABSTAIN`, side by side below, answer a customer in full with cited passages (the
`support` style, the default for tenants).

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

# --- support style (a tenant's customer-facing answer) ---------------------------------------------
# The same reader, asked for what a customer needs instead of a span: one to a few sentences or
# numbered steps taken from the passages, each citing the passage it came from as [n] (the
# reply's sources, in order). `SUPPORT_ABSTAIN` may answer `NO_ANSWER_MARKER` instead.
_SUPPORT_PASSAGES = (
    "[1] Returning an order: You can return any item within 30 days of delivery. Open Orders, "
    "choose Return items and print the prepaid label; drop the parcel at any post office.\n"
    "[2] Refunds: Refunds go back to the original payment method within 5 business days of the "
    "return reaching our warehouse."
)
_SUPPORT_QUESTION = "how do i send something back and when do i get my money?"
_SUPPORT_ANSWER = (
    "You can return an item within 30 days of delivery [1]:\n"
    "1. Open Orders and choose Return items [1].\n"
    "2. Print the prepaid label and drop the parcel at any post office [1].\n"
    "The refund goes back to your original payment method within 5 business days of the return "
    "reaching the warehouse [2]."
)
_SUPPORT_RULES = (
    "You are a customer-support assistant. Answer the customer's question using only the "
    "numbered passages: a complete answer of one to three sentences, or short numbered steps "
    "when the answer is a procedure. Keep the passages' specifics (links, numbers, names, "
    "deadlines). After each sentence or step, cite the passage it comes from as [1], [2]. Say "
    "nothing the passages do not say."
)
_SUPPORT_COMPLETION = """{passages}

Answer the customer's question from the passages above in one to three sentences, or short numbered steps for a procedure, citing the passage of each sentence as [1], [2].

Question: """ + _SUPPORT_QUESTION + """
Answer: You can return an item within 30 days of delivery [1]. Open Orders, choose Return items, print the prepaid label and drop the parcel at any post office [1]. The refund reaches your original payment method within 5 business days [2].

Question: {question}
Answer:"""

SUPPORT = Prompt(
    completion=_SUPPORT_COMPLETION,
    system=_SUPPORT_RULES,
    user="Passages:\n{passages}\n\nQuestion: {question}",
    examples=((f"Passages:\n{_SUPPORT_PASSAGES}\n\nQuestion: {_SUPPORT_QUESTION}", _SUPPORT_ANSWER),),
    max_tokens=160,
    stop=("\n\nQuestion", "\nQuestion:"),
)

SUPPORT_ABSTAIN = Prompt(
    completion=_SUPPORT_COMPLETION.replace(
        "citing the passage of each sentence as [1], [2].",
        "citing the passage of each sentence as [1], [2]. If the passages above do not answer "
        "the question, answer: " + NO_ANSWER_MARKER),
    system=_SUPPORT_RULES + f" If the passages do not answer the question, reply exactly: {NO_ANSWER_MARKER}",
    user="Passages:\n{passages}\n\nQuestion: {question}",
    examples=(
        (f"Passages:\n{_SUPPORT_PASSAGES}\n\nQuestion: {_SUPPORT_QUESTION}", _SUPPORT_ANSWER),
        (f"Passages:\n{_SUPPORT_PASSAGES}\n\nQuestion: can I pay with a gift card?", NO_ANSWER_MARKER),
    ),
    max_tokens=160,
    stop=("\n\nQuestion", "\nQuestion:"),
)
