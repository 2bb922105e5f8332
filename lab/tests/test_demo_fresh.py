"""The fresh-demo timing splits a `make demo` transcript into its steps."""

from __future__ import annotations

from lab.experiments.demo_fresh import phases


def test_steps_are_read_from_the_transcript():
    lines = [
        {"t": 0.0, "line": "test -x .venv/bin/python || python3.11 -m venv .venv"},
        {"t": 9.0, "line": '.venv/bin/python -m pip install -q  -e ".[demo]"'},
        {"t": 9.1, "line": "llama.cpp 0.3.36 (0e5304c23a49): one build of the libraries, ..."},
        {"t": 60.0, "line": ".venv/bin/python -m adaptive_rag.cli reader fetch"},
        {"t": 90.0, "line": "touch .venv/.installed-demo"},
        {"t": 400.0, "line": "llama.cpp 0.3.36: compiled in 380 s"},
        {"t": 401.0, "line": "llama.cpp 0.3.36 (0e5304c23a49): built in 391 s, cached in /tmp/x"},
        {"t": 402.0, "line": ".venv/bin/arag model ship --repository var/model_repository"},
        {"t": 404.0, "line": ".venv/bin/python -m services.demo"},
    ]
    got = phases(lines, wall=500.0)
    assert got["marks_s"] == {"venv": 0.0, "pip": 9.0, "llama_build": 9.1, "reader": 60.0, "installed": 90.0,
                              "llama_built": 401.0, "router": 402.0, "demo": 404.0}
    assert (got["before_demo_s"], got["demo_s"]) == (404.0, 96.0)
    assert (got["llama_compile_s"], got["llama_build_s"]) == (380, 391)


def test_a_warm_run_has_no_build():
    got = phases([{"t": 0.5, "line": ".venv/bin/python -m services.demo"}], wall=80.0)
    assert got["llama_build_s"] is None and got["before_demo_s"] == 0.5 and got["demo_s"] == 79.5
