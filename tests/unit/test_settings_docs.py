"""docs/operating.md cannot drift from the code: its settings tables are what the settings
classes generate now, every settings class of a component has one, and its status-code table is
the front door's exception -> status table."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings

from adaptive_rag.contracts import CallError
from adaptive_rag.settings_docs import TABLE, render, settings_table, stale_tables
from services.frontdoor.server import STATUS_FOR_CODE, STATUS_FOR_ERROR

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operating.md"
# The modules holding the settings of each component (library, front door, workers, traces).
SETTINGS_MODULES = ("adaptive_rag.settings", "services.frontdoor.settings", "workers.settings",
                    "workers.telemetry")


def test_every_settings_table_is_what_its_class_generates():
    stale = stale_tables(PAGE.read_text(encoding="utf-8"))
    assert not stale, f"stale settings tables {stale}: run python -m adaptive_rag.settings_docs {PAGE}"


def test_every_settings_class_of_a_component_has_a_table():
    documented = {m["target"] for m in TABLE.finditer(PAGE.read_text(encoding="utf-8"))}
    classes = {
        f"{name}:{cls.__name__}"
        for name in SETTINGS_MODULES
        for cls in vars(importlib.import_module(name)).values()
        if inspect.isclass(cls) and issubclass(cls, BaseSettings) and cls.__module__ == name
    }
    assert classes - documented == set()


class Example(BaseSettings):
    # --- limits ---
    # How many things at once.
    things: int = Field(4, ge=1, validation_alias="ARAG_THINGS")
    mode: str = Field("fast", description="how it runs")


def test_a_table_names_variable_type_bounds_default_and_description():
    table = settings_table(Example)
    assert "| **limits** | | | |" in table
    assert "| `ARAG_THINGS` | integer (>= 1) | `4` | How many things at once. |" in table
    assert "| `MODE` | text | `fast` | how it runs |" in table


def test_a_changed_class_makes_its_table_stale(monkeypatch):
    page = f"<!-- settings-table {__name__}:Example -->\n<!-- /settings-table -->\n"
    fresh = render(page)
    assert stale_tables(fresh) == []
    monkeypatch.setattr(Example.model_fields["things"], "default", 8)
    assert stale_tables(fresh) == [f"{__name__}:Example"]


def status_section(page: str) -> str:
    section = page[page.index("## Status codes"):]
    return section[:section.index("\n## ", 1)]


def status_rows(page: str) -> dict[str, str]:
    section = status_section(page)
    return dict(re.findall(r"^\| (?:worker code )?`(\w+)` \| `([A-Z_]+)` \|", section, flags=re.MULTILINE))


def test_the_status_code_table_is_the_front_doors():
    expected = {error.__name__: status.name for error, status in STATUS_FOR_ERROR}
    expected |= {code.value: status.name for code, status in STATUS_FOR_CODE.items()}
    assert status_rows(PAGE.read_text(encoding="utf-8")) == expected


def test_the_status_code_table_names_every_error_code_a_client_can_get():
    section = status_section(PAGE.read_text(encoding="utf-8"))
    assert [code.value for code in CallError if f"`{code.value}`" not in section] == []
