"""The action grammar: ``search[keywords]`` and ``click[label]``.

Parsed like the original: ``re.match(r'(.+)\\[(.+)\\]', action)``: greedy, anchored at the start only, ``.``
does not cross a newline, names are case-sensitive, and the argument is lower-cased (never trimmed). So
``search[a[b]c]`` is ``('search[a', 'b]c')`` (an invalid action) and ``click[x] trailing`` is ``click x``.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_ACTION = re.compile(r"(.+)\[(.+)\]")


class ParsedAction(NamedTuple):
    name: str
    argument: str | None  # lower-cased; None when the action does not match the grammar


def parse_action(action: str) -> ParsedAction:
    match = _ACTION.match(action)
    if match is None:
        return ParsedAction(action, None)
    return ParsedAction(match.group(1), match.group(2).lower())
