"""``WebShopAgentLoop``: one WebShop episode per trajectory, as a verl agent loop (verl 0.7.1 to 0.9.1).

verl removed interactions in 0.8.0; the extension point every version from 0.4 to 0.9.1 keeps is a custom
``AgentLoopBase`` subclass. verl instantiates one per trajectory (inside its agent-loop worker processes)
and awaits ``run()``, which here:

1. resets the env on the row's goal through the balancer, and puts the start page into the prompt (the row's
   system prompt, then the first user turn built from the env's own answer);
2. alternates a model turn (at most ``turn_tokens`` new tokens, mask 1) and an env step with the action the
   reply names; the env's next page is appended as a user turn (mask 0: not trained on);
3. stops when the env says done (a purchase, or the server's own step limit), after ``max_steps`` env steps
   (every reply is played; by default the steps ``rollout.multi_turn.max_assistant_turns`` allows on the 0.7.1
   interaction path, ``turns.env_steps_for_turns``, so one config means the same episode length on both
   paths), or when the response budget (``rollout.response_length``, env tokens included) cannot hold another turn. The stream
   then ends on the model's last turn, where verl puts the reward;
4. returns the episode's reward as ``reward_score`` (verl then skips its reward function) and the episode's
   metrics in ``extra_fields["reward_extra_info"]``, computed by ``reward.episode_summary`` from the same
   ``TurnScore`` values the 0.7.1 interaction produces, so both paths report identical metrics;
5. carries the generation's own ``extra_fields`` as verl's ``ToolAgentLoop`` does (``generation_fields``):
   the first turn's, with ``max_global_steps`` from the last turn. verl 0.9.1's TransferQueue worker tags
   every trajectory with ``min_global_steps``/``max_global_steps`` from them, and its trainer turns those tags
   into integers every step: without them a 0.9.1 run crashes at the end of its first step.

The env is stateless (signed state tokens), so an episode cut short leaves nothing on the server; the
process-wide ``EPISODES`` registry (shared with the interaction, used to detect leaks) drops the entry in a
``finally``. All HTTP is async and goes through one pooled client per process and event loop
(``interaction.shared_client``): a blocking call would stall every trajectory of the worker.

Declared in ``configs/webshop_agent_loop.yaml`` (``rollout.agent.agent_loop_config_path``) and chosen per row
by ``agent_name: webshop_agent`` (``webshop-train data --agent-loop``) or ``rollout.agent.default_agent_loop``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import Iterator, Mapping
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput
from verl.utils.profiler import simple_timer

from webshop_env.client import WebShopRequestError

from . import prompts
from .actions import UNPARSEABLE_ACTION, extract_action, step_was_valid
from .agent_tokens import TurnTokens
from .config import AGENT_LOOP_NAME, InteractionSettings
from .interaction import EPISODES, Episode, TurnScore, ensure_ready, parse_goal, shared_client
from .reward import METRIC_KEYS, episode_summary
from .turns import env_steps_for_turns

logger = logging.getLogger(__name__)

#: The keys of ``reward_extra_info`` (every trajectory has all of them: verl builds columns from the first).
EXTRA_INFO_KEYS = (*METRIC_KEYS, "env_error")
#: Keyword arguments verl passes to every agent loop besides the base class's named ones.
_VERL_KWARGS = ("hf_model_type", "tools")
_SETTING_NAMES = frozenset(f.name for f in dataclasses.fields(InteractionSettings))

# Trajectory records for the preflight's token-stream check (None: not recording).
_RECORDS: list[dict[str, Any]] | None = None


@contextlib.contextmanager
def record_trajectories() -> Iterator[list[dict[str, Any]]]:
    """Collect every trajectory run in this process meanwhile: messages, token stream, mask, model tokens."""
    global _RECORDS
    previous, _RECORDS = _RECORDS, []
    try:
        yield _RECORDS
    finally:
        _RECORDS = previous


@functools.lru_cache(maxsize=16)
def _settings(items: tuple[tuple[str, Any], ...]) -> InteractionSettings:
    return InteractionSettings.from_config(dict(items))


# Declared in configs/webshop_agent_loop.yaml only, never with verl's @register: verl's worker loads the file's
# entries (with their settings) into its registry, and a @register decorator runs again when this module is first
# imported, by the first instantiation, replacing the entry with a bare one: every later trajectory of the worker
# would then run with the defaults (turn budget, retry budget, URL...) instead of the file's settings.
class WebShopAgentLoop(AgentLoopBase):
    """Plays one WebShop episode through the env service (see the module docstring).

    Constructor keywords besides verl's own come from the agent-loop YAML entry: ``max_steps`` (env steps;
    default ``env_steps_for_turns(rollout.multi_turn.max_assistant_turns)``, else 15), ``turn_tokens`` (new tokens per model turn) and any
    ``InteractionSettings`` field (``env_url``, ``timeout``, ``retries``, ``max_observation_chars``,
    ``invalid_action_penalty``, ``on_env_error``...). Unknown keys raise: a misspelled setting must not fall
    back to its default silently.
    """

    def __init__(
        self,
        trainer_config: Any,
        server_manager: Any,
        tokenizer: Any,
        processor: Any,
        dataset_cls: Any,
        data_config: Any,
        *,
        max_steps: int | None = None,
        turn_tokens: int = 256,
        name: str | None = None,
        **kwargs: Any,
    ) -> None:
        base = {k: kwargs.pop(k) for k in _VERL_KWARGS if k in kwargs}
        unknown = sorted(set(kwargs) - _SETTING_NAMES)
        if unknown:
            raise TypeError(
                f"unknown {AGENT_LOOP_NAME} agent-loop setting(s) {', '.join(unknown)}; known: max_steps, "
                f"turn_tokens, {', '.join(sorted(_SETTING_NAMES))}"
            )
        super().__init__(
            trainer_config, server_manager, tokenizer, processor, dataset_cls, data_config, **base
        )
        self.settings = _settings(tuple(sorted(kwargs.items())))
        if max_steps is None:
            turns = (self.rollout_config.get("multi_turn") or {}).get("max_assistant_turns")
            max_steps = env_steps_for_turns(int(turns)) if turns else 15
        if int(max_steps) < 1 or int(turn_tokens) < 1:
            raise ValueError(f"max_steps ({max_steps}) and turn_tokens ({turn_tokens}) must be at least 1")
        self.max_steps = int(max_steps)
        self.turn_tokens = int(turn_tokens)
        self.response_length = int(self.rollout_config.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """One episode: reset, then model turn / env step until done, the step limit or the budget."""
        extra = _as_dict(kwargs.get("extra_info"))
        goal = parse_goal({**_as_dict(extra.get("interaction_kwargs")), **extra})
        goal_set = extra.get("goal_set") or self.settings.goal_set
        split = extra.get("split") or None
        client = shared_client(self.settings)
        await ensure_ready(self.settings, client)
        session = uuid4().hex  # the env episode's key here and the LLM server's sticky request id
        metrics: dict[str, float] = {}
        with simple_timer("tool_calls", metrics):
            first = await client.reset(goal, goal_set=goal_set, split=split)
        EPISODES.put(session, Episode(state=first["state"], goal=goal, goal_set=goal_set, split=split))
        try:
            return await self._play(session, first, kwargs, sampling_params, metrics)
        finally:
            EPISODES.drop(session)

    async def _play(
        self,
        session: str,
        first: Mapping[str, Any],
        row: Mapping[str, Any],
        sampling_params: dict[str, Any],
        metrics: dict[str, float],
    ) -> AgentLoopOutput:
        client = shared_client(self.settings)
        system = [dict(m) for m in row.get("raw_prompt", []) if _as_dict(m).get("role") == "system"]
        if not system:  # the action grammar lives there: without it the model cannot know the format
            raise ValueError(
                "the row's raw_prompt has no system message; build the dataset with `webshop-train data --agent-loop`"
            )
        first_page = prompts.first_user_message(
            first.get("instruction", ""), first.get("observation", ""), first.get("available_actions") or {}
        )
        messages: list[dict[str, Any]] = [*system, {"role": "user", "content": first_page}]
        tokens = TurnTokens(self, want_logprobs=bool(sampling_params.get("logprobs")))
        await tokens.start(messages)
        state = first["state"]
        turn_scores: list[TurnScore] = []
        generated: list[list[int]] = []
        fields: dict[str, Any] = {}
        user_turns, env_error, stop = 1, 0.0, "budget"
        while len(tokens.mask) < self.response_length:
            params = {
                **sampling_params,
                "max_tokens": min(self.turn_tokens, self.response_length - len(tokens.mask)),
            }
            with simple_timer("generate_sequences", metrics):
                output = await self.server_manager.generate(
                    session, prompt_ids=tokens.ids, sampling_params=params
                )
            await tokens.add_assistant(list(output.token_ids), output.log_probs)
            fields = generation_fields(fields, getattr(output, "extra_fields", None))
            generated.append(list(output.token_ids))
            reply = self.tokenizer.decode(output.token_ids, skip_special_tokens=True)
            messages.append({"role": "assistant", "content": reply})
            action = extract_action(reply)
            try:
                with simple_timer("tool_calls", metrics):
                    result = await client.step(state, action or UNPARSEABLE_ACTION)
            except WebShopRequestError as error:
                if self.settings.on_env_error == "raise":
                    raise
                logger.warning(
                    "WebShop refused a step of %s: %s; ending the trajectory with reward 0", session, error
                )
                turn_scores.append(TurnScore(0.0, done=True, stepped=False))
                env_error, stop = 1.0, "env_error"
                break
            info = result.get("info") or {}
            valid = step_was_valid(action, info)
            done = bool(result.get("done"))
            env_reward = float(result.get("reward") or 0.0)
            penalty = self.settings.invalid_action_penalty if action is None else 0.0
            turn_scores.append(TurnScore(env_reward - penalty, invalid=not valid, done=done, env_reward=env_reward,
                                         purchased=done and "reward_info" in info))  # fmt: skip
            state = result["state"]
            episode = EPISODES.get(session)
            if episode is not None:
                episode.state, episode.steps = state, episode.steps + 1
            if done:
                stop = "done"
                break
            if len(generated) >= self.max_steps:
                stop = "step_limit"
                break
            previous = list(messages)
            messages.append({"role": "user", "content": prompts.step_message(
                result.get("observation", ""), result.get("available_actions") or {}, action=action, valid=valid,
                max_observation_chars=self.settings.max_observation_chars)})  # fmt: skip
            ids, mask, logprobs = await tokens.add_context(previous, messages)
            if len(mask) >= self.response_length:  # no room for another model turn: end on the last one
                messages.pop()
                break
            tokens.commit(ids, mask, logprobs)
            user_turns += 1

        summary = episode_summary(turn_scores)
        info = {key: float(summary[key]) for key in METRIC_KEYS} | {"env_error": env_error}
        prompt_length = tokens.prompt_length
        response_ids = tokens.ids[prompt_length:][: self.response_length]
        if _RECORDS is not None:
            _RECORDS.append({"messages": messages, "ids": list(tokens.ids), "mask": list(tokens.mask),
                             "prompt_length": prompt_length, "generated": generated, "stop": stop,
                             "mode": tokens.mode, "reward": summary["score"]})  # fmt: skip
        return AgentLoopOutput(
            prompt_ids=tokens.ids[:prompt_length],
            response_ids=response_ids,
            response_mask=tokens.mask[: self.response_length],
            response_logprobs=tokens.logprobs[: self.response_length]
            if tokens.logprobs is not None
            else None,
            reward_score=float(summary["score"]),
            num_turns=user_turns + len(generated),
            metrics=metrics,
            extra_fields={**fields, "reward_extra_info": info},
        )


def generation_fields(kept: Mapping[str, Any], turn: Mapping[str, Any] | None) -> dict[str, Any]:
    """The trajectory's generation ``extra_fields`` after one more model turn, merged as ``ToolAgentLoop`` does.

    The first turn's fields are kept whole (``global_steps``, ``min_global_steps``: the weights version the
    trajectory started on); a later turn only moves ``max_global_steps`` forward (the version it ended on).
    """
    if not kept:
        return dict(turn or {})
    merged = dict(kept)
    latest = (turn or {}).get("max_global_steps")
    if latest is not None:
        merged["max_global_steps"] = latest
    return merged


def _as_dict(value: Any) -> dict[str, Any]:
    """A row field as a plain dict (parquet structs arrive as dicts; missing ones as None)."""
    return dict(value) if isinstance(value, Mapping) else {}
