"""Tier B prompt: read the retrieved passages once and answer in a few words.

Passages come first and one worked example follows them: on the 270M embedded model this form
tripled F1 over an instruction-first prompt (30 train questions of SQuAD, HotpotQA, TriviaQA:
F1 0.27-0.36 against 0.06-0.17). The multi-step strategies reuse this reader for their final
answer, so one reader prompt serves every retrieval tier.
"""

PROMPT = """{passages}

Answer each question with a few words taken from the passages above.

Question: What is the name of the river mentioned above?
Answer: the Danube

Question: {question}
Answer:"""

MAX_TOKENS = 24
STOP = ("\n\n", "\nQuestion")
