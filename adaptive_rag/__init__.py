"""Adaptive-RAG: route each query to the cheapest answering strategy that can answer it.

The library holds the domain (passages, completions, strategy results), the two ports every
strategy depends on (`Retriever`, `LLM`), their adapters, the strategies and the evaluation
harness. It never imports server or queue code.
"""

__version__ = "0.1.0"
