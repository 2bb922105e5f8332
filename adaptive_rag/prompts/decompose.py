"""Tier C prompt (decompose-retrieve-synthesize): split a multi-part question into simple
sub-questions, one per line; each is retrieved separately and the reader answers once."""

PROMPT = """Split the question into at most 3 simple questions that can each be looked up separately, one per line. If it is already simple, repeat it.

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
"""

MAX_TOKENS = 80
MAX_SUBQUESTIONS = 3
STOP = ("\n\n", "Question:")
