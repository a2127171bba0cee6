"""The chat an LLM policy has with the environment, built exactly as in training (``EnvConversation``: the other
environments, from their trainer-side spec).

Everything here delegates to the trainer's own modules: WebShop's ``agent_trainer.envs.webshop.prompts`` (system
prompt, first user turn, the user turn after each step) and ``agent_trainer.envs.webshop.actions`` (action
extraction), and it sends
what ``WebshopInteraction`` sends for a reply without an action, so an evaluation sees the same prompts and
parsing as training (the turn budget is eval's own ``--max-turns``: 15 by default, where the training configs
allow 10 (test) and 25 (full)). Keep it that way: no prompt text or parsing rule of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent_trainer.envs.webshop import prompts
from agent_trainer.envs.webshop.actions import extract_action


@dataclass
class Conversation:
    """The messages so far: system prompt and first page, then assistant replies and pages in turn."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    max_observation_chars: int = 0  # the interaction setting of the same name (0: pages are never cut)

    @classmethod
    def start(
        cls,
        instruction: str,
        observation: str,
        available_actions: Mapping[str, Any],
        max_observation_chars: int = 0,
    ) -> Conversation:
        """The dataset's ``prompt`` for this goal: what a training trajectory starts from."""
        return cls(
            list(prompts.initial_messages(instruction, observation, available_actions)), max_observation_chars
        )

    def add_reply(self, output: str) -> None:
        self.messages.append({"role": "assistant", "content": output})

    def add_step(
        self, observation: str, available_actions: Mapping[str, Any], action: str | None, valid: bool
    ) -> None:
        """The user turn the interaction returns after a step that did not end the episode."""
        text = prompts.step_message(
            observation,
            available_actions,
            action=action,
            valid=valid,
            max_observation_chars=self.max_observation_chars,
        )
        self.messages.append({"role": "user", "content": text})

    @staticmethod
    def action_of(output: str) -> str | None:
        """The action the training interaction takes from this reply (None: it names none)."""
        return extract_action(output)


@dataclass
class EnvConversation:
    """The chat with another environment (TextCraft, BabyAI, SciWorld), built from its trainer-side spec
    (``agent_trainer.envs``) as the agent loop builds it: the spec's system prompt, its first user turn, then
    each reply and the user turn the spec makes of the step (the runner makes it, with ``spec.step_message``, and
    hands it over as the next turn's observation). The same interface as ``Conversation``."""

    spec: Any
    messages: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def start(cls, spec: Any, first_message: str) -> EnvConversation:
        """``first_message``: ``spec.first_message`` of the reset (what the dataset row's prompt holds)."""
        return cls(
            spec,
            [{"role": "system", "content": spec.system_prompt}, {"role": "user", "content": first_message}],
        )

    def add_reply(self, output: str) -> None:
        self.messages.append({"role": "assistant", "content": output})

    def add_step(self, observation: str, available_actions: Mapping[str, Any], action: str | None, valid: bool
                 ) -> None:  # fmt: skip
        """``observation`` is already the user turn the spec made of the step."""
        self.messages.append({"role": "user", "content": observation})

    def action_of(self, output: str) -> str | None:
        return self.spec.parse(output).action
