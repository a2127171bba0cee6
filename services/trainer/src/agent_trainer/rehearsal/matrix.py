"""``make rehearse-bugs``: the rehearsal on each verl line with each bug of :mod:`.inject` put in, and once without;
every run with a bug must fail (naming the check that exists for it) and the run without must pass.

    python -m agent_trainer.rehearsal.matrix --venv 0.7=.venv --venv 0.9=.venv-verl09 --catalog data/catalog

Each run is ``<venv>/bin/agent-train rehearse`` (``--fail-fast`` by default: a bug's run ends at the first failed
check, whose record holds every check of that step or sync); the table goes to ``OUT/matrix.json`` and stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .inject import BUGS
from .inject import ENV as INJECT_ENV
from .run import RehearsalOptions

#: The check that must fail for each bug (others may fail too: a flipped reward also turns the update around).
EXPECTED = {
    "reward_sign": "reward_matches_env",
    "mask_env_pages": "loss_mask_is_model_tokens",
    "sync_skip": "weight_sync",
    "sync_partial": "weight_sync",
    "sync_stale": "weight_sync",
    "reward_zero": "reward_matches_env",  # make learn's bug: the reward the trainer used is 0, the env paid
}


def run_one(venv: Path, line: str, bug: str | None, out: Path, catalog: Path, fail_fast: bool = True,
            extra: list[str] | None = None, timeout: float = 3600) -> dict[str, Any]:  # fmt: skip
    """One rehearsal (``bug`` injected, or none) in ``venv``; its exit status and the summary's verdicts."""
    command = [str(venv / "bin" / "agent-train"), "rehearse", "--catalog", str(catalog), "--out", str(out),
               *(["--fail-fast"] if fail_fast and bug else []), *(extra or [])]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != INJECT_ENV}
    if bug:
        env[INJECT_ENV] = bug
    started = time.monotonic()
    done = subprocess.run(command, env=env, timeout=timeout, capture_output=True, text=True)
    path = out / f"verl{line}{RehearsalOptions().label}" / "summary.json"  # the default run's: WebShop
    summary = json.loads(path.read_text()) if path.exists() else {}
    failed = sorted(
        {*summary.get("failed_checks", []), *(k for k, v in summary.get("checks", {}).items() if not v)}
    )
    expected = EXPECTED.get(bug or "")
    caught = done.returncode != 0 and expected in failed if bug else done.returncode == 0 and not failed
    return {"line": line, "bug": bug, "exit": done.returncode, "failed_checks": failed, "expected": expected,
            "as_it_should": caught, "env_reward_mean": summary.get("env_reward_mean"),
            "errors": summary.get("errors", [])[:2], "seconds": round(time.monotonic() - started, 1),
            "summary": str(path), "stderr_tail": done.stderr[-400:] if not path.exists() else ""}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make rehearse-bugs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", action="append", default=[], metavar="LINE=DIR",
                        help="a verl line and its environment, e.g. 0.7=.venv (repeatable)")  # fmt: skip
    parser.add_argument("--catalog", type=Path, default=Path("data/catalog"))
    parser.add_argument("--out", type=Path, default=Path("outputs/rehearsal-bugs"))
    parser.add_argument(
        "--bugs", default=",".join(BUGS), help=f"comma-separated (default: all: {','.join(BUGS)})"
    )
    parser.add_argument("--no-clean", action="store_true", help="skip the run without a bug")
    parser.add_argument("--full", action="store_true", help="run every rehearsal to its end (no --fail-fast)")
    args = parser.parse_args(argv)
    venvs = dict(item.split("=", 1) for item in args.venv) or {"0.7": ".venv", "0.9": ".venv-verl09"}
    bugs: list[str | None] = [b.strip() for b in args.bugs.split(",") if b.strip()]
    unknown = sorted(set(bugs) - set(BUGS))  # type: ignore[arg-type]
    if unknown:
        parser.error(f"unknown bug(s) {', '.join(unknown)}; known: {', '.join(BUGS)}")  # type: ignore[arg-type]
    if not args.no_clean:
        bugs = [None, *bugs]
    rows = []
    for line, venv in venvs.items():
        for bug in bugs:
            out = args.out / (bug or "none")
            row = run_one(
                Path(venv),
                line,
                bug,
                out,
                args.catalog,
                fail_fast=not args.full,
                extra=["--model-dir", str(args.out / "tiny_model")],
            )  # one warm start for every run
            rows.append(row)
            print(f"verl {line} {bug or 'no bug':>15}: exit {row['exit']}, failed {row['failed_checks'] or '-'} "
                  f"-> {'as it should' if row['as_it_should'] else 'WRONG'} ({row['seconds']} s)", flush=True)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "matrix.json").write_text(json.dumps(rows, indent=2) + "\n")
    wrong = [r for r in rows if not r["as_it_should"]]
    print(f"{len(rows) - len(wrong)} of {len(rows)} runs as they should ({args.out / 'matrix.json'})")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
