"""The entity graph after a write is updated, not rebuilt: only the passages the write changed,
and those that could mention a title it added or removed, are matched again, and the result is
exactly the graph a fresh build over the same passages gives."""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import pytest

from adaptive_rag.domain import Passage
from adaptive_rag.evidence.graph import MAX_SUBSTRING_PROBES, EntityGraph, entity_key
from adaptive_rag.evidence.graphs import EntityGraphs

TITLES = ["New York", "New York Times", "York", "Charles Mathew", "Highgate Cemetery", "Kensal Green",
          "Proxima Centauri", "Alpha Centauri", "Bath", "Somerset", "River Avon", "Avon (county)",
          "The Guardian", "Manchester", "Manchester United", "Old Trafford"]


def same_graph(updated: EntityGraph, fresh: EntityGraph) -> None:
    """Every fact a gatherer reads: entities, mentions, hubs, title links and the walk."""
    assert updated.matcher.keys == fresh.matcher.keys
    assert updated.mentions == fresh.mentions and updated.titled == fresh.titled
    assert updated.hubs == fresh.hubs and updated.edge_count == fresh.edge_count
    for entity in range(0, len(fresh.matcher.keys), 3):
        seeds = {fresh.entity_node(entity): 1.0, 0: 0.5} if len(fresh) else {}
        np.testing.assert_allclose(updated.personalized_pagerank(seeds), fresh.personalized_pagerank(seeds))


def corpus(rng: random.Random, size: int, titles: list[str]) -> list[Passage]:
    passages = []
    for n in range(size):
        mentioned = rng.sample(titles, 3)
        text = f"{mentioned[0]} met {mentioned[1]}-based people near the {mentioned[2]}; filler {n}."
        passages.append(Passage(f"p{n}", rng.choice(titles) if n % 3 else f"{rng.choice(titles)} {n}", text))
    return passages


def edited(rng: random.Random, passages: list[Passage], titles: list[str]) -> list[Passage]:
    """Deletions, changed texts, changed titles, new passages (some with new titles that shadow or
    extend known ones), in a new order, as a re-listed index hands them over."""
    kept = [p for p in passages if rng.random() > 0.1]
    out = []
    for p in kept:
        roll = rng.random()
        if roll < 0.1:
            p = Passage(p.id, p.title, p.text + f" Later it moved to {rng.choice(titles)}.")
        elif roll < 0.15:
            p = Passage(p.id, rng.choice(titles + ["New York Times Square", "Old Trafford Stadium"]), p.text)
        out.append(p)
    for n in range(rng.randint(1, 8)):
        out.append(Passage(f"new{rng.random()}", rng.choice(["New York Times Square", "Bath Abbey", "Avon",
                                                              "Green", *titles]), f"It faces {rng.choice(titles)}."))
    rng.shuffle(out)
    return out


@pytest.mark.parametrize("seed", range(12))
def test_an_update_is_the_graph_a_fresh_build_gives(seed: int) -> None:
    rng = random.Random(seed)
    options = {"max_mention_share": 0.05, "min_hub_passages": 4}  # so that hubs come and go
    passages = corpus(rng, 120, TITLES)
    graph = EntityGraph(passages, **options)
    for _ in range(4):  # successive writes, each update built from the last
        passages = edited(rng, passages, TITLES)
        updated = graph.updated(passages)
        same_graph(updated, EntityGraph(passages, **options))
        graph = updated


def test_a_longer_new_title_takes_over_the_mentions_of_a_shorter_one_and_gives_them_back() -> None:
    base = [Passage("ny", "New York", "A city."), Passage("r", "Report", "The New York Times reported it.")]
    graph = EntityGraph(base, min_hub_passages=10)
    with_times = [*base, Passage("t", "New York Times", "A newspaper.")]
    updated = graph.updated(with_times)
    same_graph(updated, EntityGraph(with_times, min_hub_passages=10))
    assert updated.linked(base[1])[0].id == "t" and updated.rematched == 2  # the report and the newspaper
    back = updated.updated(base)  # the newspaper deleted: the report mentions the city again
    same_graph(back, EntityGraph(base, min_hub_passages=10))
    assert [p.id for p in back.linked(base[1])] == ["ny"]


def test_an_unrelated_write_matches_only_what_it_wrote() -> None:
    passages = [Passage(f"p{n}", f"Title {n} Word", f"Mentions Title {n - 1} Word.") for n in range(300)]
    graph = EntityGraph(passages)
    changed = [*passages[:100], Passage("p100", "Title 100 Word", "Now it mentions Title 7 Word."), *passages[101:]]
    updated = graph.updated(changed)
    assert updated.rematched == 1
    same_graph(updated, EntityGraph(changed))
    renamed = [*changed, Passage("q", "Quarry Hill", "A hill.")]  # a new title nobody mentions
    assert graph.updated(renamed).rematched == 2  # the changed text and the new passage


def test_many_new_titles_are_matched_word_by_word() -> None:
    rng = random.Random(7)
    titles = [f"Place{n} Name{n}" for n in range(200)]
    passages = corpus(rng, 150, titles)
    graph = EntityGraph(passages)
    grown = [*passages, *[Passage(f"x{n}", f"Fresh{n} Title", f"Near {rng.choice(titles)}.")
                          for n in range(MAX_SUBSTRING_PROBES + 10)]]
    updated = graph.updated(grown)
    same_graph(updated, EntityGraph(grown))
    assert updated.rematched == MAX_SUBSTRING_PROBES + 10  # no old text holds a new title's first word


class Source:
    """A knowledge base that lists its passages, with a version the test moves on each write."""

    def __init__(self) -> None:
        self.passages = [Passage("a", "Alpha Centauri", "Alpha Centauri is near Proxima Centauri."),
                         Passage("b", "Proxima Centauri", "Proxima Centauri is a red dwarf.")]
        self.version = "1"

    def corpus_id(self) -> str:
        return "kb"

    def corpus_version(self) -> str:
        return self.version

    def corpus_passages(self) -> Iterator[Passage]:
        return iter(list(self.passages))


def test_the_graphs_cache_updates_the_graph_a_write_invalidated() -> None:
    graphs, source = EntityGraphs(background=False), Source()
    first = graphs.lookup(source).graph
    assert first is not None and first.rematched == 2
    source.passages.append(Passage("c", "Barnard's Star", "Barnard's Star is near Alpha Centauri."))
    source.version = "2"
    second = graphs.lookup(source).graph
    assert second is not None and second.rematched == 1 and graphs.builds == 2
    same_graph(second, EntityGraph(source.passages))
    assert [p.id for p in second.linked(source.passages[2])] == ["a"]
    assert entity_key("Barnard's Star") in second.matcher.keys


def test_an_update_that_fails_is_followed_by_a_fresh_build() -> None:
    def broken(previous: EntityGraph, passages: list[Passage]) -> EntityGraph:
        raise RuntimeError("update fault")

    graphs, source = EntityGraphs(background=False, update=broken), Source()
    assert graphs.lookup(source).graph is not None
    source.version = "2"
    rebuilt = graphs.lookup(source).graph
    assert rebuilt is not None and rebuilt.rematched == 2 and graphs.builds == 2
