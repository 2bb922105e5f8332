"""The reader's yes/no judgment: do the retrieved passages answer the question?

A second abstention gate after the retrieval gate (`strategies.abstention`): one short call that
reads the same passages the reader would and replies one word. The static part (rules and the
two worked examples) comes first, so a server's prompt cache serves it for every question; only
the passages and the question are new. The worked examples are the support prompt's own
(`prompts.single_step`): the same passages answer "how do I send something back" and do not
answer "can I pay with a gift card?", an on-topic question the passages do not cover, which is
what the retrieval gate cannot see.
"""

from adaptive_rag.prompts import Prompt

YES, NO = "yes", "no"

_PASSAGES = (
    "[1] Returning an order: You can return any item within 30 days of delivery. Open Orders, "
    "choose Return items and print the prepaid label; drop the parcel at any post office.\n"
    "[2] Refunds: Refunds go back to the original payment method within 5 business days of the "
    "return reaching our warehouse."
)
_COVERED = "how do i send something back and when do i get my money?"
_UNCOVERED = "can I pay with a gift card?"
_RULES = (
    "You check a help centre's search results before a customer-support assistant answers. "
    "Reply yes if the numbered passages contain the answer to the customer's question, no if they "
    "do not: passages about the same product or topic that do not say what the question asks are "
    "a no. Reply with one word: yes or no."
)
_ASK = "Passages:\n{passages}\n\nQuestion: {question}\nDo the passages answer the question?"

PROMPT = Prompt(
    completion=_RULES + "\n\n"
    + _ASK.format(passages=_PASSAGES, question=_COVERED) + f"\nReply: {YES}\n\n"
    + _ASK.format(passages=_PASSAGES, question=_UNCOVERED) + f"\nReply: {NO}\n\n"
    + _ASK + "\nReply:",
    system=_RULES,
    user=_ASK,
    examples=(
        (_ASK.format(passages=_PASSAGES, question=_COVERED), YES),
        (_ASK.format(passages=_PASSAGES, question=_UNCOVERED), NO),
    ),
    max_tokens=1,
    stop=("\n",),
    chat_stop=("\n",),
)
