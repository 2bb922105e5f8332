"""Tier B prompt: read the retrieved passages once and answer in a few words.

Passages come first and one worked example follows them: on the 270M embedded model this form
tripled F1 over an instruction-first prompt (30 train questions of SQuAD, HotpotQA, TriviaQA:
F1 0.27-0.36 against 0.06-0.17). The multi-step strategies reuse this reader for their final
answer, so one reader prompt serves every retrieval tier. `PROMPT_ABSTAIN` is the same reader
for support knowledge bases, allowed to answer with `NO_ANSWER_MARKER` (`SingleStep.reader_abstains`).
"""

PROMPT = """{passages}

Answer each question with a few words taken from the passages above.

Question: What is the name of the river mentioned above?
Answer: the Danube

Question: {question}
Answer:"""

MAX_TOKENS = 24
STOP = ("\n\n", "\nQuestion")

# --- abstaining reader (support semantics) ---------------------------------------------------------
# The same reader, allowed to say that the passages do not hold the answer by writing
# `NO_ANSWER_MARKER`; one worked example shows each case so the small model sees the marker used.
NO_ANSWER_MARKER = "not in the passages"

PROMPT_ABSTAIN = """{passages}

Answer each question with a few words taken from the passages above. If the passages above do not answer the question, answer: """ + NO_ANSWER_MARKER + """

Question: What is the name of the river mentioned above?
Answer: the Danube

Question: Who won the chess world championship in 1972?
Answer: """ + NO_ANSWER_MARKER + """

Question: {question}
Answer:"""
