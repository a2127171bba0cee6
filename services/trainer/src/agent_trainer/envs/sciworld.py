"""SciWorld (ScienceWorld) as a spec: AgentGym's SciWorld client's format (prompt in our own words, see
docs/training-environments.md), 20 rounds as in AgentGym-RL, and the 0-100 score mapped to a reward and a success.

ScienceWorld scores an episode from -100 to 100 (``info.score``; the step's ``reward`` is the change): progress
towards the goal raises it, 100 means the task is completed, a wrong irreversible step (focusing on the wrong thing)
sets it negative and ends the episode, and so does running past the simulator's move limit (with the score reached).
AgentGym-RL trains on the raw last score; several papers count ``done and score > 0`` as success, which also counts
episodes that merely ran out of moves with partial credit. Here:

- **reward** = ``clip(score, 0, 100) / 100`` of the episode's last step, whether it ended by ``done`` or by the
  round budget: partial progress is paid in proportion (a dense signal, on the same [0, 1] scale as every other
  environment, so a mixed batch needs no rescaling), and a failure is worth no more than doing nothing (0);
- **success** = the task completed: the score reached 100. A move-limit or round-limit ending with partial score
  earns its partial reward, never a success.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from .spec import EnvSpec, Outcome, Parsed, cut, task_index

ENV_ID = "sciworld"
MAX_ROUNDS = 20  # AgentGym-RL's rounds for SciWorld (its ScalingInter-RL schedule: 10, 20, 30)
MARKER = "Action:"
COMPLETED_SCORE = 100
#: The simulator's answers to input it could not parse.
REFUSED = ("No known action matches that input.", "Unknown action.")

SYSTEM_PROMPT = """\
You are an agent in ScienceWorld, a text simulation of a house and its surroundings where you do elementary \
science tasks (boil water, test conductivity, find a living thing, grow a plant...). You are given a task; each \
turn you see the result of your last action. Complete the task.

Actions (OBJ and LOC are names as the observations write them):
- look around, look at OBJ, look in OBJ, read OBJ, examine OBJ
- go to LOC, open OBJ, close OBJ
- pick up OBJ, put down OBJ, move OBJ to OBJ, pour OBJ into OBJ, dunk OBJ into OBJ, mix OBJ
- activate OBJ, deactivate OBJ, use OBJ, use OBJ on OBJ, connect OBJ to OBJ, disconnect OBJ
- eat OBJ, flush OBJ, focus on OBJ
- wait (10 steps), wait1 (1 step), task (the task again), inventory
When an answer lists numbered choices for an ambiguous action, answer with the number.

"focus on OBJ" marks the object the task is about: focusing on the wrong one fails the task, so use it only when \
the task asks for it. Reply in this format, with one action per reply:
Thought: <your reasoning, briefly>
Action: <the action>"""


def parse(reply: str) -> Parsed:
    """The text after the last ``Action:``, stripped (AgentGym's ReAct parser for SciWorld: no character cleaning,
    no one-action rule); without the marker the empty action is sent (the simulator answers that it matches none)."""
    reply = reply or ""
    if MARKER not in reply:
        return Parsed(action="", well_formed=False)
    action = reply.rsplit(MARKER, 1)[1].strip()
    return Parsed(action=action, well_formed=bool(action))


def first_message(first: Mapping[str, Any]) -> str:
    """``task_description + "\\n" + observation``, as AgentGym's client shows the reset."""
    info = first.get("info") or {}
    description = str(info.get("task_description") or "")
    observation = str(first.get("observation", ""))
    return f"{description}\n{observation}" if description else observation


def step_message(
    result: Mapping[str, Any], parsed: Parsed, outcome: Outcome, max_observation_chars: int
) -> str:
    return cut(str(result.get("observation", "")), max_observation_chars)


def score_reward(score: float) -> float:
    """The reward for a ScienceWorld score: ``clip(score, 0, 100) / 100``."""
    return min(max(float(score), 0.0), float(COMPLETED_SCORE)) / COMPLETED_SCORE


def score_success(score: float) -> bool:
    """Solved: the score reached 100 (the task completed), not merely ``done`` with a positive score."""
    return float(score) >= COMPLETED_SCORE


def outcome(result: Mapping[str, Any], parsed: Parsed) -> Outcome:
    info = result.get("info") or {}
    score = float(info.get("score") or 0.0)
    done = bool(result.get("done"))
    accepted = not str(result.get("observation", "")).startswith(REFUSED)
    return Outcome(env_reward=score_reward(score), done=done, success=score_success(score),
                   valid=parsed.well_formed and accepted, finished=done)  # fmt: skip


SPEC = EnvSpec(
    env_id=ENV_ID,
    title="SciWorld: elementary science tasks in a text simulation (ScienceWorld); 4,639 task variations",
    system_prompt=SYSTEM_PROMPT,
    max_rounds=MAX_ROUNDS,
    parse=parse,
    first_message=first_message,
    step_message=step_message,
    outcome=outcome,
    reward_rule="clip(score, 0, 100) / 100 of the last step (partial progress paid, failures 0), whether the "
    "episode ended by done or by the round budget",
    success_rule="the score reached 100 (the task completed); a move- or round-limit ending never counts",
    task_of=functools.partial(task_index, env_id=ENV_ID),
    holds_simulator=True,
)
