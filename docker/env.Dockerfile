# WebShop environment service image: `agent-envs serve` (FastAPI/uvicorn, several workers) on port 8000.
#
#   docker build -f docker/env.Dockerfile -t agent-envs:local .      (context: the repository root)
#   docker build -f docker/env.Dockerfile --target sciworld -t agent-envs-sciworld:local .   (the SciWorld image)
#   docker run --rm -v "$PWD/data/catalog:/data/catalog:ro" -e AGENTRL_STATE_SECRET=... -p 36001:8000 agent-envs:local
#
# The prepared catalog is mounted read-only at /data/catalog (compose mounts the whole data volume at /data).
# The same image also runs the one-shot `catalog-init` job (`agent-envs catalog generate|download|prepare`),
# which is why spaCy and its English model are installed: catalog prepare computes the title nouns with them,
# exactly as the original does. Nothing on the request path loads spaCy.
#
# Builds with the Dockerfile frontend built into Docker Engine >= 20.10 (no `syntax` line: it would make BuildKit
# pull a frontend image from a registry). Build arguments (compose passes them from .env):
#   PYTHON_BASE_IMAGE  the base of both stages (default below): a mirror or an internal registry goes here
#   SPACY_MODEL        where en_core_web_sm comes from:
#                        url    SPACY_MODEL_URL, pinned by version and SHA-256 (the default; needs GitHub)
#                        wheel  the one en_core_web_sm-*.whl placed in docker/spacy-model/ (air-gapped builds)
#                        none   no spaCy at all: catalog prepare uses the heuristic title nouns, and the
#                               catalog's manifest says so (noun_extractor)
#   SPACY_MODEL_URL    the model wheel's URL with its #sha256= (pip checks it)
#
# Two images from this one file (the default target, `env`, is the last stage):
#   env       webshop-env: every environment that needs no system package (WebShop, TextCraft, BabyAI; no Java)
#   sciworld  agent-envs-sciworld: the same plus Debian's headless Java 17 runtime and scienceworld's simulator jar
#             (the PyPI wheel carries it), for the compose service `sciworld` (profile sciworld). Built FROM the
#             env image's runtime stage, so the two share every layer but the last two; nothing is downloaded at
#             run time. A separate image keeps the default stack small: the JRE and the jar add about 360 MB (940 MB against 583 MB)
#             that a stack without SciWorld never needs.
# Behind a TLS-intercepting proxy, hand the proxy's CA bundle to pip as the BuildKit secret `build_ca`
# (compose: BUILD_CA_BUNDLE in .env; plain docker: --secret id=build_ca,src=FILE). It is added to the system
# bundle for the downloads of the build stage only: a secret mount is never written to an image layer, and the
# runtime stage installs offline.
#
# Base image: Python 3.11 slim (Debian bookworm), pinned by tag. To pin it by digest as well, run
# `make pin-digests` on a machine with registry access (it resolves the tag and writes tag@digest into the ARG
# default below), or append the digest to PYTHON_BASE_IMAGE in .env:
#   docker buildx imagetools inspect python:3.11.13-slim-bookworm --format '{{json .Manifest.Digest}}'
ARG PYTHON_BASE_IMAGE=python:3.11.13-slim-bookworm

# ---- stage 1: build every wheel the runtime needs (no compilers, no network in the runtime stage) -----------
FROM ${PYTHON_BASE_IMAGE} AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1

# spaCy's small English model is not on PyPI: by default it comes from the spaCy models release, pinned by
# version and SHA-256 (pip checks the hash). It must match spaCy's minor version (model 3.8.x <-> spacy 3.8.x).
ARG SPACY_MODEL=url
ARG SPACY_MODEL_URL=https://github.com/explosion/spacy-models/releases/download/en_core_web_sm-3.8.0/en_core_web_sm-3.8.0-py3-none-any.whl#sha256=1932429db727d4bff3deed6b34cfc05df17794f4a52eeb26cf8928f7c1a0fb85

WORKDIR /src
# constraints.txt pins the whole stack (one file for every machine); copied first for layer caching.
COPY constraints.txt ./
COPY docker/spacy-model/ spacy-model/
COPY services/env/ services/env/
# One `pip wheel` resolves the env package (with its `spacy` extra unless SPACY_MODEL=none, and `python-only`: the
# extras of every registered environment that needs no system package) and all transitive dependencies under the
# constraints; the model wheel is fetched as-is (`--no-deps`: its only dependency is
# spaCy, already resolved) or taken from the build context. /wheels/install.txt says what the runtime installs.
RUN --mount=type=secret,id=build_ca \
    set -eu; \
    if [ -s /run/secrets/build_ca ]; then \
      cat /etc/ssl/certs/ca-certificates.crt /run/secrets/build_ca > /tmp/build-ca.pem; \
      export PIP_CERT=/tmp/build-ca.pem; \
    fi; \
    case "$SPACY_MODEL" in \
      url|wheel) package="./services/env[spacy,python-only]"; printf 'agent-envs[spacy,python-only]\nen_core_web_sm\n' > /tmp/install.txt ;; \
      none) package="./services/env[python-only]"; printf 'agent-envs[python-only]\n' > /tmp/install.txt ;; \
      *) echo "SPACY_MODEL must be url, wheel or none (got '$SPACY_MODEL')" >&2; exit 2 ;; \
    esac; \
    pip wheel --wheel-dir /wheels --constraint constraints.txt "$package"; \
    if [ "$SPACY_MODEL" = url ]; then \
      pip wheel --wheel-dir /wheels --no-deps "en_core_web_sm @ ${SPACY_MODEL_URL}"; \
    elif [ "$SPACY_MODEL" = wheel ]; then \
      set -- spacy-model/en_core_web_sm-*.whl; \
      if [ "$#" != 1 ] || [ ! -f "$1" ]; then \
        echo "SPACY_MODEL=wheel: put exactly one en_core_web_sm-*.whl in docker/spacy-model/ (found: $*)" >&2; \
        exit 2; \
      fi; \
      cp "$1" /wheels/; \
    fi; \
    mv /tmp/install.txt /wheels/install.txt; \
    rm -f /tmp/build-ca.pem

# ---- SciWorld's wheels (only the `sciworld` target uses this stage) ------------------------------------------
# scienceworld (its wheel carries the simulator's jar) and py4j, pinned by constraints.txt, resolved against what
# the runtime stage already has (the env package's own requirements come along and are skipped at install).
FROM ${PYTHON_BASE_IMAGE} AS sciworld-wheels

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

WORKDIR /src
COPY constraints.txt ./
RUN --mount=type=secret,id=build_ca \
    set -eu; \
    if [ -s /run/secrets/build_ca ]; then \
      cat /etc/ssl/certs/ca-certificates.crt /run/secrets/build_ca > /tmp/build-ca.pem; \
      export PIP_CERT=/tmp/build-ca.pem; \
    fi; \
    pip wheel --wheel-dir /wheels --constraint constraints.txt scienceworld; \
    rm -f /tmp/build-ca.pem

# ---- stage 2: runtime ------------------------------------------------------------------------------------------
FROM ${PYTHON_BASE_IMAGE} AS runtime

LABEL org.opencontainers.image.title="agent-envs" \
      org.opencontainers.image.description="Stateless WebShop environment service (native + AgentGym-compatible HTTP API)" \
      org.opencontainers.image.licenses="MIT"

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    WEBSHOP_CATALOG=/data/catalog \
    AGENTRL_HOST=0.0.0.0 \
    AGENTRL_PORT=8000 \
    NUMBA_CACHE_DIR=/tmp/numba-cache \
    WEBSHOP_NUMBA_CACHE_SEED=/opt/webshop/numba-cache

# Install offline from the wheels built above (bind-mounted, so they never land in an image layer), then
# check that the installed set is consistent and, when spaCy is in, that it loads the model catalog prepare uses.
# DL3013 (pin pip versions): /wheels holds exactly one pinned version of each package (--no-index).
# hadolint ignore=DL3013
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels --requirement /wheels/install.txt \
 && pip check \
 && python -c "from agent_envs.envs.webshop.core.nouns import default_noun_extractor as d; print('title nouns:', d().name)" \
 && if grep -q en_core_web_sm /wheels/install.txt; then \
      python -c "import spacy; spacy.load('en_core_web_sm'); print('spacy', spacy.__version__)"; \
    fi

# The search kernels are compiled (numba) once here, into the seed that each container copies to its tmpfs
# cache (NUMBA_CACHE_DIR above: the root file system is read-only at run time), instead of ~15 s per worker.
RUN NUMBA_CACHE_DIR="$WEBSHOP_NUMBA_CACHE_SEED" python -c "from agent_envs.envs.webshop.search.bm25 import compile_kernels; compile_kernels()" \
 && chmod -R a+rX "$WEBSHOP_NUMBA_CACHE_SEED"

# Non-root user with a fixed uid/gid (compose may run the container as the host user instead, see .env.example).
# /data belongs to it so that a fresh named volume mounted there is writable by catalog-init.
RUN groupadd --system --gid 10001 webshop \
 && useradd --system --uid 10001 --gid webshop --home-dir /home/webshop --create-home --shell /usr/sbin/nologin webshop \
 && mkdir -p /data \
 && chown webshop:webshop /data

USER 10001:10001
WORKDIR /home/webshop
EXPOSE 8000

# Liveness: /healthz answers as soon as the server is up (compose gates the balancer on /readyz instead).
# Python instead of curl: the slim image has no curl, and urlopen fails on any non-2xx answer.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('AGENTRL_PORT', '8000'), timeout=4)"]

ENTRYPOINT ["agent-envs"]
# Host, port and catalog come from AGENTRL_HOST/AGENTRL_PORT/WEBSHOP_CATALOG above (the health check reads the
# same port); several uvicorn workers per replica, all sharing the catalog through the OS page cache.
CMD ["serve", "--workers", "4"]

# ---- target sciworld: the runtime plus a headless Java 17 runtime and scienceworld ------------------------------
# Debian's openjdk-17-jre-headless (the JRE scienceworld 1.2.3's jar runs on; slim images lack the man directory
# its postinst links into) and the scienceworld wheel, installed offline from the stage above. The build starts
# one JVM and loads a task, so an image that cannot run the simulator never gets tagged.
FROM runtime AS sciworld

LABEL org.opencontainers.image.title="agent-envs-sciworld" \
      org.opencontainers.image.description="The environment service with ScienceWorld (Java 17 runtime and simulator jar)"

# DL3008 (pin apt versions): Debian's archive keeps only the current point release of a package, so a pinned
# version would stop building at the next one; the Java 17 line is the package's name. DL3013 (pin pip versions):
# the wheel directory holds exactly the version constraints.txt pins (--no-index).
USER 0:0
# hadolint ignore=DL3008,DL3013
RUN --mount=type=bind,from=sciworld-wheels,source=/wheels,target=/sciworld-wheels \
    set -eu; \
    mkdir -p /usr/share/man/man1; \
    apt-get update; \
    apt-get install --yes --no-install-recommends openjdk-17-jre-headless; \
    rm -rf /var/lib/apt/lists/*; \
    pip install --no-index --find-links=/sciworld-wheels scienceworld; \
    pip check; \
    java -version; \
    python -c "from agent_envs.envs.sciworld import Simulator, game; s = Simulator(); print('sciworld:', s.load(*game(0))[0][:70]); s.close()"
USER 10001:10001
# One JVM per episode; each JVM's heap capped (the default is a quarter of the machine's memory).
ENV JAVA_TOOL_OPTIONS=-Xmx384m
CMD ["serve", "--workers", "1", "--envs", "sciworld"]

# ---- the default target: the runtime stage as it is (agent-envs) ------------------------------------------------
FROM runtime AS env
