"""Tier C prompt (IRCoT, Trivedi et al. 2023): write the next reasoning sentence, ending with
"So the answer is: ..." once the passages suffice. Passages first, as for the reader."""

from adaptive_rag.prompts import Prompt

ANSWER_MARKER = "So the answer is:"

PROMPT = Prompt(
    completion="""{passages}

Answer the question by reasoning one sentence at a time over the passages above. When you know the answer, write "So the answer is: <short answer>".

Question: Who was born first, the director of Jaws or the author of Carrie?
Reasoning: Jaws was directed by Steven Spielberg, born in 1946. Carrie was written by Stephen King, born in 1947. So the answer is: Steven Spielberg.

Question: {question}
Reasoning: {reasoning}""",
    system="Answer the question by reasoning over the passages one short sentence at a time. "
    f'Write only the next sentence. When you know the answer, write "{ANSWER_MARKER} '
    '<short answer>".',
    user="Passages:\n{passages}\n\nQuestion: {question}\nReasoning so far: {reasoning}",
    examples=(
        (("Passages:\n[1] Jaws (film): Jaws is a 1975 film directed by Steven Spielberg.\n"
         "[2] Steven Spielberg: Steven Spielberg (born 1946) is an American director.\n\n"
         "Question: When was the director of Jaws born?\nReasoning so far: "),
         "Jaws was directed by Steven Spielberg."),
        (("Passages:\n[1] Jaws (film): Jaws is a 1975 film directed by Steven Spielberg.\n"
         "[2] Steven Spielberg: Steven Spielberg (born 1946) is an American director.\n\n"
         "Question: When was the director of Jaws born?\nReasoning so far: Jaws was directed "
         "by Steven Spielberg."),
         f"Steven Spielberg was born in 1946. {ANSWER_MARKER} 1946"),
    ),
    max_tokens=48,
    stop=("\n\n", "\nQuestion"),
    chat_stop=("\n",),
)
