"""A scripted BabyAI expert: greedy best-first search over the wrapper's own text actions, guided by where the
mission's objects are (privileged: it reads minigrid's instruction verifier, which a player cannot).

It returns text actions that the core replays as they are, so what it finds is a plan the environment accepts.
It is bounded (``MAX_EXPANSIONS`` searched nodes), so it gives up on some tasks: levels whose goal needs an
action the wrapper does not offer (KeyInBox: a key inside a box; the wrapper has no way to open a box), and
long multi-room missions the bound cuts short. Success rates: docs/environments/babyai.md.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any

from minigrid.envs.babyai.core.verifier import (
    ActionInstr,
    AfterInstr,
    AndInstr,
    BeforeInstr,
    GoToInstr,
    OpenInstr,
    PickupInstr,
    PutNextInstr,
)

from .sim import Episode
from .text import CHECK_ACTION

MAX_EXPANSIONS = 60
FAR = 1000


def solve(root: Episode, max_expansions: int = MAX_EXPANSIONS) -> list[str] | None:
    """Text actions that end ``root``'s episode with ``done`` (a success worth more than 0.5), or None."""
    tie = itertools.count()
    frontier: list[tuple[float, int, Episode, list[str]]] = [(_estimate(root), next(tie), root, [])]
    seen = {_key(root)}
    for _ in range(max_expansions):
        if not frontier:
            return None
        _, _, node, plan = heapq.heappop(frontier)
        for action in node.frame.action_names:
            if action == CHECK_ACTION:
                continue
            child = node.clone()
            outcome = child.step(action)
            if child.done:
                return [*plan, action]
            if not outcome.ran:
                continue
            key = _key(child)
            if key in seen:
                continue
            seen.add(key)
            cost = _estimate(child) + 0.05 * child.env.step_count
            heapq.heappush(frontier, (cost, next(tie), child, [*plan, action]))
    return None


def _key(episode: Episode) -> tuple[Any, ...]:
    env = episode.env
    carrying = None if env.carrying is None else (env.carrying.type, env.carrying.color)
    return (tuple(env.agent_pos), env.agent_dir, carrying, env.grid.encode().tobytes(), _progress(env.instrs))


def _progress(instr: Any) -> tuple[Any, ...]:
    if isinstance(instr, BeforeInstr | AfterInstr | AndInstr):
        return (instr.a_done, instr.b_done, _progress(instr.instr_a), _progress(instr.instr_b))
    return ()


def _pending(instr: Any) -> list[ActionInstr]:
    """The clauses still to do, the next one first."""
    if isinstance(instr, BeforeInstr):
        rest = _pending(instr.instr_b)
        return rest if instr.a_done == "success" else _pending(instr.instr_a) + rest
    if isinstance(instr, AfterInstr):
        rest = _pending(instr.instr_a)
        return rest if instr.b_done == "success" else _pending(instr.instr_b) + rest
    if isinstance(instr, AndInstr):
        first = [] if instr.a_done == "success" else _pending(instr.instr_a)
        second = [] if instr.b_done == "success" else _pending(instr.instr_b)
        return first + second
    return [instr]


def _distance(env: Any, positions: Any) -> int:
    ax, ay = env.agent_pos
    best = FAR
    for pos in positions:
        if pos is None:
            continue
        x, y = pos
        if x < 0:  # carried
            continue
        best = min(best, abs(ax - x) + abs(ay - y))
    return best


def _objects(env: Any) -> list[Any]:
    return [obj for obj in env.grid.grid if obj is not None and obj.type in ("key", "ball", "box")]


def _estimate(episode: Episode) -> float:
    """Clauses left x 50 + the distance to the next clause's object (0 when done)."""
    env = episode.env
    pending = _pending(env.instrs)
    if not pending:
        return 0.0
    clause = pending[0]
    carrying = env.carrying
    if isinstance(clause, GoToInstr):
        here = _distance(env, clause.desc.obj_poss)
    elif isinstance(clause, OpenInstr):
        here = _distance(env, clause.desc.obj_poss) + 1
        locked = {door.color for door in clause.desc.obj_set if door.is_locked}
        if locked and not (carrying is not None and carrying.type == "key" and carrying.color in locked):
            keys = [obj.cur_pos for obj in _objects(env) if obj.type == "key" and obj.color in locked]
            here += 10 + _distance(env, keys) + (5 if carrying is not None else 0)
    elif isinstance(clause, PickupInstr):
        wanted = clause.desc.obj_set
        here = _distance(env, [obj.cur_pos for obj in wanted]) + (5 if carrying is not None else 0)
    elif isinstance(clause, PutNextInstr):
        if carrying is not None and carrying in clause.desc_move.obj_set:
            here = _distance(env, clause.desc_fixed.obj_poss)
        else:
            moving = [obj.cur_pos for obj in clause.desc_move.obj_set]
            here = _distance(env, moving) + 10 + (5 if carrying is not None else 0)
    else:
        here = 0
    return 50.0 * len(pending) + here
