"""The tokenization shim's choice of verl helpers (the real helpers run in test_agent_loop.py on 0.7.1 and 0.9.1;
verl 0.9.0, which no environment here installs, is covered by its helper names only)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from agent_trainer.agent_tokens import CT_090, CT_091, LEGACY, TurnTokens, detect_mode


class Merge:
    def __init__(self, token_ids: list[int]) -> None:
        self.token_ids = token_ids


class Verl090Loop:
    """What verl 0.9.0's AgentLoopBase offers with data.continuous_token.enable (and apply_chat_template)."""

    continuous_token_builder = object()

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def apply_chat_template(self, *args: Any, **kwargs: Any) -> list[int]:
        raise AssertionError("the 0.9.0 CT path must not use apply_chat_template")

    async def ct_build_initial_tokens(self, messages: list[dict]) -> list[int]:
        self.calls.append("initial")
        return [1, 2]

    async def ct_merge_assistant_token(self, ids, new, mask, logprobs, assistant_logprobs=None):
        self.calls.append("assistant")
        return Merge(ids + new), mask + [1] * len(new), logprobs

    async def ct_merge_non_assistant_msg(self, previous, updated, ids, mask, logprobs):
        self.calls.append("context")
        return Merge([*ids, 9, 9]), [*mask, 0, 0], logprobs


def test_modes_are_detected_by_the_helpers_present() -> None:
    assert detect_mode(Verl090Loop()) == CT_090
    without_ct = Verl090Loop()
    without_ct.continuous_token_builder = None  # 0.9.0 with continuous_token disabled: the 0.7.1 path
    assert detect_mode(without_ct) == LEGACY
    assert detect_mode(SimpleNamespace(ct_merge_context_msg=lambda: None)) == CT_091
    with pytest.raises(RuntimeError, match="0.7.1 to 0.9.1"):
        detect_mode(SimpleNamespace())


def test_verl_0_9_0_uses_ct_merge_non_assistant_msg() -> None:
    loop = Verl090Loop()

    async def run() -> TurnTokens:
        tokens = TurnTokens(loop, want_logprobs=False)
        await tokens.start([{"role": "user", "content": "x"}])
        await tokens.add_assistant([5, 6], None)
        tokens.commit(*await tokens.add_context([], [{"role": "user", "content": "y"}]))
        return tokens

    tokens = asyncio.run(run())
    assert loop.calls == ["initial", "assistant", "context"]
    assert tokens.ids == [1, 2, 5, 6, 9, 9] and tokens.mask == [1, 1, 0, 0] and tokens.prompt_length == 2
