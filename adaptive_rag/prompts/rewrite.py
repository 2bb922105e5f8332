"""Follow-up rewrite prompt: turn a conversation's last question into one that stands alone.

Used only when the rules of `strategies.follow_up` cannot rewrite a follow-up themselves; the
reader gets the earlier questions (newest last) and writes the question alone, on one line.
"""

from adaptive_rag.prompts import Prompt

PROMPT = Prompt(
    completion="""Rewrite the last question so that it can be understood without the earlier ones: replace pronouns and fill in what it leaves out. Keep its wording otherwise, and write it as one question: do not repeat the earlier ones.

Earlier: How do I return an order?
Last: does the same go for gifts?
Rewritten: Does the return of an order go for gifts as well?

Earlier: Is the vaccine safe for adults?
Last: what about for children?
Rewritten: Is the vaccine safe for children?

Earlier: When does the summer sale end?
Last: and can I still get a price match after that?
Rewritten: Can I still get a price match after the summer sale ends?

Earlier: {history}
Last: {question}
Rewritten:""",
    system="Rewrite the customer's last question so it can be understood without the conversation: "
    "replace pronouns and fill in what it leaves out from the earlier questions; keep its wording "
    "otherwise. Reply with the rewritten last question only: one question, on one line; do not repeat "
    "or answer the earlier questions.",
    user="Earlier questions:\n{history}\n\nLast question: {question}",
    examples=(
        ("Earlier questions:\nHow do I return an order?\n\nLast question: does the same go for gifts?",
         "Can I return a gift the same way as an order?"),
        ("Earlier questions:\nIs the vaccine safe for adults?\n\nLast question: what about for children?",
         "Is the vaccine safe for children?"),
        ("Earlier questions:\nWhen does the summer sale end?\n\nLast question: and can I still get a price match after that?",
         "Can I still get a price match after the summer sale ends?"),
    ),
    max_tokens=48,
    stop=("\n",),
    chat_stop=("\n",),
)
