"""Tier C prompt (IRCoT, Trivedi et al. 2023): write the next reasoning sentence, ending with
"So the answer is: ..." once the passages suffice. Passages first, as for the reader."""

ANSWER_MARKER = "So the answer is:"

PROMPT = """{passages}

Answer the question by reasoning one sentence at a time over the passages above. When you know the answer, write "So the answer is: <short answer>".

Question: Who was born first, the director of Jaws or the author of Carrie?
Reasoning: Jaws was directed by Steven Spielberg, born in 1946. Carrie was written by Stephen King, born in 1947. So the answer is: Steven Spielberg.

Question: {question}
Reasoning: {reasoning}"""

MAX_TOKENS = 48
STOP = ("\n\n", "\nQuestion")
