"""Markdown tables of settings classes for the docs, generated from the pydantic-settings classes
themselves so a page cannot drift from the code: one row per setting with its environment
variable, type, default and description (the field's `description`, else the comment written
directly above the field; a `# --- section ---` comment becomes a section row, and one whose
line does not end in dashes takes the comment lines below it too).

A table's place in a page is a pair of markers naming the class (imported by that name, so the
library depends on no component whose settings a page documents):

    <!-- settings-table services.frontdoor.settings:FrontDoorSettings -->
    (generated rows)
    <!-- /settings-table -->

    python -m adaptive_rag.settings_docs docs/operating.md           # rewrite the tables
    python -m adaptive_rag.settings_docs --check docs/operating.md   # exit 1 when one is stale
"""

from __future__ import annotations

import argparse
import enum
import importlib
import inspect
import json
import re
import sys
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

TABLE = re.compile(
    r"(?P<open><!-- settings-table (?P<target>[\w.]+:\w+) -->\n)(?P<body>.*?)(?P<close><!-- /settings-table -->)",
    re.DOTALL,
)
HEADER = "| environment variable | type | default | description |\n| --- | --- | --- | --- |\n"
FIELD_LINE = re.compile(r"^(?P<indent>\s+)(?P<name>\w+)\s*:")


def load_class(target: str) -> type[BaseSettings]:
    """`package.module:ClassName` -> the class."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def environment_names(name: str, info: FieldInfo) -> list[str]:
    """The environment variables a field is read from, the first one preferred."""
    choices = getattr(info.validation_alias, "choices", None)
    if choices:
        return [str(c) for c in choices if str(c) != name]
    if isinstance(info.validation_alias, str):
        return [info.validation_alias]
    return [name.upper()]


def type_text(annotation: Any) -> str:
    """A reader's name for a field's type (`text`, `number`, one of the literal values, JSON)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (Union, types.UnionType):
        return " or ".join(type_text(arg) for arg in args if arg is not type(None))
    if origin is Literal:
        return " \\| ".join(f"`{value}`" for value in args)
    if origin is dict:
        key, value = args
        key_text = "tier" if inspect.isclass(key) and issubclass(key, enum.Enum) else type_text(key)
        return f"JSON {{{key_text}: {type_text(value)}}}"
    names = {str: "text", int: "integer", float: "number", bool: "true/false", Path: "path", Any: "any"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def bounds_text(info: FieldInfo) -> str:
    """The field's numeric bounds (`>= 1`, `<= 100`), as its validation enforces them."""
    marks = {Ge: ">=", Gt: ">", Le: "<=", Lt: "<"}
    parts = []
    for meta in info.metadata:
        for kind, sign in marks.items():
            if isinstance(meta, kind):
                parts.append(f"{sign} {getattr(meta, kind.__name__.lower())}")
    return ", ".join(parts)


def plain(value: Any) -> Any:
    """A default as JSON would write it (enum keys and values by their value)."""
    if isinstance(value, dict):
        return {str(plain(k)): plain(v) for k, v in value.items()}
    if isinstance(value, enum.Enum):
        return value.value
    return value


def default_text(info: FieldInfo) -> str:
    """The default as an operator would write it in the environment (`unset` for None; paths
    under the home directory start with `~`)."""
    value = info.default if info.default is not PydanticUndefined else info.default_factory()
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{'true' if value else 'false'}`"
    if isinstance(value, Path):
        home = Path.home()
        value = f"~/{value.relative_to(home)}" if value.is_relative_to(home) else str(value)
    if isinstance(value, (dict, list)):
        return f"`{json.dumps(plain(value))}`"
    return f"`{plain(value)}`"


def source_notes(cls: type) -> tuple[dict[str, str], dict[str, str]]:
    """From the class's source: the comment directly above each field, and the `# --- section`
    comment that opens the section a field starts (both by field name)."""
    lines, _ = inspect.getsourcelines(cls)
    comments: dict[str, str] = {}
    sections: dict[str, str] = {}
    block: list[str] = []
    heading: list[str] | None = None
    pending_section = ""
    body_indent: str | None = None
    for line in lines[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            text = stripped.lstrip("#").strip()
            if text.startswith("---"):  # `# --- name ---`; without closing dashes it runs on
                heading = [text.strip("- ")]
                if text.endswith("-"):
                    pending_section, heading = heading[0], None
            elif heading is not None:
                heading.append(text)
            else:
                block.append(text)
            continue
        if heading is not None:
            pending_section, heading = " ".join(heading).strip(" -"), None
        match = FIELD_LINE.match(line)
        if match and match["name"] in cls.model_fields and body_indent in (None, match["indent"]):
            body_indent = match["indent"]
            comments[match["name"]] = " ".join(block)
            if pending_section:
                sections[match["name"]], pending_section = pending_section, ""
        block = []
    return comments, sections


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def settings_table(cls: type[BaseSettings]) -> str:
    """The markdown table of `cls`'s settings, in the order the class declares them."""
    comments, sections = source_notes(cls)
    rows = [HEADER]
    for name, info in cls.model_fields.items():
        if name in sections:
            rows.append(f"| **{cell(sections[name])}** | | | |\n")
        first, *others = environment_names(name, info)
        variable = f"`{first}`" + "".join(f" (or `{other}`)" for other in others)
        kind = type_text(info.annotation)
        bounds = bounds_text(info)
        description = info.description or comments.get(name, "")
        rows.append(f"| {variable} | {kind}{f' ({bounds})' if bounds else ''} | {default_text(info)} "
                    f"| {cell(description)} |\n")
    return "".join(rows)


def render(page: str) -> str:
    """`page` with every marked table generated anew."""
    return TABLE.sub(lambda m: m["open"] + settings_table(load_class(m["target"])) + m["close"], page)


def stale_tables(page: str) -> list[str]:
    """The classes whose table in `page` differs from what they generate now."""
    return [m["target"] for m in TABLE.finditer(page)
            if m["body"] != settings_table(load_class(m["target"]))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m adaptive_rag.settings_docs",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="+", type=Path, help="markdown pages with settings-table markers")
    parser.add_argument("--check", action="store_true", help="only report stale tables (exit 1)")
    args = parser.parse_args(argv)
    stale = False
    for page in args.pages:
        text = page.read_text(encoding="utf-8")
        if args.check:
            for target in stale_tables(text):
                print(f"{page}: the table of {target} is stale: run python -m adaptive_rag.settings_docs {page}")
                stale = True
        else:
            page.write_text(render(text), encoding="utf-8")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
