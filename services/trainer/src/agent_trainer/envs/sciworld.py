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
import importlib.util
import shutil
from collections.abc import Iterable, Mapping
from itertools import chain, zip_longest
from typing import Any

from agent_envs.envs.sciworld.games import GAME_COUNT, TASKS, game

from .spec import CoreUnavailable, EnvSpec, Outcome, Parsed, TrainingRecipe, cut, task_index

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


#: ScienceWorld's split of each task type's variations (scienceworld 1.2.3's ``get_variations_train/dev/test``,
#: which are contiguous): variations below the first number are train, below the second dev (val here), the rest
#: test. Static in the jar, so written down (no JVM to compute a split); the tests compare it with a JVM's.
VARIATION_SPLITS: dict[str, tuple[int, int]] = {
    "boil": (14, 21), "melt": (14, 21), "freeze": (14, 21), "change-the-state-of-matter-of": (14, 21),
    "use-thermometer": (270, 405), "measure-melting-point-known-substance": (218, 327),
    "measure-melting-point-unknown-substance": (150, 225), "power-component": (10, 15),
    "power-component-renewable-vs-nonrenewable-energy": (10, 15), "test-conductivity": (450, 675),
    "test-conductivity-of-unknown-substances": (300, 450), "find-living-thing": (150, 225),
    "find-non-living-thing": (150, 225), "find-plant": (150, 225), "find-animal": (150, 225),
    "chemistry-mix": (16, 24), "chemistry-mix-paint-secondary-color": (18, 27),
    "chemistry-mix-paint-tertiary-color": (18, 27), "lifespan-longest-lived": (62, 93),
    "lifespan-shortest-lived": (62, 93), "lifespan-longest-lived-then-shortest-lived": (62, 93),
    "identify-life-stages-1": (6, 9), "identify-life-stages-2": (4, 6),
}  # fmt: skip


def split_of(task: int) -> str:
    """ScienceWorld's own split of the task's variation (``VARIATION_SPLITS``; its dev split is val here)."""
    name, variation = game(task)
    train_end, dev_end = VARIATION_SPLITS[name]
    return "train" if variation < train_end else "val" if variation < dev_end else "test"


def round_robin_task_types(tasks: Iterable[int]) -> list[int]:
    """The tasks one per task type in turn (the types in AgentGym's order, each type's in index order), so any
    prefix of a split (``--val-rows``, ``val_max_samples``, eval's ``MAX_SAMPLES``) covers every type."""
    by_type: dict[str, list[int]] = {name: [] for _, name, _ in TASKS}
    for task in tasks:
        by_type[game(task)[0]].append(task)
    return [t for t in chain.from_iterable(zip_longest(*by_type.values())) if t is not None]


def data_core(workers: int) -> Any:
    """A core for building rows: each reset in a fresh JVM (a second load in one JVM can list a room's objects in
    another order, which the interaction would refuse at the first turn), from a pool that keeps ``workers`` spare
    JVMs warm. Raises ``CoreUnavailable`` where Java 17 or the scienceworld package is missing (the trainer image)."""
    if importlib.util.find_spec("scienceworld") is None:
        raise CoreUnavailable("the scienceworld package (ScienceWorld's simulator) is not installed here: pip install "
                              "-e 'services/env[sciworld]' (it also needs a Java 17 runtime)")  # fmt: skip
    if shutil.which("java") is None:
        raise CoreUnavailable("no `java` on PATH, and ScienceWorld's simulator is a JVM: install a Java 17 runtime "
                              "(Debian/Ubuntu: apt-get install openjdk-17-jre-headless)")  # fmt: skip
    from agent_envs.envs.sciworld import JvmPool, SciWorldEnv

    core = SciWorldEnv(JvmPool(spares=workers, max_live=2 * workers, wait_s=600))
    core.prewarm()
    return core


#: AgentGym-RL's SciWorld recipe: its training configs (``agent-train configs --write``: :mod:`.overlays`).
RECIPE = TrainingRecipe(
    source="AgentGym-RL's SciWorld settings (examples/train/AgentGym-RL/sciworld_train.sh)",
    batch_size=8, rollouts=8, mini_batch_size=4, turn_tokens=200, prompt_tokens=1024, response_tokens=4096,
    test_samples=16, epochs=10, save_freq=25,
    first_turn="system prompt + task description and the room (AgentGym-RL's)",
    notes=("(sciworld_train.sh: train_batch_size = 4 GPUs x 2 prompts, ppo_mini_batch_size = 4 GPUs.)",),
)  # fmt: skip

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
    task_count=GAME_COUNT,
    split_of=split_of,
    task_order=round_robin_task_types,
    data_core=data_core,
    recipe=RECIPE,
)
