"""A tiny knowledge base whose answer needs a bridge hop: the question names Charles Mathew, whose
page names his father; the father's page (where he was buried) shares no rare word with the
question, and the distractors about fathers and burials outrank it for the question alone."""

from adaptive_rag.domain import Passage

KB = [
    Passage("mathew", "Charles Mathew", "Charles Mathew was an English actor, the son of Henry Walcot Pemberton."),
    Passage("pemberton", "Henry Walcot Pemberton (bookseller)", "Henry Walcot Pemberton kept a shop in Bath. His grave is in Highgate Cemetery."),
    Passage("dickens", "Charles Dickens", "Charles Dickens was a writer; his father John was buried in London."),
    Passage("brady", "Mathew Brady", "Mathew Brady was buried in Washington; his father was a farmer."),
    Passage("darwin", "Charles Darwin", "Charles Darwin's father Robert was buried at Shrewsbury."),
    Passage("bath", "Bath", "Bath is a city in Somerset with Roman baths."),
]
QUESTION = "Where was the father of Charles Mathew buried?"
