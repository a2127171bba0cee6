# Trainer / eval image: verl 0.7.1 GRPO (ToolAgentLoop + WebshopInteraction) and the eval runner, on the CUDA
# image that verl 0.7.1's own stable image is built on.
#
#   docker build -f docker/trainer.Dockerfile -t agent-trainer:local .     (context: the repository root)
#
# Base: lmsysorg/sglang:v0.5.9 (torch 2.9.1+cu129, Python 3.12, sglang 0.5.9); verl's own 0.7.1 image
# (verlai/verl:sgl059.latest) starts from it too. TRAINER_BASE_IMAGE (a build argument, compose passes it from
# .env) selects another tag, a mirror or a digest. Pinned by tag: a tag can be re-pushed, so on a machine with
# registry access `make pin-digests` resolves the tag's digest and writes it into the default below
# (the tag followed by its resolved sha256 digest, never typed in by hand).
#
# Attention: the configs choose PyTorch SDPA explicitly (no flash-attn needed); the build imports every module
# a GPU run imports and fails when one is missing (docker/trainer-image-check.py), flash_attn included as soon
# as a config asks for it.
#
# Non-root: the image runs as `verl` (uid 10001). verl, Ray, sglang and NCCL need no root on one node; they need
# a writable HOME and caches (set below, moved to the cache volume by compose), a large /dev/shm (compose:
# `ipc: host`) and a high open-files limit (compose: ulimits). Compose runs it as RUN_UID with its working
# directory on the logs volume; `agent-train train` starts main_ppo in the run's own directory. Run with
# `--user 0:0` only to debug.
ARG TRAINER_BASE_IMAGE=lmsysorg/sglang:v0.5.9
FROM ${TRAINER_BASE_IMAGE}

# TRAINER_DEVICE: gpu (default: the CUDA base and its sglang) or cpu, the CPU build that `make train-test|eval
# DEVICE=cpu` runs with the same compose services and job scripts: built FROM a base of Python and a CPU torch
# (webshop-trainer-cpu-base, docker/standins/standins.toml), it installs the same packages at the same versions
# (docker/trainer-lock.py's rule 4) and checks the CPU stand-ins of the GPU engine instead of sglang
# (docker/trainer-image-check.py --device). The image's AGENTRL_DEVICE says which it is: `agent-train train` and
# `agent-train eval` substitute the device (and only the device) in a cpu image, and say so in the run's log.
ARG TRAINER_DEVICE=gpu

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# PIP_BREAK_SYSTEM_PACKAGES: the base image installs into the distribution's Python on purpose (so do we);
# the flag keeps pip from refusing should the image carry an EXTERNALLY-MANAGED marker.
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    PYTHONUNBUFFERED=1

WORKDIR /opt/agentrl

# 1. Freeze everything the base image ships (torch, sglang, flash-attn, flashinfer, CUDA wheels, transformers,
#    ...), except numpy (see trainer-constraints.txt) and what the install set of step 2 needs at another version:
#    docker/trainer-lock.py resolves that set (a pip dry run) with the base's documented packages
#    (trainer-base-packages.txt, sglang 0.5.9's exact pins) held at the image's versions, and moves only a base
#    package that a requirement of that resolution excludes (pinned to trainer-constraints.txt's version or the
#    resolver's; a documented package that would have to move fails the build, naming it). The pins of
#    trainer-constraints.txt apply to packages the image lacks or that move, so the two constraint files never
#    disagree. base-freeze.txt (the base's real package set) and what moved (trainer-lock.txt) stay in the image.
COPY docker/trainer-constraints.txt ./trainer-constraints.txt
COPY docker/trainer-base-packages.txt ./base-packages.txt
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
        --unlock numpy ./services/env ./services/trainer verl==0.7.1 cachetools | tee trainer-lock.txt \
 && rm -f /tmp/build-ca.pem

# 2. verl without its dependency list (`verl[sglang]==0.7.1` would pin sglang 0.5.6 and downgrade the image),
#    then the env package (its client, and its API as a Ray Serve app), the trainer package and verl's remaining
#    dependencies. Nothing the image ships moves but what step 1 moved (image-lock.txt). The trainer package
#    pulls in agent-envs[ray], i.e. Ray Serve at this image's Ray (2.49.2): its [serve] extra sets no floor on
#    fastapi or starlette (the verl 0.9 image's Ray 2.60 needs newer ones and unlocks them); step 3 imports Ray
#    Serve and the env's Serve app. tests/deploy/test_trainer_verl09_resolution.py runs step 1's derivation and
#    pip's resolver over this step against the base's documented package set.
# DL3013 (pin pip versions): every version comes from image-lock.txt or trainer-extra.txt (--constraint).
# hadolint ignore=DL3013
RUN --mount=type=secret,id=build_ca \
    { if [ -s /run/secrets/build_ca ]; then \
        cat /etc/ssl/certs/ca-certificates.crt /run/secrets/build_ca > /tmp/build-ca.pem; \
        export PIP_CERT=/tmp/build-ca.pem; fi; } \
 && python3 -m pip install --no-deps verl==0.7.1 \
 && python3 -m pip install --constraint image-lock.txt --constraint trainer-extra.txt \
        ./services/env ./services/trainer verl==0.7.1 cachetools \
 && rm -f /tmp/build-ca.pem

# verl's Hydra configs (each environment's test and full runs, small files over base/: copied whole, as they compose
# from the directory; the agent-loop and interaction configs); agent-train finds them through
# AGENTRL_CONFIG_DIR and passes main_ppo the absolute --config-path it needs.
# The code of the two packages, installed over step 2's metadata-only installs (their dependencies are in).
COPY services/env/ services/env/
COPY services/trainer/ services/trainer/
RUN --mount=type=secret,id=build_ca \
    { if [ -s /run/secrets/build_ca ]; then \
        cat /etc/ssl/certs/ca-certificates.crt /run/secrets/build_ca > /tmp/build-ca.pem; \
        export PIP_CERT=/tmp/build-ca.pem; fi; } \
 && python3 -m pip install --no-deps --force-reinstall ./services/env ./services/trainer \
 && rm -f /tmp/build-ca.pem

COPY configs/ /opt/agentrl/configs/

# 3. Checks that fail the build rather than the first GPU hour: every module a GPU run imports imports here
#    (sglang's server, verl's FSDP workers and agent loop, Ray and Ray Serve with the env's Serve app, the merger,
#    flash_attn when a config needs it; Serve also turns a deployment config into protobuf and back, as it does
#    when it deploys), and `pip check` reports nothing beyond the conflicts the base image already had
#    (base-pip-check.txt, step 1) and those listed with their reasons in trainer-accepted-conflicts.txt. An import
#    that fails only for want of the NVIDIA driver (not mounted during a build) is deferred: the trainer job reruns
#    the imports with --require-driver before its preflight. IMAGE_CHECK_SKIP: modules to leave out; empty by
#    default.
ARG IMAGE_CHECK_SKIP=""
# the check's --skip, here and in the job's rerun of the imports (with the GPU driver)
ENV AGENTRL_IMAGE_CHECK_SKIP=${IMAGE_CHECK_SKIP}
COPY docker/trainer-image-check.py docker/trainer-accepted-conflicts.txt ./
RUN { python3 -m pip check > pip-check.txt || true; } \
 && cat pip-check.txt \
 && python3 trainer-image-check.py --configs /opt/agentrl/configs --device "$TRAINER_DEVICE" --accepted-conflicts trainer-accepted-conflicts.txt \
        --pip-check-output pip-check.txt --baseline base-pip-check.txt --verl-line 0.7 \
 && python3 -c "import importlib.metadata as m, numpy, torch, verl; print('torch', torch.__version__, '| sglang', \
([d.version for d in m.distributions(name='sglang')] or ['none: CPU build'])[0], '| verl', verl.__version__, '| numpy', numpy.__version__)"

RUN groupadd --gid 10001 verl \
 && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/verl --shell /bin/bash verl \
 && mkdir -p /data /outputs /cache \
 && chown verl:verl /data /outputs /cache

# Caches that JIT compilers and the model hub write (flashinfer, triton, Hugging Face): under /cache, which
# compose mounts as a volume so that model downloads and compiled kernels survive the container.
ENV HOME=/home/verl \
    XDG_CACHE_HOME=/cache \
    HF_HOME=/cache/huggingface \
    TRITON_CACHE_DIR=/cache/triton \
    AGENTRL_CONFIG_DIR=/opt/agentrl/configs \
    AGENTRL_DEVICE=${TRAINER_DEVICE}

USER 10001:10001
WORKDIR /home/verl

ENTRYPOINT ["agent-train"]
CMD ["--help"]
