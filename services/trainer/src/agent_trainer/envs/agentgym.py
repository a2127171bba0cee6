"""The action format of AgentGym's TextCraft and BabyAI clients, as their behaviour is documented (written here from
that description, not from their code).

A reply holds its action after the marker ``Action:`` (case as written). The client:

- answers a reply with more than one ``Action:`` itself (:data:`ONE_ACTION_ONLY`) and sends nothing;
- otherwise takes the text after the last ``Action:`` up to the end of that line: the prompts ask for
  ``Action:`` followed by the action on the same line or on the next one, so blanks and line breaks right after
  the marker are skipped first; a reply without the marker sends the empty action;
- deletes every character outside ``[A-Za-z0-9, ]``, collapses runs of spaces and strips.

So ``Action: craft 4 oak_planks using 1 oak logs.`` sends ``craft 4 oakplanks using 1 oak logs`` (the environment
then refuses it), exactly as an AgentGym client would: the model is trained on what an AgentGym-RL model sees.
"""

from __future__ import annotations

import re

from .spec import Parsed

MARKER = "Action:"
#: What AgentGym's TextCraft and BabyAI clients answer to a reply with several ``Action:`` (nothing is sent).
ONE_ACTION_ONLY = "Error: Only one 'Action' is allowed per response. Please adjust your response."
_DROPPED = re.compile(r"[^A-Za-z0-9, ]")


def clean_action(text: str) -> str:
    """Only ``[A-Za-z0-9, ]`` kept, runs of spaces collapsed, stripped."""
    return " ".join(_DROPPED.sub("", text).split())


def parse_reply(reply: str) -> Parsed:
    """The action an AgentGym TextCraft/BabyAI client would send for ``reply`` (see the module docstring)."""
    reply = reply or ""
    count = reply.count(MARKER)
    if count > 1:
        return Parsed(action=None, well_formed=False, feedback=ONE_ACTION_ONLY)
    if count == 0:
        return Parsed(action="", well_formed=False)
    after = reply.split(MARKER, 1)[1].lstrip(" \t\r\n")
    action = clean_action(after.split("\n", 1)[0])
    return Parsed(action=action, well_formed=bool(action))
