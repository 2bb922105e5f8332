"""`lab.experiments.router_overhead` on routers with a tiny real ONNX encoder: every router's row, the
encoder's row and the async adapter's row are measured and written together."""

from __future__ import annotations

import json
from pathlib import Path

from adaptive_rag.routers.embeddings import OnnxEmbedder
from adaptive_rag.training.learned_routers import KnnRouter, LogisticRouter
from tests.support.encoders import tiny_encoder
from tests.unit.test_learned_routers import keyword_examples


def test_the_benchmark_measures_every_router_side_by_side(tmp_path: Path) -> None:
    from lab.experiments.router_overhead import main

    embedder = OnnxEmbedder(tiny_encoder(tmp_path / "routers" / "encoders" / "tiny"))
    for kind in (KnnRouter, LogisticRouter):
        router = kind(embedder)
        router.fit(keyword_examples(90))
        router.save(tmp_path / "routers" / kind.kind)
    out = tmp_path / "report"
    assert main(["--routers", str(tmp_path / "routers"), "--queries", "60", "--repository",
                 str(tmp_path / "no-models"), "--out", str(out)]) == 0
    result = json.loads((out / "routers.json").read_text())
    assert list(result["rows"]) == ["encoder tiny: embed only", "knn: in-process", "knn: async adapter",
                                    "lr: in-process", "lr: async adapter"]
    assert all(row["n"] == 60 and 0 < row["p50"] <= row["p99"] for row in result["rows"].values())
    assert any("no trained classifier version" in note for note in result["notes"])
    assert "| knn: in-process | 60 |" in (out / "routers.md").read_text()
