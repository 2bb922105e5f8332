"""Tier A prompt: answer from the model's own knowledge, in a few words."""

PROMPT = """Answer the question with a short answer of a few words. Do not explain.

Question: Who wrote the novel "Pride and Prejudice"?
Answer: Jane Austen

Question: What is the largest planet in the Solar System?
Answer: Jupiter

Question: {question}
Answer:"""

MAX_TOKENS = 24
STOP = ("\n",)
