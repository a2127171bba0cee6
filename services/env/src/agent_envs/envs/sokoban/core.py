"""Sokoban (gym-sokoban's rules and rewards, RAGEN's text rendering) as a pure core: push the box onto the
target in a 6x6 room with ``Up``, ``Down``, ``Left`` and ``Right``.

The episode state is ``{"task": t, "player": [r, c], "boxes": [[r, c], ...], "steps": n}``: the room's fixed part
comes from the task (``rooms.room``), so the state carries only what moves. It travels in the client's signed token;
``step`` never mutates it. What each step pays is gym-sokoban 0.0.6's ``SokobanEnv.step`` (docs/environments/
sokoban.md): -0.1 a step, +1 for a box pushed onto a target, -1 for one pushed off, +10 when every box is on a
target (the episode ends there, solved); the episode also ends after ``MAX_STEPS`` steps (gym-sokoban's
``max_steps``), unsolved.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Sequence
from typing import Any, ClassVar

from ..contract import JSON, BadState, EnvError, EpisodeOver, StateTravel, Transition, UnknownTask
from .rooms import DIM, MAX_TRIES, NUM_BOXES, NUM_GEN_STEPS, Pos, Room, generator_identity, room

STATE_VERSION = 1
TASKS = 10_000  # task t: the room of seed t (RAGEN's reset(seed=t)); the trainer's splits are ranges of these
MAX_STEPS = 100  # RAGEN's and gym-sokoban's max_steps for the 6x6 room (registration: max_steps)
MAX_ACTION_CHARS = (
    10_000  # as the other cores: above the routes' cap (2,048), so only in-process callers meet it
)
MAX_SOLVER_STATES = 200_000  # the expert's search (a 6x6 room with one box has a few hundred states)

#: The actions, as RAGEN names them, and the (row, column) step of each (gym-sokoban's CHANGE_COORDINATES).
ACTIONS: dict[str, Pos] = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}
_BY_WORD = {name.lower(): name for name in ACTIONS}

STEP_PENALTY = -0.1
BOX_ON_TARGET = 1.0
BOX_OFF_TARGET = -1.0
ALL_ON_TARGETS = 10.0

INVALID = "Invalid action: answer Up, Down, Left or Right."


class ActionRefused(EnvError):
    """An action longer than ``MAX_ACTION_CHARS`` (or not a string)."""


def render(current: Room, player: Pos, boxes: Sequence[Pos]) -> str:
    """The room as RAGEN renders it: ``#`` wall, ``_`` floor, ``O`` target, ``X`` box, ``√`` box on a target,
    ``P`` player, ``S`` player on a target; one line per row."""
    grid = [list(row) for row in current.rows]
    for r, c in boxes:
        grid[r][c] = "√" if grid[r][c] == "O" else "X"
    r, c = player
    grid[r][c] = "S" if grid[r][c] == "O" else "P"
    return "\n".join("".join(row) for row in grid)


def move(
    current: Room, player: Pos, boxes: tuple[Pos, ...], action: str
) -> tuple[Pos, tuple[Pos, ...], bool]:
    """gym-sokoban's push-or-move: the player steps onto a free cell, or pushes the box there onto the free cell
    behind it; into a wall, or a box that cannot move, nothing moves. Returns (player, boxes, pushed)."""
    dr, dc = ACTIONS[action]
    ahead = (player[0] + dr, player[1] + dc)
    if not current.walkable(ahead):
        return player, boxes, False
    if ahead not in boxes:
        return ahead, boxes, False
    behind = (ahead[0] + dr, ahead[1] + dc)
    if not current.walkable(behind) or behind in boxes:
        return player, boxes, False
    return ahead, tuple(sorted(behind if box == ahead else box for box in boxes)), True


def on_targets(current: Room, boxes: Sequence[Pos]) -> int:
    targets = current.targets
    return sum(box in targets for box in boxes)


def episode_return(steps: int, boxes_on_target: int, solved: bool) -> float:
    """What the episode's step rewards sum to (rooms start with no box on a target): -0.1 a step, +1 per box on a
    target now, +10 once solved; computed in tenths, so it is exact to the decimal."""
    return (-steps + 10 * boxes_on_target + (100 if solved else 0)) / 10


class Sokoban:
    """``TASKS`` rooms of gym-sokoban's generator, immutable and shared by every episode (the room cache is the
    generator module's, thread-safe)."""

    env_id: ClassVar[str] = "sokoban"
    state_travel: ClassVar[StateTravel] = "token"

    def __init__(self, tasks: int = TASKS, max_steps: int = MAX_STEPS) -> None:
        self.tasks = tasks
        self.max_steps = max_steps
        basis = [f"sokoban-core/{STATE_VERSION}", generator_identity(), f"dim={DIM}", f"boxes={NUM_BOXES}",
                 f"gen_steps={NUM_GEN_STEPS}", f"tries={MAX_TRIES}", f"tasks={tasks}", f"max_steps={max_steps}"]  # fmt: skip
        self._fingerprint = "sokoban-" + hashlib.sha256("|".join(basis).encode()).hexdigest()[:16]

    # ---- the contract -------------------------------------------------------------------------------------
    def task_count(self) -> int:
        return self.tasks

    def fingerprint(self) -> str:
        return self._fingerprint

    def room(self, task: int) -> Room:
        self._check_task(task)
        return room(task)

    def reset(self, task: int) -> Transition:
        current = self.room(task)
        info = self._info(current, current.player, current.boxes, 0, valid=True, moved=False, pushed=False)
        return Transition(
            render(current, current.player, current.boxes), 0.0, False,
            self._encode(task, current.player, current.boxes, 0), info,
        )  # fmt: skip

    def step(self, state: JSON, action: str) -> Transition:
        task, player, boxes, steps = self._decode(state)
        if not isinstance(action, str):
            raise ActionRefused(f"an action is a string, not {type(action).__name__}")
        if len(action) > MAX_ACTION_CHARS:
            raise ActionRefused(
                f"an action is at most {MAX_ACTION_CHARS} characters (this one has {len(action)})"
            )
        current = room(task)
        before = on_targets(current, boxes)
        if before == len(boxes):
            raise EpisodeOver("every box is on a target: the episode is over, reset to play again")
        if steps >= self.max_steps:
            raise EpisodeOver(f"the episode ended after {self.max_steps} steps: reset to play again")
        name = _BY_WORD.get(action.strip().lower())
        if name is None:  # gym-sokoban's no-op (action 0): a step, nothing moves
            new_player, new_boxes, pushed = player, boxes, False
        else:
            new_player, new_boxes, pushed = move(current, player, boxes, name)
        steps += 1
        after = on_targets(current, new_boxes)
        solved = after == len(new_boxes)
        reward = STEP_PENALTY
        if after > before:
            reward += BOX_ON_TARGET
        elif after < before:
            reward += BOX_OFF_TARGET
        if solved:
            reward += ALL_ON_TARGETS
        reward = round(reward, 6)  # -0.1 + 1 is 0.9, not 0.9000000000000001
        observation = render(current, new_player, new_boxes)
        if name is None:
            observation = f"{INVALID}\n{observation}"
        info = self._info(current, new_player, new_boxes, steps, valid=name is not None,
                          moved=new_player != player, pushed=pushed)  # fmt: skip
        return Transition(
            observation, reward, solved or steps >= self.max_steps,
            self._encode(task, new_player, new_boxes, steps), info,
        )  # fmt: skip

    def expert(self, task: int) -> list[str]:
        """A shortest solution (breadth-first over (player, boxes)): the fewest steps, so the highest return."""
        current = self.room(task)
        plan = solve(current, current.player, current.boxes)
        if plan is None:  # generated rooms are solvable by construction (the generator plays them backwards)
            raise EnvError(f"no solution found for task {task} within {MAX_SOLVER_STATES} states")
        return plan

    # ---- helpers --------------------------------------------------------------------------------------------
    def _info(self, current: Room, player: Pos, boxes: tuple[Pos, ...], steps: int, *, valid: bool, moved: bool,
              pushed: bool) -> dict[str, JSON]:  # fmt: skip
        placed = on_targets(current, boxes)
        solved = placed == len(boxes)
        return {
            "valid": valid,  # a recognised action (an unrecognised one is a no-op step)
            "moved": moved,  # the player moved (RAGEN's action_is_effective)
            "pushed": pushed,
            "boxes_on_target": placed,
            "success": solved,
            "truncated": steps >= self.max_steps and not solved,
            "steps": steps,
            "score": episode_return(steps, placed, solved),  # the step rewards so far, summed
            "available_actions": list(ACTIONS),
        }

    def _check_task(self, task: Any) -> None:
        if isinstance(task, bool) or not isinstance(task, int) or not 0 <= task < self.tasks:
            raise UnknownTask(f"Sokoban has tasks 0..{self.tasks - 1}, got {task!r}")

    @staticmethod
    def _encode(task: int, player: Pos, boxes: tuple[Pos, ...], steps: int) -> JSON:
        return {"task": task, "player": list(player), "boxes": [list(box) for box in boxes], "steps": steps}

    def _decode(self, state: JSON) -> tuple[int, Pos, tuple[Pos, ...], int]:
        """A state this core wrote, checked field by field (a hand-made or foreign one is a ``BadState``)."""
        if not isinstance(state, dict) or set(state) != {"task", "player", "boxes", "steps"}:
            raise BadState(
                'not a Sokoban state: want {"task": int, "player": [r, c], "boxes": [[r, c]], "steps": int}'
            )
        task, steps = state["task"], state["steps"]
        if isinstance(task, bool) or not isinstance(task, int) or not 0 <= task < self.tasks:
            raise BadState(f"Sokoban state: task {task!r} is not one of 0..{self.tasks - 1}")
        if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps <= self.max_steps:
            raise BadState(f"Sokoban state: steps {steps!r} is not a count in 0..{self.max_steps}")
        current = room(task)
        player = self._position(current, state["player"], "player")
        raw = state["boxes"]
        if not isinstance(raw, list) or len(raw) != len(current.boxes):
            raise BadState(f"Sokoban state: boxes is a list of {len(current.boxes)} positions")
        boxes = tuple(sorted(self._position(current, box, "box") for box in raw))
        if len(set(boxes)) != len(boxes) or player in boxes:
            raise BadState("Sokoban state: two things on one cell")
        return task, player, boxes, steps

    @staticmethod
    def _position(current: Room, value: Any, what: str) -> Pos:
        if not (isinstance(value, list) and len(value) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):  # fmt: skip
            raise BadState(f"Sokoban state: a {what} position is [row, column], not {value!r}")
        pos = (value[0], value[1])
        if not current.walkable(pos):
            raise BadState(f"Sokoban state: the {what} at {list(pos)} is not on the room's floor")
        return pos


def solve(current: Room, player: Pos, boxes: tuple[Pos, ...]) -> list[str] | None:
    """The shortest action list that puts every box on a target (breadth-first), or None."""
    start = (player, boxes)
    came: dict[tuple[Pos, tuple[Pos, ...]], tuple[Any, str] | None] = {start: None}
    queue = deque([start])
    targets = current.targets
    while queue:
        node = queue.popleft()
        if all(box in targets for box in node[1]):
            plan: list[str] = []
            while (link := came[node]) is not None:
                node, action = link
                plan.append(action)
            return plan[::-1]
        for action in ACTIONS:
            new_player, new_boxes, _ = move(current, node[0], node[1], action)
            nxt = (new_player, new_boxes)
            if nxt not in came:
                if len(came) >= MAX_SOLVER_STATES:
                    return None
                came[nxt] = (node, action)
                queue.append(nxt)
    return None


def make() -> Sokoban:
    """The core, one per process (rooms are generated on first use, about 3 ms each, and cached)."""
    return Sokoban()
