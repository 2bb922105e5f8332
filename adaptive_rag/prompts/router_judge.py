"""Router prompt (LLM judge): read the question and one-line descriptions of the three tiers,
answer with one letter. No passages: the judge decides before anything is retrieved, like the
classifier it is compared with.

The tiers are listed C, B, A and the worked examples start with C: Qwen2.5-Coder-0.5B answered
"A" to every demo question when A came first (2 of 11 right), 5 of 11 with this order. That is a
sanity check on 11 questions, not a tuned prompt.
"""

from adaptive_rag.prompts import Prompt

TIER_DESCRIPTIONS = {
    "C": "multi step: it asks for two or more facts, or compares or chains facts; search several times",
    "B": "single step: it asks for one specific fact that must be looked up in documents; search once",
    "A": "no retrieval: it asks for a famous general-knowledge fact; answer directly",
}
_TIERS = "\n".join(f"{letter} = {text}" for letter, text in TIER_DESCRIPTIONS.items())
_EXAMPLES = (
    ("Which is heavier, the X200 router or the X300 switch?", "C"),
    ("What is the warranty period of the X200 router?", "B"),
    ("What is the capital of France?", "A"),
    ("Who founded the company that makes the X200, and when?", "C"),
    ("How many ports does the X300 switch have?", "B"),
)
_SHOTS = "\n\n".join(f"Question: {asked}\nTier: {tier}" for asked, tier in _EXAMPLES)

PROMPT = Prompt(
    completion=f"""Classify each question by how it must be answered.
{_TIERS}

{_SHOTS}

Question: {{question}}
Tier:""",
    system=f"Classify the question by how it must be answered.\n{_TIERS}\nReply with one letter.",
    user="{question}",
    examples=_EXAMPLES,
    max_tokens=4,
    stop=("\n",),
    chat_stop=("\n",),
)
