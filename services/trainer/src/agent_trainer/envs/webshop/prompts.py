"""Every text the policy sees, in one place: the system prompt and the user turns.

The dataset builder (first turn), the interaction (every later turn) and eval all build their messages here,
so training and evaluation show the model exactly the same format.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

SYSTEM_PROMPT = """\
You are a shopping agent on WebShop, a simplified shopping website. You are given an instruction that \
describes a product to buy. Find the product that best matches it (type, attributes, options and price) \
and buy it.

Each turn you see the current page and the actions available on it. Answer with exactly one action.

Actions:
- search[<keywords>]: search for products; only possible when the page has a search bar.
- click[<element>]: click one of the clickable elements listed for the page, written exactly as listed \
(product IDs such as b0123abcd, options such as "large" or "navy blue", and the buttons "back to search", \
"next >", "< prev", "description", "features", "reviews" and "buy now").

Choose an option (size, color, ...) on the product page by clicking it before you click "buy now". \
The episode ends when you click "buy now". You may think briefly first; then end your reply with one \
line of the form
Action: <action>

Example.
Page: WebShop [SEP] Instruction: [SEP] i need a red cotton t-shirt for men in size large, and price lower \
than 30.00 dollars [SEP] Search
Available actions: search[<keywords>]
Reply: I should search for the product first.
Action: search[red cotton t-shirt men]
Page: ... [SEP] B07ABC1234 [SEP] Men's Cotton Crew T-Shirt [SEP] $12.99 [SEP] ...
Available actions: click[back to search], click[next >], click[b07abc1234], ...
Reply: The first result is a men's cotton t-shirt under 30 dollars.
Action: click[b07abc1234]
Page: ... [SEP] size [SEP] small [SEP] large [SEP] color [SEP] red [SEP] blue [SEP] ... [SEP] Buy Now
Available actions: click[large], click[red], click[buy now], ...
Reply: Action: click[large]
(then click[red], then click[buy now])"""

INVALID_REPLY_MESSAGE = (
    "Your reply did not contain a valid action. End your reply with one line of the form "
    "`Action: search[<keywords>]` or `Action: click[<element>]`, using an element listed below."
)
INVALID_ACTION_MESSAGE = "The action {action} is not available on this page, so nothing happened. Use one of the actions listed below."
EPISODE_DONE_MESSAGE = "You bought a product; the episode is over."
EPISODE_TRUNCATED_MESSAGE = "The step limit was reached; the episode is over."


def available_actions_text(available_actions: Mapping[str, Any], max_clickables: int = 0) -> str:
    """``search[<keywords>], click[a], click[b], ...``: the actions as the model should write them."""
    parts: list[str] = []
    if available_actions.get("has_search_bar"):
        parts.append("search[<keywords>]")
    clickables: Sequence[str] = [c for c in available_actions.get("clickables", []) if c != "search"]
    if max_clickables and len(clickables) > max_clickables:
        clickables = clickables[:max_clickables]
    parts.extend(f"click[{label}]" for label in clickables)
    return ", ".join(parts) if parts else "(none)"


def page_text(observation: str, available_actions: Mapping[str, Any], max_observation_chars: int = 0) -> str:
    """The page and its actions, as every user turn shows them."""
    if max_observation_chars and len(observation) > max_observation_chars:
        observation = observation[:max_observation_chars] + " ...(truncated)"
    return f"Page: {observation}\nAvailable actions: {available_actions_text(available_actions)}"


def first_user_message(instruction: str, observation: str, available_actions: Mapping[str, Any]) -> str:
    """The first user turn: the instruction and the start page."""
    return f"Instruction: {instruction}\n{page_text(observation, available_actions)}"


def initial_messages(
    instruction: str, observation: str, available_actions: Mapping[str, Any]
) -> list[dict[str, str]]:
    """The chat a trajectory starts from (the dataset's ``prompt`` column)."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": first_user_message(instruction, observation, available_actions)},
    ]


def step_message(
    observation: str,
    available_actions: Mapping[str, Any],
    *,
    action: str | None,
    valid: bool,
    done: bool = False,
    truncated: bool = False,
    max_observation_chars: int = 0,
) -> str:
    """The user turn after a step: a note on what went wrong (if anything), then the page and its actions.

    ``action`` is None when the reply named no action at all (the corrective message).
    """
    if done:
        return EPISODE_TRUNCATED_MESSAGE if truncated else EPISODE_DONE_MESSAGE
    lines = []
    if action is None:
        lines.append(INVALID_REPLY_MESSAGE)
    elif not valid:
        lines.append(INVALID_ACTION_MESSAGE.format(action=action))
    lines.append(page_text(observation, available_actions, max_observation_chars))
    return "\n".join(lines)


def message_text(message: Mapping[str, Any]) -> str:
    """A chat message's text, whether ``content`` is a string or a list of typed parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(
            str(part.get("text", "")) if isinstance(part, Mapping) else str(part) for part in content
        )
    return "" if content is None else str(content)


def last_assistant_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The text of the last assistant message ('' when there is none)."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            return message_text(message)
    return ""
