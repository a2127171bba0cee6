"""The trainer's import graph (scripts/import_graph.py): every module in exactly one layer, no import from a lower
layer to a higher one and no cycle, deferred imports inside functions included; docs/architecture.md shows the
layers as the script draws them."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("import_graph", REPO / "scripts" / "import_graph.py")
import_graph = importlib.util.module_from_spec(_spec)
sys.modules["import_graph"] = import_graph  # dataclasses look their module up
_spec.loader.exec_module(import_graph)


def test_every_module_is_in_one_layer_and_no_import_runs_up_or_round() -> None:
    assert import_graph.problems() == []


def test_a_deferred_import_that_reaches_up_is_found_and_so_is_the_cycle_it_closes(tmp_path: Path) -> None:
    """The check itself, on a copy of the package with one import added inside a function of the harness."""
    root = tmp_path / import_graph.PACKAGE
    shutil.copytree(import_graph.SOURCE, root, ignore=shutil.ignore_patterns("__pycache__"))
    tasks = root / "harness" / "tasks.py"
    tasks.write_text(
        tasks.read_text() + "\n\ndef _reaches_up() -> None:\n    from ..preflight import run_preflight\n"
    )
    found = import_graph.problems(root)
    assert any(
        p.startswith("upward: harness.tasks (harness) imports preflight.__init__ (runs)") for p in found
    )
    assert any(p.startswith("cycle: ") and "harness.tasks" in p and "preflight.__init__" in p for p in found)


def test_a_module_outside_every_layer_is_found(tmp_path: Path) -> None:
    root = tmp_path / import_graph.PACKAGE
    shutil.copytree(import_graph.SOURCE, root, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "stray.py").write_text('"""In no layer."""\n')
    assert import_graph.problems(root) == [
        f"{import_graph.PACKAGE}.stray is in 0 layers of scripts/import_graph.py: exactly one must hold it"
    ]


def test_the_docs_show_the_layers_as_the_script_draws_them() -> None:
    assert import_graph.layer_listing() in (REPO / "docs" / "architecture.md").read_text(), (
        "docs/architecture.md: paste the output of `python scripts/import_graph.py --layers`"
    )
