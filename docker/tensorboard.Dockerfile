# TensorBoard for the training runs' event files (compose service `tensorboard`, `make monitor`): a small image
# on the env image's Python base, so that watching the curves never needs the multi-GB CUDA trainer image.
#
#   docker build -f docker/tensorboard.Dockerfile -t agent-tensorboard:local .   (context: the repository root)
#
# PYTHON_BASE_IMAGE: the same build argument (and default) as docker/env.Dockerfile.
ARG PYTHON_BASE_IMAGE=python:3.11.13-slim-bookworm
FROM ${PYTHON_BASE_IMAGE}

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONUNBUFFERED=1

COPY docker/tensorboard-constraints.txt /tmp/tensorboard-constraints.txt
RUN python -m pip install --constraint /tmp/tensorboard-constraints.txt tensorboard==2.21.0 \
 && python -m pip check \
 && tensorboard --version \
 && rm /tmp/tensorboard-constraints.txt \
 && groupadd --gid 10001 tensorboard \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin tensorboard

USER 10001:10001
WORKDIR /tmp
EXPOSE 6006
ENTRYPOINT ["tensorboard"]
CMD ["--logdir", "/outputs/logs", "--host", "0.0.0.0", "--port", "6006"]
