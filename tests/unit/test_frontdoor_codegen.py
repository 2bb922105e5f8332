"""Stub generation: self-contained package (relative imports), staleness follows the .proto."""

from __future__ import annotations

import os

from services.frontdoor import codegen


def test_generated_stubs_import_each_other_relatively(tmp_path):
    written = {p.name for p in codegen.generate(tmp_path)}
    assert {"adaptive_rag_pb2.py", "adaptive_rag_pb2_grpc.py", "adaptive_rag_pb2.pyi"} <= written
    grpc_stub = (tmp_path / "adaptive_rag_pb2_grpc.py").read_text()
    assert "from . import adaptive_rag_pb2" in grpc_stub
    assert "from adaptive_rag" not in grpc_stub  # would resolve to the library package
    assert not (tmp_path / "_staging").exists()


def test_stubs_older_than_the_proto_are_stale(tmp_path):
    codegen.generate(tmp_path)
    assert not codegen.is_stale(tmp_path)
    proto_mtime = max(p.stat().st_mtime for p in codegen.PROTO_FILES)
    stub = tmp_path / "adaptive_rag_pb2.py"
    os.utime(stub, (proto_mtime - 10, proto_mtime - 10))
    assert codegen.is_stale(tmp_path)
