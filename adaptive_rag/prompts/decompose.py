"""Tier C prompt (decompose-retrieve-synthesize): split a multi-part question into simple
sub-questions, one per line; each is retrieved separately and the reader answers once."""

from adaptive_rag.prompts import Prompt

MAX_SUBQUESTIONS = 3

PROMPT = Prompt(
    completion="""Split the question into at most 3 simple questions that can each be looked up separately, one per line. If it is already simple, repeat it.

Question: Which was released first, Toy Story or The Lion King?
Toy Story release date?
The Lion King release date?

Question: Who is the mother of the director of the film Heat?
Who directed the film Heat?
Who is the mother of Michael Mann?

Question: What is the capital of the country where the Eiffel Tower is?
In which country is the Eiffel Tower?
What is the capital of France?

Question: {question}
""",
    system="Split the question into at most 3 simple search questions, one per line, that "
    "together find the facts needed to answer it. Write only the questions. If the question is "
    "already simple, repeat it.",
    user="{question}",
    examples=(
        ("Which was released first, Toy Story or The Lion King?",
         "When was Toy Story released?\nWhen was The Lion King released?"),
        ("Who is the mother of the director of the film Heat?",
         "Who directed the film Heat?\nWho is the mother of the director of Heat?"),
    ),
    max_tokens=80,
    stop=("\n\n", "Question:"),
    chat_stop=("\n\n",),
)
