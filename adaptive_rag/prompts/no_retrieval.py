"""Tier A prompt: answer from the model's own knowledge, in a few words."""

from adaptive_rag.prompts import Prompt

PROMPT = Prompt(
    completion="""Answer the question with a short answer of a few words. Do not explain.

Question: Who wrote the novel "Pride and Prejudice"?
Answer: Jane Austen

Question: What is the largest planet in the Solar System?
Answer: Jupiter

Question: {question}
Answer:""",
    system="Answer the question from your own knowledge with a short answer of a few words "
    "(a name, date, number or short phrase). Do not explain.",
    user="{question}",
    examples=(
        ('Who wrote the novel "Pride and Prejudice"?', "Jane Austen"),
        ("What is the largest planet in the Solar System?", "Jupiter"),
    ),
    max_tokens=24,
    stop=("\n",),
    chat_stop=("\n",),
)
