"""WebShop's trainer code, one package like every environment's module: its spec (:data:`SPEC`), its success rule
(:func:`is_success`), its prompts (:mod:`.prompts`), its action parser (:mod:`.actions`) and its dataset builder
(:mod:`.data`, which also reads AgentGym-RL's ``webshop_<N>`` ids). A reply without an action still steps the
environment with :data:`~agent_trainer.envs.webshop.actions.UNPARSEABLE_ACTION` (an invalid action: the page stays,
one more step), so the step limit stays the server's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent_envs.client import ServiceClient

from ...config import TURN_TOKENS
from ...turns import TRAINING_ENV_STEPS
from ..spec import EnvSpec, Outcome, Parsed, TrainingRecipe
from . import prompts
from .actions import UNPARSEABLE_ACTION, extract_action

#: Model turns (env steps) per episode: 24, what the guides' 25 assistant turns allow on verl 0.7.1's interaction
#: path (its last reply is never played: ``turns.env_steps_for_turns``), the number eval's defaults share.
MAX_ROUNDS = TRAINING_ENV_STEPS


def is_success(reward: float) -> bool:
    """WebShop's success: the purchase earned the full reward (1.0, up to float rounding)."""
    return reward >= 1.0 - 1e-9


def parse_goal(kwargs: Mapping[str, Any]) -> int:
    """The goal index from ``goal`` (or ``session_id``/``goal_id``; int, ``"12"`` or ``"webshop_12"``)."""
    for key in ("goal", "session_id", "goal_id"):
        value = kwargs.get(key)
        if value is None:
            continue
        if isinstance(value, bool):
            break
        if isinstance(value, int):
            return value
        text = str(value).strip().rsplit("_", 1)[-1]
        if text.isdigit():
            return int(text)
        raise ValueError(
            f"interaction_kwargs[{key!r}] = {value!r} is not a goal index (int or 'webshop_<N>')"
        )
    raise ValueError(
        f"interaction_kwargs has no goal: expected 'goal' (or 'session_id'), got keys {sorted(kwargs)}; "
        "rebuild the dataset with `agent-train data`"
    )


def parse(reply: str) -> Parsed:
    action = extract_action(reply)
    return Parsed(action=action or UNPARSEABLE_ACTION, well_formed=action is not None)


def _field(answer: Mapping[str, Any], name: str) -> Any:
    """WebShop's ``instruction`` or ``available_actions``: at the top of its own routes' answers, in ``info`` where
    its contract env answers in process (``WebShopTextEnv``: the rehearsal's, ``make learn``'s cores)."""
    return answer[name] if name in answer else (answer.get("info") or {}).get(name)


def first_message(first: Mapping[str, Any]) -> str:
    return prompts.first_user_message(
        _field(first, "instruction") or "",
        first.get("observation", ""),
        _field(first, "available_actions") or {},
    )


def step_message(
    result: Mapping[str, Any], parsed: Parsed, outcome: Outcome, max_observation_chars: int
) -> str:
    return prompts.step_message(
        result.get("observation", ""),
        _field(result, "available_actions") or {},
        action=parsed.action if parsed.well_formed else None,
        valid=outcome.valid,
        done=outcome.done,
        truncated=bool((result.get("info") or {}).get("truncated")),
        max_observation_chars=max_observation_chars,
    )


def client(base_url: str, env_id: str, **options: Any) -> ServiceClient:
    """WebShop's own routes (``/v1/...``, ``WebShopClient``) rather than the ``/<env_id>/v1`` every other environment
    is served on; looked up when called (``agent_envs.client.native``), so a test's in-process client stands in."""
    from agent_envs.client import native

    return native.WebShopClient(base_url, **options)


def outcome(result: Mapping[str, Any], parsed: Parsed) -> Outcome:
    info = result.get("info") or {}
    done = bool(result.get("done"))
    reward = float(result.get("reward") or 0.0)
    return Outcome(
        env_reward=reward,
        done=done,
        success=done and is_success(reward),
        valid=parsed.well_formed and bool(info.get("valid", True)),
        finished=done and "reward_info" in info,  # a purchase, not the server's step-limit truncation
    )


#: The seed guides' WebShop recipe: its training configs (``agent-train configs --write``: :mod:`..overlays`). The
#: full run is the training guide's (128 prompts x 4 rollouts, 15 epochs, lr 5e-7, the 7B model over 2 GPUs per
#: rollout server); the test run its small run (8 x 2, one mini-batch, micro-batch 2, a 6144-token response budget).
RECIPE = TrainingRecipe(
    source="the seed guides' WebShop settings (run_webshop_grpo_train.sh; the test run: run_webshop_grpo_test.sh)",
    batch_size=128, rollouts=4, mini_batch_size=32, turn_tokens=TURN_TOKENS, prompt_tokens=2048,
    response_tokens=16384, test_samples=64, lr=5.0e-7, epochs=15, save_freq=20,
    test_batch_size=8, test_rollouts=2, test_mini_batch_size=8, test_micro_batch_size=2, test_response_tokens=6144,
    full_val_samples=256, full_rollout_tp=2, project_name="webshop-grpo",
    first_turn="system prompt + the instruction + the start page",
    notes=("The guides' 25 assistant turns are verl's turn limit here, one more than the 24 rounds an episode plays "
           "(agent_trainer.turns); the response budget often ends a long episode first. The guides' key names are "
           "mapped to verl 0.7.1's in base/grpo_train.yaml's header.",),
)  # fmt: skip

SPEC = EnvSpec(
    env_id="webshop",
    title="WebShop: find and buy the product an instruction describes (search and click on a shopping site)",
    system_prompt=prompts.SYSTEM_PROMPT,
    max_rounds=MAX_ROUNDS,
    parse=parse,
    first_message=first_message,
    step_message=step_message,
    outcome=outcome,
    reward_rule="the purchase's reward in [0, 1] (attributes, options, price and type matched), paid when "
    '"buy now" is clicked; 0 without a purchase',
    success_rule="the purchase earned the full reward 1.0",
    task_of=parse_goal,  # goal (or session_id/goal_id; "webshop_12" works), as the interaction reads it
    reset_fields=("goal_set", "split"),  # a row's goal list and split (the interaction's goal_set by default)
    eval_protocol="pages",  # eval: goal sets, pages as they are (evaluation.runner.PagePlay)
    needs_catalog=True,  # its tasks, first pages and expert are the catalog's
    client=client,
    recipe=RECIPE,
)
