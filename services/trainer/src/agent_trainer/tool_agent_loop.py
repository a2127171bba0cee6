"""``EnvToolAgentLoop``: verl 0.7.1's ``ToolAgentLoop`` (the interaction path) with the agent loop's
per-turn token budget and turn separator, so training and eval see the same token streams.

verl's ``ToolAgentLoop`` as released:

- gives one model turn the whole remaining response budget (6,144 tokens in the test config, 16,384 in the full
  one), where the WebShop agent loop and eval cap a turn at ``turn_tokens``;
- appends the interaction's user turn with ``apply_chat_template(..., remove_system_prompt=True)`` right after
  the model's end-of-turn token, without the separator the chat template puts between turns (ChatML's ``\\n``
  after ``<|im_end|>``), so the model is trained on streams that the chat template (and so eval, through
  sglang's chat endpoint) never produces.

It also gives each environment its own episode shape, as the agent loop does: the training config's
``environments.<env>.turn_tokens`` (the env named by the row's ``interaction_kwargs["name"]``) caps that row's
turns, and the episode's rounds (``turns.episode_rounds``: the spec's, or ``environments.<env>.max_rounds``) go to
the interaction as ``interaction_kwargs["max_rounds"]`` (``WebshopInteraction`` and ``EnvInteraction`` end the
episode there), so one run can mix environments with different budgets (verl's ``max_assistant_turns`` is one
number for the whole run, only their bound).

This subclass changes exactly those things and calls verl's own code for everything else. It is declared
under verl's own name ``tool_agent`` in ``configs/agent_loop.yaml``, which the 0.7 configs load
(``rollout.agent.agent_loop_config_path``): verl's worker registers the file's entries over its built-in
ones, so rows and configs keep ``agent_name: tool_agent``. Its old name ``WebShopToolAgentLoop`` (it plays every
environment) works for one release, with a DeprecationWarning.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

from . import envs, episode
from .agent_tokens import turn_separator_ids
from .config import TURN_TOKENS
from .turns import environment_settings, episode_rounds


class EnvToolAgentLoop(ToolAgentLoop):
    """``ToolAgentLoop`` with ``turn_tokens`` new tokens at most per model turn and the chat template's turn
    separator before each appended user turn (see the module docstring)."""

    def __init__(
        self, *args: Any, turn_tokens: int = TURN_TOKENS, name: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        if int(turn_tokens) < 1:
            raise ValueError(f"turn_tokens ({turn_tokens}) must be at least 1")
        self.turn_tokens = int(turn_tokens)
        self._separator: list[int] | None = None
        self._separate_next = False

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        """verl's ``run`` with the row's environment's ``turn_tokens`` and ``max_rounds`` (module docstring)."""
        extra = kwargs.get("extra_info")
        interaction_kwargs = extra.get("interaction_kwargs") if isinstance(extra, Mapping) else None
        spec = (
            envs.specs().get(str(interaction_kwargs.get("name")))
            if isinstance(interaction_kwargs, Mapping)
            else None
        )
        if spec is None:
            return await super().run(sampling_params, **kwargs)
        if self.interaction_config_file:
            shape = environment_settings(self.config, spec.env_id)
            self.turn_tokens = int(shape.get("turn_tokens", self.turn_tokens))
            rounds = episode_rounds(spec, self.config)  # a copy: the batch's own row stays as it was
            kwargs["extra_info"] = {
                **extra,
                "interaction_kwargs": {**interaction_kwargs, "max_rounds": rounds},
            }
        async with episode.episode_slot(spec, self.config):  # SciWorld: one of the fleet's JVMs
            return await super().run(sampling_params, **kwargs)

    async def _handle_generating_state(self, agent_data: Any, sampling_params: dict[str, Any], *args: Any,
                                       **kwargs: Any) -> Any:  # fmt: skip
        room = self.response_length - len(agent_data.response_mask)
        capped = {**sampling_params, "max_tokens": max(1, min(self.turn_tokens, room))}
        return await super()._handle_generating_state(agent_data, capped, *args, **kwargs)

    async def _handle_interacting_state(self, agent_data: Any) -> Any:
        eos = getattr(self.tokenizer, "eos_token_id", None)
        self._separate_next = bool(agent_data.prompt_ids) and agent_data.prompt_ids[-1] == eos
        try:
            return await super()._handle_interacting_state(agent_data)
        finally:
            self._separate_next = False

    async def apply_chat_template(self, messages: list[dict], *args: Any, remove_system_prompt: bool = False,
                                  **kwargs: Any) -> list[int]:  # fmt: skip
        ids = await super().apply_chat_template(
            messages, *args, remove_system_prompt=remove_system_prompt, **kwargs
        )
        if not (remove_system_prompt and self._separate_next):
            return ids
        self._separate_next = False
        if self._separator is None:
            self._separator = turn_separator_ids(self.tokenizer)
        return [*self._separator, *ids]


def __getattr__(name: str) -> Any:
    """``WebShopToolAgentLoop``, the class's old name (a config naming it by its old path keeps working), with a
    DeprecationWarning; the old name goes in the next release."""
    if name == "WebShopToolAgentLoop":
        import warnings

        warnings.warn("agent_trainer.tool_agent_loop.WebShopToolAgentLoop is EnvToolAgentLoop now (it plays every "
                      "environment); the old name goes in the next release", DeprecationWarning, stacklevel=2)  # fmt: skip
        return EnvToolAgentLoop
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
