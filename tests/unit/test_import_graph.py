"""No import loop between the modules of the library, the front door, the workers, infra and the lab.

The graph is grimp's (the one import-linter checks its contracts on), built from the source:
function-level (lazy) imports count, since they loop at run time all the same; imports under
`if TYPE_CHECKING:` do not, since they never run.
"""

from __future__ import annotations

from pathlib import Path

import grimp
import pytest

PACKAGES = ("adaptive_rag", "services", "workers", "infra", "lab")
REPOSITORY = Path(__file__).resolve().parents[2]


def import_cycles(graph: grimp.ImportGraph) -> list[tuple[str, ...]]:
    """One shortest loop through each import that closes one (`a -> b -> ... -> a`), each loop
    reported once whatever module it is entered at."""
    found: dict[frozenset[str], tuple[str, ...]] = {}
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                loop = (importer, *back)
                found.setdefault(frozenset(loop), loop)
    return sorted(found.values())


def test_import_cycles_are_found_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "looped"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "first.py").write_text("def late():\n    from looped import second\n")
    (package / "second.py").write_text("from looped import first\n")
    (package / "third.py").write_text("from looped import first\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("looped", cache_dir=None)
    assert import_cycles(graph) == [("looped.first", "looped.second", "looped.first")]


def test_no_import_cycles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPOSITORY))  # services/ and workers/ import from the root
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True, cache_dir=None)
    cycles = import_cycles(graph)
    assert not cycles, "import loops:\n" + "\n".join(" -> ".join(loop) for loop in cycles)
