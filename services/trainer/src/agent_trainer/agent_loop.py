"""``EnvAgentLoop``: one episode of any served environment per trajectory, as a verl agent loop (verl 0.7.1 to
0.9.1); ``WebShopAgentLoop`` is the WebShop one.

Each environment is a spec (``agent_trainer.envs``: prompt, action parser, turn budget, reward and success) and
one entry in ``configs/agent_loop.yaml`` (``webshop_agent``, ``textcraft_agent``, ``babyai_agent``...,
``env_id`` naming the spec); a dataset row's ``agent_name`` picks the entry, so a dataset that mixes environments
trains in one run, and its ``data_source`` (the environment's id) makes verl report validation metrics per
environment. What follows says WebShop; every environment is played the same way through its spec.

verl removed interactions in 0.8.0; the extension point every version from 0.4 to 0.9.1 keeps is a custom
``AgentLoopBase`` subclass. verl instantiates one per trajectory (inside its agent-loop worker processes)
and awaits ``run()``, which here:

1. resets the env on the row's goal through the balancer, and puts the start page into the prompt (the row's
   system prompt, then the first user turn built from the env's own answer);
2. alternates a model turn (at most ``turn_tokens`` new tokens, mask 1) and an env step with the action the
   reply names; the env's next page is appended as a user turn (mask 0: not trained on);
3. stops when the env says done (a purchase, or the server's own step limit), after the episode's rounds (env
   steps, every reply played: ``turns.episode_rounds``, the spec's or the training config's
   ``environments.<env>.max_rounds``, what the 0.7.1 interaction path plays too), or when the response budget
   (``rollout.response_length``, env tokens included) cannot hold another turn. The stream then ends on the
   model's last turn, where verl puts the reward;
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

Declared in ``configs/agent_loop.yaml`` (``rollout.agent.agent_loop_config_path``) and chosen per row
by ``agent_name: webshop_agent`` (``agent-train data --agent-loop``) or ``rollout.agent.default_agent_loop``.
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

from . import envs
from . import episode as episodes
from .agent_tokens import TurnTokens
from .config import InteractionSettings
from .episode import Episode, TurnScore
from .interaction import EPISODES, ensure_ready, shared_client
from .reward import METRIC_KEYS, episode_summary
from .turns import environment_settings, episode_rounds

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


# Declared in configs/agent_loop.yaml only, never with verl's @register: verl's worker loads the file's
# entries (with their settings) into its registry, and a @register decorator runs again when this module is first
# imported, by the first instantiation, replacing the entry with a bare one: every later trajectory of the worker
# would then run with the defaults (turn budget, retry budget, URL...) instead of the file's settings.
class EnvAgentLoop(AgentLoopBase):
    """Plays one episode of the environment ``env_id`` through the env service (see the module docstring).

    Constructor keywords besides verl's own come from the agent-loop YAML entry: ``env_id`` (a spec of
    ``agent_trainer.envs``), ``turn_tokens`` (new tokens per model turn; the training config's
    ``environments.<env_id>.turn_tokens`` wins) and any ``InteractionSettings`` field (``env_url``, ``timeout``,
    ``retries``, ``max_observation_chars``, ``invalid_action_penalty``, ``on_env_error``...). Unknown keys raise:
    a misspelled setting must not fall back to its default silently. The episode's rounds are not an entry's
    (``turns.episode_rounds``): an old entry's ``max_steps`` raises, naming the key that replaced it.
    """

    #: The environment when the YAML entry names none (``WebShopAgentLoop``: webshop).
    default_env_id: str | None = None

    def __init__(
        self,
        trainer_config: Any,
        server_manager: Any,
        tokenizer: Any,
        processor: Any,
        dataset_cls: Any,
        data_config: Any,
        *,
        env_id: str | None = None,
        turn_tokens: int = 256,
        name: str | None = None,
        **kwargs: Any,
    ) -> None:
        base = {k: kwargs.pop(k) for k in _VERL_KWARGS if k in kwargs}
        env_id = env_id or self.default_env_id
        if env_id is None:
            raise TypeError(f"{type(self).__name__} needs env_id: one of {', '.join(envs.ids())}")
        self.spec = envs.get(env_id)
        if (
            "max_steps" in kwargs
        ):  # the entry's own rounds, before the training config's override took their place
            raise TypeError(
                f"{self.spec.agent_name}: max_steps is no longer an agent-loop setting; delete it from the agent-loop "
                f"config and set environments.{self.spec.env_id}.max_rounds in the training config (else the spec's "
                f"{self.spec.max_rounds})"
            )
        unknown = sorted(set(kwargs) - _SETTING_NAMES)
        if unknown:
            raise TypeError(
                f"unknown {self.spec.agent_name} agent-loop setting(s) {', '.join(unknown)}; known: env_id, "
                f"turn_tokens, {', '.join(sorted(_SETTING_NAMES))}"
            )
        super().__init__(
            trainer_config, server_manager, tokenizer, processor, dataset_cls, data_config, **base
        )
        self.settings = _settings(tuple(sorted(kwargs.items())))
        self.max_rounds = episode_rounds(self.spec, self.config)
        turn_tokens = environment_settings(self.config, self.spec.env_id).get("turn_tokens", turn_tokens)
        if int(turn_tokens) < 1:
            raise ValueError(f"turn_tokens ({turn_tokens}) must be at least 1")
        self.turn_tokens = int(turn_tokens)
        self.response_length = int(self.rollout_config.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """One episode: reset, then model turn / env step until done, the step limit or the budget."""
        extra = _as_dict(kwargs.get("extra_info"))
        fields = {**_as_dict(extra.get("interaction_kwargs")), **extra}
        task = self.spec.task_of(fields)
        options = episodes.reset_options(self.spec, fields, self.settings)
        client = shared_client(self.settings, self.spec.env_id)
        await ensure_ready(self.settings, client)
        session = uuid4().hex  # the env episode's key here and the LLM server's sticky request id
        metrics: dict[str, float] = {}
        async with episodes.episode_slot(self.spec, self.config):  # SciWorld: one of the fleet's JVMs
            with simple_timer("tool_calls", metrics):
                first = await episodes.reset(self.spec, client, task, options)
            episode = Episode(state=first["state"], goal=task, goal_set=options.get("goal_set"),
                              split=options.get("split"))  # fmt: skip
            EPISODES.put(session, episode)
            try:
                return await self._play(session, episode, first, kwargs, sampling_params, metrics)
            finally:
                episode = EPISODES.get(session)
                EPISODES.drop(session)
                if self.spec.holds_simulator and episode is not None:
                    await episodes.close_quietly(client, episode.state)

    async def _play(
        self,
        session: str,
        episode: Episode,
        first: Mapping[str, Any],
        row: Mapping[str, Any],
        sampling_params: dict[str, Any],
        metrics: dict[str, float],
    ) -> AgentLoopOutput:
        spec = self.spec
        client = shared_client(self.settings, spec.env_id)
        system = [dict(m) for m in row.get("raw_prompt", []) if _as_dict(m).get("role") == "system"]
        if not system:  # the action grammar lives there: without it the model cannot know the format
            raise ValueError(
                "the row's raw_prompt has no system message; build the dataset with `agent-train data --env ENV` "
                "(or, WebShop alone, `agent-train data --agent-loop`)"
            )
        messages: list[dict[str, Any]] = [*system, {"role": "user", "content": spec.first_message(first)}]
        tokens = TurnTokens(self, want_logprobs=bool(sampling_params.get("logprobs")))
        await tokens.start(messages)
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
            turn = await episodes.play_turn(spec, self.settings, client, episode, reply, metrics=metrics,
                                            instance_id=session)  # fmt: skip
            turn_scores.append(turn.score)
            if turn.error is not None:
                env_error, stop = 1.0, "env_error"
                break
            outcome = turn.outcome
            if outcome.done:
                stop = "done"
                break
            if len(generated) >= self.max_rounds:
                stop = "step_limit"
                break
            previous = list(messages)
            messages.append({"role": "user", "content": episodes.next_message(spec, turn, self.settings)})
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
                             "mode": tokens.mode, "reward": summary["score"], "env": spec.env_id})  # fmt: skip
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


class WebShopAgentLoop(EnvAgentLoop):
    """The WebShop agent loop (``webshop_agent``): ``EnvAgentLoop`` on the WebShop spec, today's prompts, parser
    and metrics."""

    default_env_id = envs.WEBSHOP


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
