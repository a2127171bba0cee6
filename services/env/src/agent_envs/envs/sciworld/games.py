"""AgentGym's SciWorld task list: ``data_idx`` -> (task name, variation).

AgentGym builds it at server start from a JVM (ScienceWorld's tasks in ``tasks.json`` order, minus seven task
types, each with its variations ``0 .. max - 1``). The variation counts are the simulator's (scienceworld 1.2.3)
and are written down here so that the list needs no JVM; ``check_against`` compares them with a live one (the
pool does it on its first JVM, and the tests do it too).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from itertools import accumulate

# (ScienceWorld task id, task name, variations), in tasks.json order, without the task types AgentGym skips:
# 5-1, 5-2 (grow plant / fruit), 9-1, 9-2, 9-3 (inclined planes), 10-1, 10-2 (Mendelian genetics).
TASKS: tuple[tuple[str, str, int], ...] = (
    ("1-1", "boil", 30),
    ("1-2", "melt", 30),
    ("1-3", "freeze", 30),
    ("1-4", "change-the-state-of-matter-of", 30),
    ("2-1", "use-thermometer", 540),
    ("2-2", "measure-melting-point-known-substance", 436),
    ("2-3", "measure-melting-point-unknown-substance", 300),
    ("3-1", "power-component", 20),
    ("3-2", "power-component-renewable-vs-nonrenewable-energy", 20),
    ("3-3", "test-conductivity", 900),
    ("3-4", "test-conductivity-of-unknown-substances", 600),
    ("4-1", "find-living-thing", 300),
    ("4-2", "find-non-living-thing", 300),
    ("4-3", "find-plant", 300),
    ("4-4", "find-animal", 300),
    ("6-1", "chemistry-mix", 32),
    ("6-2", "chemistry-mix-paint-secondary-color", 36),
    ("6-3", "chemistry-mix-paint-tertiary-color", 36),
    ("7-1", "lifespan-longest-lived", 125),
    ("7-2", "lifespan-shortest-lived", 125),
    ("7-3", "lifespan-longest-lived-then-shortest-lived", 125),
    ("8-1", "identify-life-stages-1", 14),
    ("8-2", "identify-life-stages-2", 10),
)
SKIPPED_TASK_IDS = frozenset({"5-1", "5-2", "9-1", "9-2", "9-3", "10-1", "10-2"})

_ENDS = tuple(accumulate(count for _, _, count in TASKS))  # one past each task type's last data_idx
GAME_COUNT = _ENDS[-1]  # 4639


def game(index: int) -> tuple[str, int]:
    """(task name, variation) of ``data_idx`` ``index`` (0 .. GAME_COUNT - 1)."""
    if not 0 <= index < GAME_COUNT:
        raise IndexError(index)
    kind = bisect_right(_ENDS, index)
    return TASKS[kind][1], index - (_ENDS[kind - 1] if kind else 0)


def python_index(data_idx: int) -> int | None:
    """``games[data_idx]`` as AgentGym indexes its list (negative counts from the end): the index, or None where
    Python raises ``list index out of range``."""
    if -GAME_COUNT <= data_idx < GAME_COUNT:
        return data_idx % GAME_COUNT
    return None


def check_against(task_ids: list[str], max_variations: Callable[[str], int]) -> list[str]:
    """The differences between this table and a simulator's (its task ids in order, and its variation counts)."""
    problems = []
    served = [task_id for task_id in task_ids if task_id not in SKIPPED_TASK_IDS]
    if served != [task_id for task_id, _, _ in TASKS]:
        problems.append(f"task ids {served} != {[task_id for task_id, _, _ in TASKS]}")
    for _, name, count in TASKS:
        got = max_variations(name)
        if got != count:
            problems.append(f"{name}: {got} variations, the table says {count}")
    return problems
