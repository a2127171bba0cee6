"""The action grammar: ``search[keywords]`` and ``click[label]``.

Parsed like the original: ``re.match(r'(.+)\\[(.+)\\]', action)``: greedy, anchored at the start only, ``.``
does not cross a newline, names are case-sensitive, and the argument is lower-cased (never trimmed). So
``search[a[b]c]`` is ``('search[a', 'b]c')`` (an invalid action) and ``click[x] trailing`` is ``click x``.
"""

from __future__ import annotations

from typing import NamedTuple


class ParsedAction(NamedTuple):
    name: str
    argument: str | None  # lower-cased; None when the action does not match the grammar


def parse_action(action: str) -> ParsedAction:
    """What the original's regex gives, found with string searches (the regex backtracks over a long query).

    The match lies on the first line. Greedy, the name runs to the last ``[`` that still leaves a non-empty
    argument before a ``]``, and the argument to the line's last ``]``.
    """
    line = action.split("\n", 1)[0]
    close = line.rfind("]")
    open_ = line.rfind("[", 1, close - 1) if close >= 3 else -1
    if open_ < 1:
        return ParsedAction(action, None)
    return ParsedAction(line[:open_], line[open_ + 1 : close].lower())
