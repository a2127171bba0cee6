"""The rooms: gym-sokoban 0.0.6's room generator (the one RAGEN and verl-agent use), one room per task.

Task ``t``'s room is ``generate_room(dim=(6, 6), num_steps=20, num_boxes=1)`` with Python's ``random`` and numpy's
legacy ``RandomState`` both seeded with ``t``: the room RAGEN's ``reset(seed=t)`` draws with gym-sokoban's generator
(RAGEN seeds both global generators around its call). Where the generator gives up (``RuntimeError``: too few
floor cells; ``RuntimeWarning``: no room with a displaced box), the next try uses a seed derived from ``t`` by a
hash (``derived_seed``), at most ``MAX_TRIES`` tries, so every task has a room and every process draws the same one.

Three things make that deterministic in a multi-threaded server:

- the generator module is a private copy (gym-sokoban's ``envs/room_utils.py``, loaded from the installed package's
  file, never imported as ``gym_sokoban``): its module globals (the reverse search's explored set, best room) are
  this module's alone, and ``gym_sokoban/__init__.py`` (which imports gym and ``pkg_resources``, gone from
  setuptools 81 on) never runs;
- its two random sources are private generators seeded per call (the copy's ``random`` is a ``random.Random(seed)``
  and its ``np.random`` a ``RandomState(seed)``), so the process's global generators are neither read nor
  disturbed, and nothing else drawing from them can change a room (the rooms equal those of seeding the globals:
  tested);
- one lock around the generator (its search keeps its progress in those module globals).

Rooms are cached per process (``room``, an LRU that holds every task's): generating one takes about 3 ms.
"""

from __future__ import annotations

import hashlib
import importlib.util
import random
import threading
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

DIM = (6, 6)  # RAGEN's and verl-agent's room (rows, columns)
NUM_BOXES = 1  # RAGEN's SimpleSokoban and verl-agent's
#: The generator's random walk: 20, gym-sokoban's SokobanEnv default for the room (RAGEN keeps it).
NUM_GEN_STEPS = int(1.7 * (DIM[0] + DIM[1]))
MAX_TRIES = 16  # seeds tried per task (the task's own, then derived ones) before the task is given up
ROOM_CACHE = 10_000  # rooms kept per process: every task's (about 1.1 kB each, 11 MB in all)

# gym-sokoban's codes: room_fixed has WALL, FLOOR, TARGET; room_state adds BOX_ON_TARGET, BOX and PLAYER.
WALL, FLOOR, TARGET, BOX_ON_TARGET, BOX, PLAYER = range(6)

Pos = tuple[int, int]


class NoRoom(RuntimeError):
    """gym-sokoban's generator gave no room for a task in ``MAX_TRIES`` seeds (never seen: tested on every task)."""


@dataclass(frozen=True)
class Room:
    """One task's room: the fixed part (``rows``: ``#`` wall, ``_`` floor, ``O`` target; ``targets``, the ``O``
    cells) and where the player and the boxes start. ``seed`` is the seed that generated it (the task's own unless
    the generator refused it)."""

    rows: tuple[str, ...]
    targets: frozenset[Pos]
    player: Pos
    boxes: tuple[Pos, ...]
    seed: int

    def walkable(self, pos: Pos) -> bool:
        """Inside the room and not a wall."""
        r, c = pos
        return 0 <= r < len(self.rows) and 0 <= c < len(self.rows[r]) and self.rows[r][c] != "#"


def generator_path() -> Path:
    """gym-sokoban's ``envs/room_utils.py`` as installed (found without importing the package)."""
    spec = importlib.util.find_spec("gym_sokoban")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "Sokoban's rooms come from gym-sokoban: pip install -c constraints.txt -e 'services/env[sokoban]'"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "envs" / "room_utils.py"


@cache
def _generator() -> ModuleType:
    path = generator_path()
    spec = importlib.util.spec_from_file_location("agent_envs.envs.sokoban._room_utils", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load gym-sokoban's room generator from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def generator_identity() -> str:
    """gym-sokoban's version and a hash of its generator's source: part of the core's fingerprint."""
    digest = hashlib.sha256(generator_path().read_bytes()).hexdigest()[:16]
    return f"gym-sokoban={metadata.version('gym-sokoban')}:{digest}"


class _NumPy:
    """numpy as the generator sees it, with ``np.random`` a private ``RandomState`` (the legacy stream that
    ``np.random.seed`` + ``np.random.randint`` give, in numpy 1 and 2 alike)."""

    def __init__(self, rng: np.random.RandomState) -> None:
        self.random = rng

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)


_lock = threading.Lock()


def derived_seed(task: int, attempt: int) -> int:
    """The seed of try ``attempt`` (1, 2, ...) after the task's own seed was refused: a stable hash (RAGEN's
    ``abs(hash(str(seed)))`` changes with the process's hash seed)."""
    return int.from_bytes(hashlib.sha256(f"sokoban/{task}/{attempt}".encode()).digest()[:4], "big")


def generate(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """gym-sokoban's ``(room_fixed, room_state)`` for ``seed`` (raises what its generator raises)."""
    utils = _generator()
    with _lock:
        utils.random = random.Random(seed)  # type: ignore[attr-defined]
        utils.np = _NumPy(np.random.RandomState(seed))  # type: ignore[attr-defined]
        fixed, state, _ = utils.generate_room(dim=DIM, num_steps=NUM_GEN_STEPS, num_boxes=NUM_BOXES)
    return np.asarray(fixed, dtype=int), np.asarray(state, dtype=int)


def _to_room(fixed: np.ndarray, state: np.ndarray, seed: int) -> Room | None:
    """The room, or None where it is not one this core can play (checked, never seen)."""
    players = [tuple(map(int, p)) for p in np.argwhere(state == PLAYER)]
    boxes = tuple(sorted(tuple(map(int, p)) for p in np.argwhere(state == BOX)))
    targets = np.argwhere(fixed == TARGET)
    border = np.concatenate([fixed[0], fixed[-1], fixed[:, 0], fixed[:, -1]])
    if len(players) != 1 or len(boxes) != NUM_BOXES or len(targets) != NUM_BOXES or (border != WALL).any():
        return None
    symbol = {WALL: "#", FLOOR: "_", TARGET: "O"}
    rows = tuple("".join(symbol[int(cell)] for cell in row) for row in fixed)
    spots = frozenset((int(r), int(c)) for r, c in targets)
    return Room(rows=rows, targets=spots, player=players[0], boxes=boxes, seed=seed)  # type: ignore[arg-type]


@lru_cache(maxsize=ROOM_CACHE)
def room(task: int) -> Room:
    """Task ``task``'s room (see the module docstring)."""
    for attempt in range(MAX_TRIES):
        seed = task if attempt == 0 else derived_seed(task, attempt)
        try:
            fixed, state = generate(seed)
        except (RuntimeError, RuntimeWarning):
            continue
        found = _to_room(fixed, state, seed)
        if found is not None:
            return found
    raise NoRoom(f"gym-sokoban generated no room for task {task} in {MAX_TRIES} seeds")


_generator()  # at import: the package is importable only where gym-sokoban is installed (its extra)
