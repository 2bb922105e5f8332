"""The support suite's knowledge bases by name: the COVID FAQ (`evaluation.support`), the demo help
centre (`evaluation.help_centre`) and the Quillbill help centre (`evaluation.quillbill`, Markdown
pages, held out from every design choice)."""

from __future__ import annotations

from adaptive_rag.errors import ConfigurationError
from adaptive_rag.evaluation.help_centre import build_help_centre
from adaptive_rag.evaluation.quillbill import build_quillbill
from adaptive_rag.evaluation.support import COVID_FAQ, SupportSuite, build_suite
from adaptive_rag.settings import Settings

KNOWLEDGE_BASES = (COVID_FAQ, "help-centre", "quillbill")


def build_knowledge_base_suite(name: str, settings: Settings) -> SupportSuite:
    """The suite of one of `KNOWLEDGE_BASES`."""
    if name == COVID_FAQ:
        return build_suite(settings.data_dir, settings)
    if name == "help-centre":
        return build_help_centre(settings)
    if name == "quillbill":
        return build_quillbill(settings)
    raise ConfigurationError(f"unknown support knowledge base {name!r}; choose {', '.join(KNOWLEDGE_BASES)}")
