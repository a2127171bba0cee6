"""The verl 0.9 trainer image's install set resolves: pip's resolver (a dry run, against the package index) installs
what docker/trainer-verl09.Dockerfile installs (verl 0.9.1, TransferQueue, our two packages) under the constraints
the Dockerfile builds: every package of the base image frozen except those its lock step unlocks, plus
trainer-verl09-constraints.txt's pins for packages the base lacks. The base image's package set is its documented
one (docker/trainer-verl09-base-packages.txt: sglang 0.5.12's exact pins).

Needs the package index (CI and the development machines reach PyPI); skipped, saying so, where it cannot be
reached."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "trainer-verl09.Dockerfile"
BASE_PACKAGES = REPO / "docker" / "trainer-verl09-base-packages.txt"
CONSTRAINTS = REPO / "docker" / "trainer-verl09-constraints.txt"

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


def _unlocked_pattern() -> re.Pattern[str]:
    """The Dockerfile's own rule for what leaves the lock (its `grep -viE '<pattern>'` on `pip list`)."""
    match = re.search(
        r"pip list --format=freeze \| grep -viE '([^']+)' > image-lock\.txt", DOCKERFILE.read_text()
    )
    assert match, "the Dockerfile no longer builds image-lock.txt with grep -viE: update this test"
    return re.compile(match.group(1), re.IGNORECASE)


def constraint_files(tmp_path: Path, unlocked: re.Pattern[str]) -> list[Path]:
    """image-lock.txt and trainer-extra.txt as the Dockerfile's step 1 writes them from the base package set."""
    lock = {name: pin for name, pin in _pins(BASE_PACKAGES).items() if not unlocked.search(pin)}
    extra = {name: pin for name, pin in _pins(CONSTRAINTS).items() if name not in lock}
    (tmp_path / "image-lock.txt").write_text("\n".join(lock.values()) + "\n")
    (tmp_path / "trainer-extra.txt").write_text("\n".join(extra.values()) + "\n")
    return [tmp_path / "image-lock.txt", tmp_path / "trainer-extra.txt"]


def dry_run(tmp_path: Path, constraints: list[Path]) -> subprocess.CompletedProcess[str]:
    """pip's resolver over the Dockerfile's step-2 install set, without installing anything."""
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report",
               str(report), *[arg for c in constraints for arg in ("--constraint", str(c))],
               str(REPO / "services" / "env"), str(REPO / "services" / "trainer"), "verl==0.9.1", "TransferQueue"]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)


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
    installed = {_norm(item["metadata"]["name"]): item["metadata"]["version"]
                 for item in json.loads((tmp_path / "report.json").read_text())["install"]}  # fmt: skip
    assert installed["verl"] == "0.9.1" and installed["transferqueue"] == "0.1.11"
    assert installed["transformers"] == "5.9.0"  # verl 0.9.1's [sglang] pin, not the base's 5.6.0
    assert installed["torch"] == _pins(BASE_PACKAGES)["torch"].split("==")[1]  # the base's torch is kept


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
