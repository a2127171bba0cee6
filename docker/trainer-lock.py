"""Which of a trainer base image's packages may move when the trainer's install set goes on top of it.

The trainer images install verl, our two packages and their dependencies over a CUDA base image (sglang's) that
must not change: its torch, sglang, flash-attn and CUDA wheels are what the GPU path was tested with. A lock made
of the base's whole ``pip list`` keeps them, but it also freezes every transitive package at whatever version the
base happened to get when it was built, and the install set raises floors the lock cannot know in advance (Ray
2.60's Serve and fastapi 0.165 need opentelemetry-api>=1.44, typing-inspection>=0.4.2, aiohttp>=3.14.4; a base
built earlier has older ones): frozen, such a package makes the install unresolvable, and the build fails.

So the lock is derived, not written by hand:

1. pip's resolver (a dry run) resolves the install set with the base's *documented* packages (sglang's exact pins,
   ``--documented``) held at the base's own versions and everything else free;
2. every requirement of every package in that resolution (markers evaluated with the extras actually requested)
   is checked against the base's installed versions: a base package whose version some requirement excludes
   leaves the lock and is pinned to the version the resolver chose (``trainer-extra.txt``);
3. a documented package that would have to move is an error that names it (the base image is the wrong one),
   except those named by ``--unlock`` (moved on purpose, each with its reason in the Dockerfile);
4. a documented package the base lacks is pinned at its documented version (unless unlocked or pinned by our
   constraints): a base without the GPU, as the CPU build's (``TRAINER_DEVICE=cpu``: Python and a CPU torch, no
   sglang), then installs every package it shares with the CUDA image at the CUDA image's version
   (transformers 4.57.1 for the 0.7.1 image, say), not whatever is newest. On the CUDA base every documented
   package is present and this adds nothing.

Writes ``image-lock.txt`` (the base's pins that stay) and ``trainer-extra.txt`` (pins for what the base lacks or
what had to move), the two ``--constraint`` files of the install step, and prints what moved and why. Used by
docker/trainer.Dockerfile and docker/trainer-verl09.Dockerfile (inside the build) and by
tests/deploy/test_trainer_verl09_resolution.py (against the documented package sets).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

try:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.specifiers import SpecifierSet
except ImportError:  # the base image's Python may lack `packaging`; pip always vendors it
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.specifiers import SpecifierSet  # type: ignore[no-redef]


def norm(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(text: str) -> dict[str, tuple[str, str]]:
    """``name==version`` lines (``pip list --format=freeze``, a constraints file): normalised name -> (as spelt,
    version). Comments, blank lines and lines that pin nothing (``-e``, ``@ file://``) are skipped."""
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line and not line.startswith("-"):
            name, version = (part.strip() for part in line.split("==", 1))
            pins[norm(name)] = (name, version)
    return pins


@dataclass
class Lock:
    """The outcome: what stays frozen, what is pinned besides, and what moved with the requirement that moved it."""

    lock: dict[str, str] = field(default_factory=dict)  # normalised name -> "Name==version" (from the base)
    extra: dict[str, str] = field(default_factory=dict)  # normalised name -> "Name==version"
    moved: dict[str, str] = field(default_factory=dict)  # normalised name -> why


class LockError(RuntimeError):
    """The install set needs a package of the base image's documented set at another version."""


def _parse(specs: Iterable[str]) -> Iterable[Requirement]:
    for spec in specs:
        try:
            yield Requirement(spec)
        except InvalidRequirement:  # malformed old metadata: pip itself ignores it as well
            continue


def requirements_on(report: Mapping) -> dict[str, list[tuple[str, SpecifierSet]]]:
    """Every requirement the resolved packages of a pip ``--report`` place on each name: name -> [(who, spec)].

    A requirement behind ``extra == "x"`` counts only where some package (or the install command) asked for
    ``pkg[x]``; the environment markers are evaluated for this interpreter, the one the image installs into."""
    items = {norm(item["metadata"]["name"]): item for item in report["install"]}
    extras: dict[str, set[str]] = defaultdict(set)
    for name, item in items.items():
        extras[name].update(norm(extra) for extra in item.get("requested_extras") or ())
    parsed = {name: list(_parse(item["metadata"].get("requires_dist") or ())) for name, item in items.items()}

    def applies(requirement: Requirement, owner: str) -> bool:
        if requirement.marker is None:
            return True
        return any(requirement.marker.evaluate({"extra": extra}) for extra in ("", *sorted(extras[owner])))

    changed = True
    while changed:  # extras requested by requirements that themselves sit behind an extra: to a fixed point
        changed = False
        for owner, requirements in parsed.items():
            for requirement in requirements:
                target = norm(requirement.name)
                wanted = {norm(extra) for extra in requirement.extras} - extras[target]
                if wanted and target in items and applies(requirement, owner):
                    extras[target] |= wanted
                    changed = True
    required: dict[str, list[tuple[str, SpecifierSet]]] = defaultdict(list)
    for owner, requirements in parsed.items():
        who = f"{items[owner]['metadata']['name']} {items[owner]['metadata']['version']}"
        for requirement in requirements:
            if str(requirement.specifier) and applies(requirement, owner):
                required[norm(requirement.name)].append((who, requirement.specifier))
    return required


def absent_documented(
    base: Mapping[str, tuple[str, str]],
    documented: Mapping[str, tuple[str, str]] | Iterable[str],
    constraints: Mapping[str, tuple[str, str]],
    unlock: Iterable[str] = (),
) -> dict[str, str]:
    """Rule 4: the documented packages the base lacks (neither unlocked nor pinned by ``constraints``), pinned at
    their documented versions: normalised name -> ``Name==version``. Names without a version pin nothing."""
    if not isinstance(documented, Mapping):
        return {}
    unlock = {norm(name) for name in unlock}
    return {norm(name): f"{spelt}=={version}" for name, (spelt, version) in documented.items()
            if norm(name) not in base and norm(name) not in unlock and norm(name) not in constraints}  # fmt: skip


def derive(
    base: Mapping[str, tuple[str, str]],
    documented: Mapping[str, tuple[str, str]] | Iterable[str],
    constraints: Mapping[str, tuple[str, str]],
    report: Mapping,
    unlock: Iterable[str] = (),
) -> Lock:
    """The lock for installing ``report``'s resolution over ``base`` (see the module docstring)."""
    unlock = {norm(name) for name in unlock}
    absent = absent_documented(base, documented, constraints, unlock)
    documented = {norm(name) for name in documented}
    resolved = {norm(item["metadata"]["name"]): item["metadata"] for item in report["install"]}
    required = requirements_on(report)
    out = Lock()
    refused = []
    for name, (spelt, version) in base.items():
        if name in unlock:
            out.moved[name] = "unlocked on purpose (the Dockerfile says why)"
            continue
        excluded_by = [f"{who} needs {name}{spec}" for who, spec in required.get(name, ())
                       if not spec.contains(version, prereleases=True)]  # fmt: skip
        if not excluded_by:
            out.lock[name] = f"{spelt}=={version}"
            continue
        if name in documented:
            refused.append(f"{spelt}=={version}: " + "; ".join(excluded_by))
            continue
        # our own pin where we have one that every requirement accepts (the version tested), else the resolver's
        ours = constraints.get(name)
        if ours is not None and all(spec.contains(ours[1], prereleases=True) for _, spec in required[name]):
            pin = "==".join(ours)
        else:
            pin = f"{resolved[name]['name']}=={resolved[name]['version']}"
        out.moved[name] = f"{spelt}=={version} -> {pin.split('==', 1)[1]}: " + "; ".join(excluded_by)
        out.extra[name] = pin
    if refused:
        raise LockError(
            "the install set needs packages of the base image's documented set at other versions (a different "
            "base image than the Dockerfile was written for?): " + " | ".join(refused)
        )
    for name, (spelt, version) in constraints.items():
        if name not in out.lock and name not in out.extra:
            out.extra[name] = f"{spelt}=={version}"
    for name, pin in absent.items():
        out.extra.setdefault(name, pin)
    return out


def resolve(
    python: str,
    constraint_files: Sequence[Path],
    install: Sequence[str],
    cwd: Path,
    scratch: Path | None = None,
) -> dict:
    """pip's resolver over ``install`` (paths relative to ``cwd``) under ``constraint_files``, installing nothing:
    its JSON report (written into ``scratch``, default ``cwd``)."""
    report = (scratch or cwd) / "lock-report.json"
    command = [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--progress-bar", "off",
               "--report", str(report), *[arg for path in constraint_files for arg in ("--constraint", str(path))],
               *install]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, cwd=cwd)
    if result.returncode != 0:
        lines = (result.stdout + result.stderr).splitlines()
        # pip's own explanation ("The conflict is caused by: ... depends on ..."), not its progress lines
        start = next(
            (i for i, line in enumerate(lines) if "conflict" in line.lower() or line.startswith("ERROR")), 0
        )
        explanation = "\n".join(line for line in lines[start:] if not line.startswith("WARNING: Location"))
        raise LockError(
            "pip cannot resolve the install set even with the base's undocumented packages free (its documented ones "
            "are held at the image's versions: one of them may need --unlock, with its reason in the Dockerfile):\n"
            + explanation[-4000:]
        )
    return json.loads(report.read_text())


def build_lock(
    base: Mapping[str, tuple[str, str]],
    documented: Mapping[str, tuple[str, str]] | Iterable[str],
    constraints: Mapping[str, tuple[str, str]],
    install: Sequence[str],
    unlock: Iterable[str] = (),
    python: str = sys.executable,
) -> Lock:
    """The two steps: resolve with the documented packages held (at the base's versions; those the base lacks at
    their documented ones), then derive the lock."""
    unlock = {norm(name) for name in unlock}
    absent = absent_documented(base, documented, constraints, unlock)
    names = [norm(name) for name in documented]
    held = {
        name: f"{base[name][0]}=={base[name][1]}" for name in names if name in base and name not in unlock
    }
    held.update(absent)
    # our pins for what the base lacks, and for what it has at the very version we pin (the one tested): held, so
    # the resolver cannot move a package the lock then keeps while moving what that package needs (a base with
    # datasets 4.0.0 resolved with a newer datasets moved dill for it, and the install then refused dill's pin)
    pins = {name: f"{spelt}=={version}" for name, (spelt, version) in constraints.items()
            if name not in base or name in unlock or base[name][1] == version}  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        where = Path(scratch)
        (where / "held.txt").write_text("\n".join(held.values()) + "\n")
        (where / "pins.txt").write_text("\n".join(pins.values()) + "\n")
        report = resolve(python, [where / "held.txt", where / "pins.txt"], install, Path.cwd(), where)
    return derive(base, documented, constraints, report, unlock)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write image-lock.txt and trainer-extra.txt for installing a trainer's packages over a base "
        "image: every base package stays at its version unless the install set's requirements exclude it.",
        epilog="Example (inside the build): pip list --format=freeze > base-freeze.txt; trainer-lock.py --freeze "
        "base-freeze.txt --documented base-packages.txt --constraints trainer-constraints.txt --unlock "
        "transformers -- ./services/env ./services/trainer verl==0.9.1",
    )
    parser.add_argument(
        "--freeze", type=Path, required=True, help="the base image's `pip list --format=freeze`"
    )
    parser.add_argument("--documented", type=Path, required=True,
                        help="the base's documented package set: these may never move (except --unlock)")  # fmt: skip
    parser.add_argument("--constraints", type=Path, required=True,
                        help="our pins, applied to what the base lacks or what moves")  # fmt: skip
    parser.add_argument("--unlock", default="", help="comma-separated names that leave the lock on purpose")
    parser.add_argument("--out-dir", type=Path, default=Path("."), help="where the two files go (default: .)")
    parser.add_argument("install", nargs="+", help="what the install step installs, as it spells it")
    args = parser.parse_args(argv)
    try:
        lock = build_lock(
            read_pins(args.freeze.read_text()),
            read_pins(args.documented.read_text()),
            read_pins(args.constraints.read_text()),
            args.install,
            [name for name in args.unlock.split(",") if name.strip()],
        )
    except LockError as error:
        print(f"trainer-lock: {error}", file=sys.stderr)
        return 1
    (args.out_dir / "image-lock.txt").write_text("".join(f"{pin}\n" for pin in lock.lock.values()))
    (args.out_dir / "trainer-extra.txt").write_text("".join(f"{pin}\n" for pin in lock.extra.values()))
    print(
        f"base image: {len(lock.lock)} packages frozen, {len(lock.moved)} moved, {len(lock.extra)} pins added"
    )
    for name, why in sorted(lock.moved.items()):
        print(f"  moved {name}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
