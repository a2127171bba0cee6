"""``make pin-digests``: resolve each Dockerfile's base image tag to its registry digest and pin it.

    python3 docker/pin-digests.py [--docker docker] FILE...

For every ``ARG <NAME>_BASE_IMAGE=<image>`` default (the build arguments the FROM lines use) it asks the
registry for the tag's digest (``docker buildx imagetools inspect <image> --format '{{json .Manifest.Digest}}'``)
and rewrites the default to ``<image>@sha256:<digest>`` (an existing digest is replaced by the current one).
Needs registry access: run it on such a machine and commit what changed. Nothing is written unless every
digest resolved to 64 hex digits. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

BASE_ARG = re.compile(r"^(ARG\s+\w*BASE_IMAGE=)(\S+)$", re.MULTILINE)
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def resolve_digest(image: str, docker: str) -> str:
    """The registry digest (``sha256:...``) of ``image`` (a tag; any digest on it is ignored)."""
    tag = image.partition("@")[0]
    command = [docker, "buildx", "imagetools", "inspect", tag, "--format", "{{json .Manifest.Digest}}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {result.stderr.strip()[-500:]}")
    digest = json.loads(result.stdout.strip() or '""')
    if not DIGEST.match(digest):
        raise RuntimeError(f"{tag}: the registry answered {result.stdout.strip()!r}, not a sha256 digest")
    return digest


def pin(text: str, docker: str) -> tuple[str, list[str]]:
    """``text`` with every base-image ARG default pinned, and what changed."""
    changes: list[str] = []

    def replace(match: re.Match[str]) -> str:
        tag = match.group(2).partition("@")[0]
        pinned = f"{tag}@{resolve_digest(tag, docker)}"
        if pinned != match.group(2):
            changes.append(f"{match.group(2)} -> {pinned}")
        return match.group(1) + pinned

    return BASE_ARG.sub(replace, text), changes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docker", default="docker")
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    updated: dict[Path, str] = {}
    try:
        for path in args.files:
            text, changes = pin(path.read_text(), args.docker)
            for change in changes:
                print(f"{path}: {change}")
            if changes:
                updated[path] = text
    except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as error:
        print(f"pin-digests: {error}; nothing written", file=sys.stderr)
        return 1
    for path, text in updated.items():
        path.write_text(text)
    print(
        f"pin-digests: {len(updated)} file(s) updated"
        if updated
        else "pin-digests: every base image already pinned"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
