"""Message construction: the system prompt, the first turn and the turns after each step."""

from __future__ import annotations

import pytest

pytest.importorskip(
    "agent_trainer", reason="install the trainer: pip install -c constraints.txt -e services/trainer"
)

from agent_trainer.envs.webshop import prompts
from agent_trainer.envs.webshop.actions import extract_action

START = {"has_search_bar": True, "clickables": ["search"]}
ITEM = {"has_search_bar": False, "clickables": ["back to search", "< prev", "large", "buy now"]}


def test_system_prompt_states_the_grammar_and_carries_a_parseable_example() -> None:
    text = prompts.SYSTEM_PROMPT
    assert "search[<keywords>]" in text and "click[<element>]" in text and "Action: <action>" in text
    example_actions = [extract_action(line) for line in text.splitlines() if line.startswith("Action: ")]
    assert "search[red cotton t-shirt men]" in example_actions
    assert "click[b07abc1234]" in example_actions


def test_initial_messages_have_system_then_user_with_instruction_page_and_actions() -> None:
    messages = prompts.initial_messages(
        "i need tea", "WebShop [SEP] Instruction: [SEP] i need tea [SEP] Search", START
    )
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == prompts.SYSTEM_PROMPT
    user = messages[1]["content"]
    assert user.startswith("Instruction: i need tea\n")
    assert "Page: WebShop [SEP]" in user
    assert user.endswith(
        "Available actions: search[<keywords>]"
    )  # the Search button is not offered as a click


def test_available_actions_are_written_as_actions() -> None:
    assert (
        prompts.available_actions_text(ITEM)
        == "click[back to search], click[< prev], click[large], click[buy now]"
    )
    assert prompts.available_actions_text({"has_search_bar": False, "clickables": []}) == "(none)"
    assert prompts.available_actions_text(ITEM, max_clickables=2) == "click[back to search], click[< prev]"


def test_step_message_for_a_valid_action_shows_the_page_only() -> None:
    text = prompts.step_message("item page", ITEM, action="click[b0]", valid=True)
    assert text == "Page: item page\nAvailable actions: " + prompts.available_actions_text(ITEM)


def test_step_message_for_an_unparseable_reply_is_corrective() -> None:
    text = prompts.step_message("item page", ITEM, action=None, valid=False)
    assert text.startswith(prompts.INVALID_REPLY_MESSAGE)
    assert "click[buy now]" in text


def test_step_message_for_an_unavailable_action_names_it() -> None:
    text = prompts.step_message("item page", ITEM, action="click[xxl]", valid=False)
    assert "click[xxl] is not available" in text and "Page: item page" in text


def test_step_message_when_done() -> None:
    assert (
        prompts.step_message("thanks", {}, action="click[buy now]", valid=True, done=True)
        == prompts.EPISODE_DONE_MESSAGE
    )
    truncated = prompts.step_message("x", {}, action="click[a]", valid=True, done=True, truncated=True)
    assert truncated == prompts.EPISODE_TRUNCATED_MESSAGE


def test_long_pages_are_cut_when_asked() -> None:
    text = prompts.page_text("x" * 100, START, max_observation_chars=10)
    assert text.startswith("Page: xxxxxxxxxx ...(truncated)\n")


def test_last_assistant_text_handles_string_and_part_lists() -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Action: "}, {"type": "text", "text": "click[a]"}],
        },
        {"role": "user", "content": "page"},
    ]
    assert prompts.last_assistant_text(messages) == "Action: click[a]"
    assert prompts.last_assistant_text([{"role": "assistant", "content": "x"}]) == "x"
    assert prompts.last_assistant_text([{"role": "user", "content": "x"}]) == ""
