"""Write a constraints file: a base file with some pins replaced by an overrides file's.

    python scripts/merge_constraints.py constraints.txt constraints-verl09.txt > .venv-verl09/constraints.txt

Keeps one list of pins (constraints.txt) for both verl lines; the overrides file names only what differs.
pip refuses two pins of one package, so the base file's pin of every overridden package is dropped.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def merge(base: str, overrides: str) -> str:
    """``base`` without the packages ``overrides`` pins, followed by ``overrides``."""
    replaced = {canonical(m.group(1)) for line in overrides.splitlines() if (m := PIN.match(line))}
    kept = [
        line
        for line in base.splitlines()
        if not ((m := PIN.match(line)) and canonical(m.group(1)) in replaced)
    ]
    return "\n".join([*kept, "", "# ---- overrides ----", *overrides.splitlines()]) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: merge_constraints.py BASE OVERRIDES > MERGED", file=sys.stderr)
        return 2
    sys.stdout.write(merge(Path(argv[0]).read_text(), Path(argv[1]).read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
