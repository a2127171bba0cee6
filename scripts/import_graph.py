"""The trainer package's import graph, computed from the source, checked against its layers.

    python scripts/import_graph.py            # the layers, each module and what it imports (exit 1 on a problem)
    python scripts/import_graph.py --layers   # the layers and the arrows between them (docs/architecture.md's)
    python scripts/import_graph.py --check    # only the problems

Every ``import`` of a module of ``agent_trainer`` counts, at the top of a module or inside a function (a deferred
import is still a dependency: it runs, and it can close a cycle). The layers (:data:`LAYERS`, lowest first) say
which way the arrows may run: a module may import modules of its own layer or of lower layers, never of a higher
one; and no set of modules may import each other round (a cycle). ``tests/trainer/test_import_graph.py`` runs the
check, and that docs/architecture.md shows the layers as ``--layers`` draws them.

Why: a module that reaches up (the spec of an environment importing the verl interaction, the preflight
importing the rehearsal's private helpers and the rehearsal the preflight's) makes the lower part impossible to use
or test without the upper one, and a cycle makes the import order matter. When a module reaches up, move the code
it needs down (or the module up), rather than the layers.
"""

from __future__ import annotations

import argparse
import ast
import sys
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "agent_trainer"
SOURCE = Path(__file__).resolve().parents[1] / "services" / "trainer" / "src" / PACKAGE

#: The layers, lowest first: (name, what it is, the modules in it, by dotted name under ``agent_trainer``; a name
#: ending in ``.`` is every module below that package). Every module must be in exactly one layer.
LAYERS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("foundation", "settings, turns, the launcher's secrets and GPU plan, old module names (stdlib, verl-free)",
     ("__init__", "_moved", "config", "turns", "worker_secrets", "gpu_plan")),
    ("environments", "one spec per environment (prompt, parser, outcome, tasks); WebShop's package: its prompts, "
     "action parser and dataset builder too",
     ("envs.",)),
    ("episode", "one episode of any environment: its record, turn scores, reset, a reply played, slots; the reward "
     "function",
     ("episode", "reward")),
    ("verl adapters", "what verl runs: the agent loops, the 0.7.1 interaction, the task runner",
     ("agent_tokens", "agent_loop", "interaction", "tool_agent_loop", "verl_main")),
    ("data", "the dataset builder of any environment or mix (verl's parquet rows)",
     ("env_data",)),
    ("CPU stand-ins", "verl on CPU: device seams, generation, rollout engine, the rehearsal's checks, the tiny model",
     ("tiny_model", "rehearsal.__init__", "rehearsal.device", "rehearsal.cpu_torch", "rehearsal.cpu_verl07",
      "rehearsal.cpu_platform", "rehearsal.cpu_rollout", "rehearsal.generation", "rehearsal.chat_server",
      "rehearsal.inject", "rehearsal.checks", "rehearsal.direction")),
    ("evaluation", "agent-train eval: policies, the runner, metrics, reports",
     ("evaluation.",)),
    ("harness", "env cluster, catalog, the oracle's tasks, stand-in model servers, verl's worker in process",
     ("harness.",)),
    ("runs", "what runs the whole path on CPU: the preflight's stages, the rehearsal, make learn",
     ("preflight.", "rehearsal.warm_start", "rehearsal.run", "rehearsal.matrix", "rehearsal.learn")),
    ("commands", "the command lines", ("cli", "eval_cli", "env_check")),
)  # fmt: skip


@dataclass(frozen=True)
class Arrow:
    """``source`` imports ``target`` (module names under the package) at ``line``."""

    source: str
    target: str
    line: int


def module_name(path: Path, root: Path = SOURCE) -> str:
    """``envs/textcraft.py`` -> ``envs.textcraft``; a package's ``__init__.py`` -> ``envs.__init__`` (the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts)


def modules(root: Path = SOURCE) -> dict[str, Path]:
    """Every module of the package under ``root``, by dotted name."""
    return {module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def _resolve(name: str, known: Mapping[str, Path]) -> str | None:
    """A dotted name under the package -> the module it is (``envs`` -> ``envs.__init__``), else None."""
    if name in known:
        return name
    if f"{name}.__init__" in known:
        return f"{name}.__init__"
    return None


def arrows(root: Path = SOURCE) -> list[Arrow]:
    """Every import of one of the package's modules by another (the package itself as ``__init__``)."""
    known = modules(root)
    found: list[Arrow] = []
    for source, path in known.items():
        package = source.rsplit(".", 1)[0] if "." in source else ""
        if source.endswith("__init__"):
            package = source.removesuffix(".__init__") if source != "__init__" else ""
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [
                    a.name for a in node.names if a.name == PACKAGE or a.name.startswith(PACKAGE + ".")
                ]
                targets = [t.removeprefix(PACKAGE).lstrip(".") or "__init__" for t in targets]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".") if package else []
                    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                    stem = ".".join([*base, *([node.module] if node.module else [])])
                elif node.module and (node.module == PACKAGE or node.module.startswith(PACKAGE + ".")):
                    stem = node.module.removeprefix(PACKAGE).lstrip(".")
                else:
                    continue
                # ``from . import envs``: the submodule when there is one, else the package itself
                for alias in node.names:
                    sub = f"{stem}.{alias.name}" if stem else alias.name
                    targets.append(sub if _resolve(sub, known) else (stem or "__init__"))
            for target in dict.fromkeys(targets):  # ``from .x import a, b``: one arrow
                resolved = _resolve(target, known)
                if resolved is not None and resolved != source:
                    found.append(Arrow(source, resolved, getattr(node, "lineno", 0)))
    return found


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of the layer holding ``module`` (ValueError when none or several do)."""
    holders = [
        index
        for index, (_, _, members) in enumerate(LAYERS)
        for member in members
        if module == member
        or (member.endswith(".") and module.startswith(member))
        or module == f"{member}.__init__"
    ]
    if len(set(holders)) != 1:
        raise ValueError(f"{PACKAGE}.{module} is in {len(set(holders))} layers of scripts/import_graph.py: "
                         "exactly one must hold it")  # fmt: skip
    return holders[0]


def cycles(edges: Iterable[Arrow]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for arrow in edges:
        graph.setdefault(arrow.source, set()).add(arrow.target)
        graph.setdefault(arrow.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def problems(root: Path = SOURCE) -> list[str]:
    """Every module without exactly one layer, every upward arrow, every cycle, in words."""
    found: list[str] = []
    layers: dict[str, int] = {}
    for module in modules(root):
        try:
            layers[module] = layer_of(module)
        except ValueError as error:
            found.append(str(error))
    edges = arrows(root)
    for arrow in edges:
        if arrow.source in layers and arrow.target in layers and layers[arrow.target] > layers[arrow.source]:
            found.append(f"upward: {arrow.source} ({LAYERS[layers[arrow.source]][0]}) imports {arrow.target} "
                         f"({LAYERS[layers[arrow.target]][0]}) at line {arrow.line}")  # fmt: skip
    for component in cycles(edges):
        found.append("cycle: " + " <-> ".join(component))
    return found


def listing(root: Path = SOURCE) -> str:
    """The layers, top first, each module with the modules it imports (the picture in docs/architecture.md)."""
    edges = arrows(root)
    imports: dict[str, set[str]] = {}
    for arrow in edges:
        imports.setdefault(arrow.source, set()).add(arrow.target)
    by_layer: dict[int, list[str]] = {}
    for module in modules(root):
        try:
            by_layer.setdefault(layer_of(module), []).append(module)
        except ValueError:
            by_layer.setdefault(-1, []).append(module)
    lines: list[str] = []
    for index in sorted(by_layer, reverse=True):
        name, what = (LAYERS[index][0], LAYERS[index][1]) if index >= 0 else ("(no layer)", "")
        lines.append(f"{name}: {what}")
        for module in by_layer[index]:
            shown = module.removesuffix(".__init__") if module != "__init__" else PACKAGE
            targets = sorted(t.removesuffix(".__init__") for t in imports.get(module, ()))
            lines.append(f"  {shown}" + (f" -> {', '.join(targets)}" if targets else ""))
    return "\n".join(lines)


def layer_listing(root: Path = SOURCE) -> str:
    """The layers, top first: each with what it is, its modules (as :data:`LAYERS` names them: ``envs.*`` is every
    module below ``envs``) and the other layers its modules import, all lower once the check passes (the drawing in
    docs/architecture.md)."""
    layers = {module: _layer_or_none(module) for module in modules(root)}
    below: dict[int, set[int]] = {}
    for arrow in arrows(root):
        source, target = layers[arrow.source], layers[arrow.target]
        if source is not None and target is not None and target != source:
            below.setdefault(source, set()).add(target)
    lines: list[str] = []
    for index in reversed(range(len(LAYERS))):
        name, what, members = LAYERS[index]
        lines.extend(textwrap.wrap(f"{name}: {what}", width=110, subsequent_indent="  "))
        shown = ", ".join(f"{m}*" if m.endswith(".") else m for m in members)
        lines.extend(textwrap.wrap(shown, width=110, initial_indent="    ", subsequent_indent="    "))
        if below.get(index):
            targets = ", ".join(LAYERS[i][0] for i in sorted(below[index], reverse=True))
            lines.extend(
                textwrap.wrap(targets, width=110, initial_indent="    -> ", subsequent_indent="       ")
            )
    return "\n".join(lines)


def _layer_or_none(module: str) -> int | None:
    try:
        return layer_of(module)
    except ValueError:  # reported by problems()
        return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--layers", action="store_true", help="the layers and the arrows between them")
    choice.add_argument("--check", action="store_true", help="print only the problems")
    args = parser.parse_args(argv)
    if args.layers:
        print(layer_listing())
    elif not args.check:
        print(listing())
    found = problems()
    for problem in found:
        print(problem, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
