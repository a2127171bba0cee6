# Trainer image of the verl 0.9 line (VERL_LINE=0.9): verl 0.9.1 GRPO with the WebShop agent loop
# (agent_trainer.agent_loop.WebShopAgentLoop, configs/verl09/). verl 0.8.0 removed interactions, so this image
# has no interaction path; the 0.7.1 image (docker/trainer.Dockerfile) keeps it.
#
#   docker build -f docker/trainer-verl09.Dockerfile -t agent-trainer-verl09:local .   (context: the repo root)
#
# Base: verl's own image for sglang 0.5.12, under the name verl's docker/README.md gives for it
# (verlai/verl:sgl0512.latest: FROM lmsysorg/sglang:v0.5.12, torch 2.11 + CUDA 13, sglang 0.5.12, the engine
# pins of verl 0.9.1's [sglang] extra). verl's CI pins verlai/verl:sgl0512.dev4 of the same line; a mirror or
# another tag is one setting: TRAINER09_BASE_IMAGE in .env (compose passes it as the build argument).
# Tags can be re-pushed: pin the digest. On a machine with registry access `make pin-digests` resolves it
# (docker buildx imagetools inspect verlai/verl:sgl0512.latest --format '{{json .Manifest.Digest}}') and writes
# the tag followed by its digest into the ARG default below; or set TRAINER09_BASE_IMAGE to that in .env
# (not checked from the machine this file was written on, which cannot reach a registry).
#
# Non-root: runs as `verl` (uid 10001), like the 0.7.1 image (writable HOME and caches, compose's `ipc: host`
# and ulimits).
ARG TRAINER09_BASE_IMAGE=verlai/verl:sgl0512.latest
FROM ${TRAINER09_BASE_IMAGE}

# TRAINER_DEVICE: gpu (default: the CUDA base and its sglang) or cpu, the CPU build that `make train-test|eval
# DEVICE=cpu` runs with the same compose services and job scripts: built FROM a base of Python and a CPU torch
# (webshop-trainer-cpu-base, docker/standins/standins.toml), it installs the same packages at the same versions
# (docker/trainer-lock.py's rule 4) and checks the CPU stand-ins of the GPU engine instead of sglang
# (docker/trainer-image-check.py --device). The image's AGENTRL_DEVICE says which it is: `agent-train train` and
# `agent-train eval` substitute the device (and only the device) in a cpu image, and say so in the run's log.
ARG TRAINER_DEVICE=gpu

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    PYTHONUNBUFFERED=1

WORKDIR /opt/agentrl

# 1. Freeze everything the base image ships (torch, sglang, flash-attn, CUDA wheels, numpy 2...), except what
#    the install set below needs at another version. docker/trainer-lock.py derives that: pip's resolver (a dry
#    run) resolves the install set with the base's documented packages (trainer-verl09-base-packages.txt,
#    sglang 0.5.12's exact pins) held at the image's versions; a base package that a requirement of that
#    resolution excludes leaves the lock, pinned to our constraints file's version or the resolver's (a base
#    built before Ray 2.60 and fastapi 0.165 has older opentelemetry-api, typing-inspection, aiohttp, protobuf,
#    grpcio... than they need: frozen, the install would be unresolvable); a documented package that would have
#    to move fails the build, naming it. Left out of the lock on purpose (--unlock), pinned by the constraints:
#    - TransferQueue: verl's sgl0512 image was built with TransferQueue 0.1.8, below verl 0.9.1's floor (0.1.10);
#    - transformers: sglang 0.5.12 pins transformers==5.6.0, which verl 0.9.1 excludes (transformers!=5.6.0,
#      >=5.5.3,<5.11); pinned to 5.9.0, verl 0.9.1's own [sglang] pin (its tokenizers range is 5.6.0's);
#    - fastapi and starlette: the trainer package pulls in agent-envs[ray], and ray[serve] 2.60 needs
#      fastapi>=0.133 and starlette>=1.0.1; pinned to the versions the env's API is tested with
#      (../constraints.txt), since Serve runs that API in this image; sglang's HTTP server (imported by verl's
#      sglang server) is import-checked under them (step 3).
#    The other pins of trainer-verl09-constraints.txt apply to packages the image lacks or that move.
#    base-freeze.txt (the base's real package set) stays in the image, beside what moved (trainer-lock.txt).
#    tests/deploy/test_trainer_verl09_resolution.py runs the same derivation and pip's resolver against the
#    documented base with older transitive packages.
COPY docker/trainer-verl09-constraints.txt ./trainer-constraints.txt
COPY docker/trainer-verl09-base-packages.txt ./base-packages.txt
COPY docker/trainer-lock.py ./
# Only the two packages' metadata here (their dependencies; `src` stays empty until the code comes in, after
# step 2): a change to the code rebuilds the last steps alone, not the dependencies.
COPY services/env/pyproject.toml services/env/README.md services/env/
COPY services/trainer/pyproject.toml services/trainer/README.md services/trainer/
RUN --mount=type=secret,id=build_ca \
    { if [ -s /run/secrets/build_ca ]; then \
        cat /etc/ssl/certs/ca-certificates.crt /run/secrets/build_ca > /tmp/build-ca.pem; \
        export PIP_CERT=/tmp/build-ca.pem; fi; } \
 && mkdir -p services/env/src services/trainer/src \
 && { python3 -m pip check > base-pip-check.txt || true; } \
 && python3 -m pip list --format=freeze > base-freeze.txt \
 && python3 trainer-lock.py --freeze base-freeze.txt --documented base-packages.txt --constraints trainer-constraints.txt \
        --unlock TransferQueue,transformers,fastapi,starlette \
        ./services/env ./services/trainer verl==0.9.1 TransferQueue | tee trainer-lock.txt \
 && rm -f /tmp/build-ca.pem

# 2. verl 0.9.1 without its dependency list (`verl[sglang]` would re-resolve the engine the image ships), then
#    the env package (client side), the trainer package, verl's base dependencies and TransferQueue (verl 0.9's
#    default trainer, trainer.use_v1: true, imports it; checked against verl 0.9.1's floor below).
# DL3013 (pin pip versions): every version comes from image-lock.txt or trainer-extra.txt (--constraint).
# hadolint ignore=DL3013
RUN --mount=type=secret,id=build_ca \
    { if [ -s /run/secrets/build_ca ]; then \
        cat /etc/ssl/certs/ca-certificates.crt /run/secrets/build_ca > /tmp/build-ca.pem; \
        export PIP_CERT=/tmp/build-ca.pem; fi; } \
 && python3 -m pip install --no-deps verl==0.9.1 \
 && python3 -m pip install --constraint image-lock.txt --constraint trainer-extra.txt \
        ./services/env ./services/trainer verl==0.9.1 TransferQueue \
 && rm -f /tmp/build-ca.pem \
 && python3 -c "import importlib.metadata as m, numpy, torch, verl, transfer_queue, verl.trainer.main_ppo, \
verl.experimental.agent_loop; \
from packaging.version import Version; \
assert Version(m.version('TransferQueue')) >= Version('0.1.10'), 'verl 0.9.1 needs TransferQueue>=0.1.10'; \
print('torch', torch.__version__, '| sglang', ([d.version for d in m.distributions(name='sglang')] or ['none: CPU build'])[0], '| verl', verl.__version__, '| numpy', \
numpy.__version__, '| TransferQueue', m.version('TransferQueue'))"

# The Hydra configs: configs/verl09/ (training: each environment's file over verl09/base/) and
# configs/agent_loop.yaml (the agent loop), copied whole;
# agent-train finds them through AGENTRL_CONFIG_DIR and picks verl09/ because verl 0.9 is installed.
# The code of the two packages, installed over step 2's metadata-only installs (their dependencies are in).
COPY services/env/ services/env/
COPY services/trainer/ services/trainer/
RUN --mount=type=secret,id=build_ca \
    { if [ -s /run/secrets/build_ca ]; then \
        cat /etc/ssl/certs/ca-certificates.crt /run/secrets/build_ca > /tmp/build-ca.pem; \
        export PIP_CERT=/tmp/build-ca.pem; fi; } \
 && python3 -m pip install --no-deps --force-reinstall ./services/env ./services/trainer \
 && rm -f /tmp/build-ca.pem \
 && python3 -c "import agent_envs, agent_trainer.agent_loop"

COPY configs/ /opt/agentrl/configs/

# 3. Checks that fail the build rather than the first GPU hour (docker/trainer-image-check.py, as in the 0.7.1
#    image): every module a 0.9 run imports (engine workers, the v1 trainer and TransferQueue, sglang's server,
#    the agent loop, the merger, Ray Serve and the env's Serve app), and no `pip check` conflict beyond the base
#    image's own (base-pip-check.txt) and those listed with their reasons. Imports that need the NVIDIA driver
#    are rerun at the job's start.
ARG IMAGE_CHECK_SKIP=""
# the check's --skip, here and in the job's rerun of the imports (with the GPU driver)
ENV AGENTRL_IMAGE_CHECK_SKIP=${IMAGE_CHECK_SKIP}
COPY docker/trainer-image-check.py docker/trainer-accepted-conflicts.txt ./
RUN { python3 -m pip check > pip-check.txt || true; } \
 && cat pip-check.txt \
 && python3 trainer-image-check.py --configs /opt/agentrl/configs/verl09 --device "$TRAINER_DEVICE" \
        --accepted-conflicts trainer-accepted-conflicts.txt --pip-check-output pip-check.txt \
        --baseline base-pip-check.txt --verl-line 0.9

RUN (getent group 10001 || groupadd --gid 10001 verl) \
 && (getent passwd 10001 || useradd --uid 10001 --gid 10001 --create-home --home-dir /home/verl --shell /bin/bash verl) \
 && mkdir -p /home/verl /data /outputs /cache \
 && chown 10001:10001 /home/verl /data /outputs /cache

ENV HOME=/home/verl \
    XDG_CACHE_HOME=/cache \
    HF_HOME=/cache/huggingface \
    TRITON_CACHE_DIR=/cache/triton \
    AGENTRL_CONFIG_DIR=/opt/agentrl/configs \
    AGENTRL_AGENT_LOOP_CONFIG=/opt/agentrl/configs/agent_loop.yaml \
    VERL_LINE=0.9 \
    AGENTRL_DEVICE=${TRAINER_DEVICE}

USER 10001:10001
WORKDIR /home/verl

ENTRYPOINT ["agent-train"]
CMD ["--help"]
