"""AgentGym's BabyAI text layer over minigrid's 7x7 egocentric view, written from the behaviour spec and the
recorded traces: the state description, the available actions with their BFS-planned primitive actions, and
the messages for the actions that are not available. Pure: one ``Frame`` per view image, no minigrid import.

Coordinates are the view's: ``x`` 0..6 left to right, ``y`` 0..6 far to near; the agent stands at (3, 6)
facing up (minigrid direction 3). The image is minigrid's ``obs["image"]`` (``image[x][y] = (type, colour,
state)``); with a carried object minigrid shows it on the agent's own cell.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

# minigrid's encodings (minigrid.core.constants, 2.3.1)
UNSEEN, EMPTY, WALL, FLOOR, DOOR, KEY, BALL, BOX, GOAL, LAVA = range(10)
TYPE_NAMES = {WALL: "wall", DOOR: "door", KEY: "key", BALL: "ball", BOX: "box", GOAL: "goal", LAVA: "lava"}
COLOR_NAMES = ("red", "green", "blue", "purple", "yellow", "grey")
DOOR_STATES = ("open", "closed", "locked")
OBJECT_TYPES = frozenset(TYPE_NAMES)  # what the description lists (walls only switch the header on)
PICKABLE = frozenset((KEY, BALL, BOX))
PLANNER_FREE = frozenset((UNSEEN, EMPTY, FLOOR, DOOR, GOAL))  # doors even closed; unseen cells too

# minigrid's actions
LEFT, RIGHT, FORWARD, PICKUP, DROP, TOGGLE = range(6)
# direction vectors (minigrid.core.constants.DIR_TO_VEC); in the view the agent faces "up" (3)
DIR_VEC = ((1, 0), (0, 1), (-1, 0), (0, -1))
AGENT_X, AGENT_Y, AGENT_DIR, VIEW = 3, 6, 3, 7

CHECK_ACTION = "check available actions"
NOT_RECOGNIZED = "The action is not recognized. Please check valid actions."
NO_CHANGE = "No change in state."
COMPLETED = "\n The task is completed."

Image = Sequence[Sequence[Sequence[int]]]


@dataclass(frozen=True)
class Seen:
    """One object cell of the view, with its distance from the agent (Manhattan)."""

    kind: int
    color: int
    state: int
    x: int
    y: int

    @property
    def name(self) -> str:
        color = COLOR_NAMES[self.color]
        if self.kind == DOOR:
            return f"{color} {DOOR_STATES[self.state]} door"
        return f"{color} {TYPE_NAMES[self.kind]}"

    @property
    def distance(self) -> int:
        return abs(self.x - AGENT_X) + (AGENT_Y - self.y)


@dataclass(frozen=True)
class Frame:
    """What the wrapper knows after one observation: the description, the available actions in order (each
    with its primitive actions) and the prepared messages for actions that are not available."""

    description: str
    actions: dict[str, tuple[int, ...]]
    messages: dict[str, str]

    @property
    def action_names(self) -> list[str]:
        return list(self.actions)

    def actions_line(self) -> str:
        """``Available actions: [...]`` as the original prints it (a JSON list)."""
        return "Available actions: " + json.dumps(self.action_names)

    def check_text(self) -> str:
        return "You can take the following actions: " + ", ".join(self.actions)


def postprocess_mission(mission: str) -> str:
    """The goal line's mission: every "then" and "after you" read as "and" (the original's rewording)."""
    return mission.replace("then", "and").replace("after you", "and")


def frame_from_image(image: Image, carrying: tuple[int, int] | None, absdir: int) -> Frame:
    """The description and action table for one 7x7 view; ``carrying``: (type, colour) of the held object;
    ``absdir``: the agent's absolute direction (the planner's reach depends on it)."""
    grid = [
        [(int(image[x][y][0]), int(image[x][y][1]), int(image[x][y][2])) for y in range(VIEW)]
        for x in range(VIEW)
    ]
    seen = [
        Seen(grid[x][y][0], grid[x][y][1], grid[x][y][2], x, y)
        for y in range(VIEW)
        for x in range(VIEW)
        if (x, y) != (AGENT_X, AGENT_Y) and grid[x][y][0] in OBJECT_TYPES
    ]
    seen.sort(key=lambda obj: obj.distance)  # stable: ties stay in row order (far rows first, left to right)
    planner = Planner(grid, absdir)
    return Frame(describe(grid, seen, carrying), *action_table(grid, seen, carrying, planner))


def describe(
    grid: list[list[tuple[int, int, int]]], seen: list[Seen], carrying: tuple[int, int] | None
) -> str:
    parts: list[str] = []
    if seen:
        parts.append("In front of you in this room, you can see several objects: ")
        counts: dict[str, int] = {}
        for obj in seen:
            if obj.kind == WALL:
                continue
            counts[obj.name] = counts.get(obj.name, 0) + 1
            parts.append(f"There is a {obj.name} {counts[obj.name]} {where(obj)}  ")
    else:
        parts.append("You cannot see any objects within sight.")
    parts.append("The room has walls around you. ")
    for y in range(AGENT_Y - 1, -1, -1):
        kind = grid[AGENT_X][y][0]
        if kind in (WALL, BOX):
            parts.append(f"You are facing a {TYPE_NAMES[kind]} {AGENT_Y - y} steps away. ")
            break
    if carrying is None:
        parts.append("You are not carrying anything.")
    else:
        parts.append(f"You are carrying a {COLOR_NAMES[carrying[1]]} {TYPE_NAMES[carrying[0]]}.")
    return "".join(parts)


def where(obj: Seen) -> str:
    ahead, right = AGENT_Y - obj.y, obj.x - AGENT_X
    if right == 0:
        return f"right in front of you {ahead} steps away."
    side = f"{right} steps to your right" if right > 0 else f"{-right} steps to your left"
    return f"{ahead} steps in front of you and {side}."


# How far the planner may step outside the 7x7 view, by the agent's absolute direction (minigrid's
# ``agent_dir``): (largest x, largest y) in view coordinates. Read off the recorded traces, where the original
# plans through the row behind the agent when it faces east or south, and through the column past its right
# edge when it faces south or west (cells that it never sees, taken as free); never when it faces north.
# This is what the original's planner does, not a design: see docs/environments/babyai.md.
PLAN_LIMITS: dict[int, tuple[int, int]] = {0: (6, 7), 1: (7, 7), 2: (7, 6), 3: (6, 6)}


class Planner:
    """Breadth-first search over (x, y, direction) from the agent's own pose, through the view plus the extra
    row or column ``PLAN_LIMITS`` allows. Obstacles: walls, keys, balls, boxes, lava; free: empty, floor,
    doors (even closed or locked) and cells the agent cannot see. One search per frame serves every target: a
    target's path ends in the first state, in discovery order, that meets it (what a search per target
    stopping at its first goal meets first).

    Which path leads there is the original's rule, found by replaying recordings of it: it marks a state
    visited only when the state leaves its queue, so a state can be queued once per shortest path to it, and
    the predecessor it keeps is the one that queued it last (each queuing overwrites the one before). That is
    not the first shortest path a textbook search keeps: with two shortest ways into a state, the original
    walks the one through the predecessor dequeued last. Queuing a state once per path costs a number of
    entries that grows with the number of shortest paths; the same answer comes from one pass per layer in
    the order its states were queued last (a state's last queuing comes from its predecessor queued last,
    by induction): ``_layers`` does that, each state once."""

    def __init__(self, grid: list[list[tuple[int, int, int]]], absdir: int) -> None:
        self.grid = grid
        self.limits = PLAN_LIMITS[absdir]
        start = (AGENT_X, AGENT_Y, AGENT_DIR)
        # insertion order = discovery order (first queued); the value: (predecessor queued last, action)
        self.parent: dict[tuple[int, int, int], tuple[tuple[int, int, int], int] | None] = {start: None}
        self._layers(start)
        # the first state, in discovery order, standing on / facing each cell
        self.first_on: dict[tuple[int, int], tuple[int, int, int]] = {}
        self.first_facing: dict[tuple[int, int], tuple[int, int, int]] = {}
        for x, y, d in self.parent:  # dicts keep insertion (= discovery) order
            dx, dy = DIR_VEC[d]
            self.first_on.setdefault((x, y), (x, y, d))
            self.first_facing.setdefault((x + dx, y + dy), (x, y, d))

    def _moves(self, state: tuple[int, int, int]) -> list[tuple[int, tuple[int, int, int]]]:
        """(action, next state) for the moves allowed from ``state``, in the order the search tries them:
        forward, left, right (it decides which states each layer meets first, and so which state facing a
        target ends its path; the recordings pin it)."""
        x, y, d = state
        dx, dy = DIR_VEC[d]
        nx, ny = x + dx, y + dy
        max_x, max_y = self.limits
        out = []
        if (
            0 <= nx <= max_x
            and 0 <= ny <= max_y
            and (nx >= VIEW or ny >= VIEW or self.grid[nx][ny][0] in PLANNER_FREE)
        ):
            out.append((FORWARD, (nx, ny, d)))
        out.append((LEFT, (x, y, (d - 1) % 4)))
        out.append((RIGHT, (x, y, (d + 1) % 4)))
        return out

    def _layers(self, start: tuple[int, int, int]) -> None:
        """Layer by layer (every move changes the parity of x + y + direction, so a state's predecessors all
        lie in the layer before it): discover the next layer in first-queued order, then give each of its
        states the predecessor that queues it last, walking the layer in last-queued order."""
        parent = self.parent
        first: list[tuple[int, int, int]] = [start]  # this layer, in the order its states were first queued
        last: list[tuple[int, int, int]] = [start]  # the same states, in the order they were last queued
        moves: dict[tuple[int, int, int], list[tuple[int, tuple[int, int, int]]]] = {}
        while first:
            new: list[tuple[int, int, int]] = []
            for state in first:
                moves[state] = allowed = self._moves(state)
                for _action, nxt in allowed:
                    if nxt not in parent:
                        parent[nxt] = None
                        new.append(nxt)
            layer = set(new)
            queued_last: dict[tuple[int, int, int], None] = {}
            for state in last:
                for action, nxt in moves[state]:
                    if nxt in layer:
                        parent[nxt] = (state, action)
                        queued_last.pop(nxt, None)
                        queued_last[nxt] = None
            first, last = new, list(queued_last)

    def path(self, state: tuple[int, int, int]) -> tuple[int, ...]:
        actions: list[int] = []
        step = self.parent[state]
        while step is not None:
            state, action = step
            actions.append(action)
            step = self.parent[state]
        return tuple(reversed(actions))

    def to_face(self, x: int, y: int) -> tuple[int, ...] | None:
        """The path that ends facing cell (x, y), or None."""
        state = self.first_facing.get((x, y))
        return None if state is None else self.path(state)

    def onto(self, x: int, y: int) -> tuple[int, ...] | None:
        """The path that ends standing on cell (x, y), or None."""
        state = self.first_on.get((x, y))
        return None if state is None else self.path(state)


def reachable_label(name: str, counts: dict[str, int], reachable: bool) -> str:
    """``<name> <k>`` for a pickup or go-to: ``k`` counts only the objects of that name with a path, so the
    first reachable one is 1 even when a nearer one of the same name is not (the description numbers them
    all). An unreachable object takes the number the next reachable one would get: its message can be
    overwritten by a later unreachable one's, and shadowed by a reachable one's action of the same label."""
    if reachable:
        counts[name] = counts.get(name, 0) + 1
        return f"{name} {counts[name]}"
    return f"{name} {counts.get(name, 0) + 1}"


def action_table(
    grid: list[list[tuple[int, int, int]]],
    seen: list[Seen],
    carrying: tuple[int, int] | None,
    planner: Planner,
) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    actions: dict[str, tuple[int, ...]] = {"turn left": (LEFT,), "turn right": (RIGHT,)}
    messages: dict[str, str] = {}
    ahead = grid[AGENT_X][AGENT_Y - 1]
    if ahead[0] in (WALL, BOX):
        messages["move forward"] = "There is a barrier in front of you, you can't move forward."
    else:
        actions["move forward"] = (FORWARD,)

    if carrying is None:
        messages["drop"] = "You cannot drop the object, as you are not carrying anything."
        counts: dict[str, int] = {}
        for obj in seen:
            if obj.kind not in PICKABLE:
                continue
            path = planner.to_face(obj.x, obj.y)
            label = reachable_label(obj.name, counts, path is not None)
            if path is None:
                messages[f"pickup {label}"] = f"You cannot pickup {label}, as there is no path leading to it."
            else:
                actions[f"pickup {label}"] = (*path, PICKUP)
    elif ahead[0] in (WALL, BOX, LAVA, BALL, KEY):
        messages["drop"] = "You cannot drop the object, as there is already an object in front of you."
    else:
        actions["drop"] = (DROP,)

    cnt_door: dict[str, int] = {}
    for obj in seen:
        if obj.kind != DOOR:
            continue
        cnt_door[obj.name] = cnt_door.get(obj.name, 0) + 1
        label = f"{obj.name} {cnt_door[obj.name]}"
        state = DOOR_STATES[obj.state]
        if state == "open":
            path = planner.onto(obj.x, obj.y)
            if path is None:
                messages[f"go through {label}"] = (
                    f"You cannot go through {label}, as there is no path leading to it."
                )
            else:
                actions[f"go through {label}"] = path
            continue
        if state == "closed":  # a locked door has no "go through" message: the action is not recognised
            messages[f"go through {label}"] = (
                f"You cannot go through {label}, as it is closed. You should toggle it first."
            )
        elif carrying is None or carrying[0] != KEY:
            messages[f"toggle and go through {label}"] = (
                f"You cannot toggle and go through {label}, as you are not carrying a key."
            )
            continue
        elif carrying[1] != obj.color:
            messages[f"toggle and go through {label}"] = (
                f"You cannot toggle and go through {label}, as the color of the key you are carrying does not"
                " match the color of door."
            )
            continue
        path = planner.to_face(obj.x, obj.y)
        if path is None:
            messages[f"toggle and go through {label}"] = (
                f"You cannot toggle and go through {obj.name} {cnt_door}, as there is no path leading to it."
            )
            continue
        actions[f"toggle and go through {label}"] = (*path, TOGGLE, FORWARD)
        if not path:
            actions["toggle"] = (TOGGLE,)

    for obj in seen:
        if obj.kind == GOAL:
            path = planner.onto(obj.x, obj.y)
            if path is None:
                messages["go to goal"] = "You cannot go to the goal, as there is no path leading to it."
            else:
                actions["go to goal"] = path
            break

    counts = {}
    for obj in seen:
        if obj.kind in (WALL, GOAL):
            continue
        path = planner.to_face(obj.x, obj.y)
        label = reachable_label(obj.name, counts, path is not None)
        if path is None:
            messages[f"go to {label}"] = f"You cannot go to {label}, as there is no path leading to it."
        else:
            actions[f"go to {label}"] = path

    actions[CHECK_ACTION] = ()
    return actions, messages
