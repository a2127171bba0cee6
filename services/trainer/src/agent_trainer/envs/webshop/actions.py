"""Turning a model's free-form reply into one WebShop action.

Rule (docs/architecture.md, "The trainer side"): the action on the **last** ``Action:`` line wins; without
one, the **last** ``search[...]``/``click[...]`` anywhere in the reply. Real replies are messy, so extraction
tolerates:

- any case and spacing around the parts (``ACTION :  Click [ Buy Now ]`` gives ``click[Buy Now]``);
- markdown around the marker or the action (``**Action:**``, ``- Action:``, backticks, code fences);
- an action on the line *after* a bare ``Action:`` marker;
- end-of-turn markers (``</s>``, ``<|im_end|>``, ``<|eot_id|>``...) and ``<action>`` tags.

The action name is lower-cased (the env's grammar is case-sensitive: ``Search[x]`` would be invalid) and the
argument is stripped (the env never trims: ``click[ buy now ]`` would not match ``buy now``). The argument's
own case is kept; the env lower-cases it. Anything else (no action, empty brackets) gives ``None``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

ACTION_NAMES = ("search", "click")
# What is sent to the env for a reply with no parseable action: the env treats it as an invalid action
# (page unchanged, reward 0, one more step), so the step counter and step limit stay the server's.
UNPARSEABLE_ACTION = "noop[no action in reply]"

# One action: name, optional spaces, [argument without brackets or newlines].
_ACTION = re.compile(r"\b(search|click)\s*\[([^\[\]\n]*)\]", re.IGNORECASE)
# The marker: "Action:" (or full-width colon) at a line start, after optional markdown/list decoration.
_MARKER = re.compile(r"^[ \t>*_#`\-]*action[ \t*_`]*[:：]", re.IGNORECASE | re.MULTILINE)
# End-of-turn / special tokens that models leak into text.
_SPECIAL = re.compile(
    r"</s>|<s>|<\|im_end\|>|<\|im_start\|>|<\|endoftext\|>|<\|eot_id\|>|<\|end_of_text\|>|<\|end\|>"
    r"|<\|assistant\|>|<eos>|<end_of_turn>|</?action>",
    re.IGNORECASE,
)
_FENCE = re.compile(r"^[ \t]*```[^\n]*$", re.MULTILINE)


def step_was_valid(action: str | None, info: Mapping[str, Any]) -> bool:
    """A turn is valid when the reply held an action and the env accepted it (``info.valid``)."""
    return action is not None and bool(info.get("valid", True))


def clean_reply(text: str) -> str:
    """The reply without special tokens, ``<action>`` tags and code-fence lines (their content stays)."""
    text = _SPECIAL.sub("\n", text)
    return _FENCE.sub("", text)


def _first_action(text: str) -> str | None:
    for match in _ACTION.finditer(text):
        action = _normalise(match)
        if action is not None:
            return action
    return None


def _last_action(text: str) -> str | None:
    for match in reversed(list(_ACTION.finditer(text))):
        action = _normalise(match)
        if action is not None:
            return action
    return None


def _normalise(match: re.Match[str]) -> str | None:
    argument = " ".join(match.group(2).split())
    if not argument:
        return None
    return f"{match.group(1).lower()}[{argument}]"


def extract_action(reply: str | None) -> str | None:
    """The action a reply asks for (``search[...]`` or ``click[...]``), or None when it names none."""
    if not reply:
        return None
    text = clean_reply(reply)
    markers = list(_MARKER.finditer(text))
    if markers:
        # Walk back from the last marker: a marker with no usable action after it (e.g. a trailing
        # "Action:" the model never finished) falls back to the previous one, then to the whole reply.
        for index in range(len(markers) - 1, -1, -1):
            start = markers[index].end()
            end = markers[index + 1].start() if index + 1 < len(markers) else len(text)
            action = _first_action(text[start:end])
            if action is not None:
                return action
    return _last_action(text)


def is_search(action: str) -> bool:
    return action.startswith("search[")
