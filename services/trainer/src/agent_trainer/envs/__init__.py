"""The environments the trainer can train on, by id: one ``EnvSpec`` each (``spec.EnvSpec``), in one module per
environment (``webshop``, ``textcraft``, ``babyai``, ``sciworld``).

Adding one: a module with its ``SPEC`` (prompt, parser, outcome, rounds), a line in :data:`SPECS`, an entry
``<id>_agent`` in configs/webshop_agent_loop.yaml, and the environment served under ``/<id>/v1`` by the env
service (docs/training-environments.md).
"""

from __future__ import annotations

from . import babyai, sciworld, textcraft, webshop
from .spec import EnvSpec, Outcome, Parsed, TaskError, task_index

SPECS: dict[str, EnvSpec] = {s.env_id: s for s in (webshop.SPEC, textcraft.SPEC, babyai.SPEC, sciworld.SPEC)}
WEBSHOP = "webshop"


class UnknownEnvironment(ValueError):
    pass


def ids() -> list[str]:
    return list(SPECS)


def get(env_id: str) -> EnvSpec:
    """The spec of ``env_id`` (raises ``UnknownEnvironment`` naming the known ones)."""
    try:
        return SPECS[env_id]
    except KeyError:
        raise UnknownEnvironment(
            f"unknown environment {env_id!r}: the trainer knows {', '.join(SPECS)}"
        ) from None


def by_agent_name(agent_name: str) -> EnvSpec | None:
    """The spec whose agent-loop entry is ``agent_name`` (``textcraft_agent`` -> TextCraft), else None."""
    return next((s for s in SPECS.values() if s.agent_name == agent_name), None)


def parse_ids(text: str) -> list[str]:
    """``"textcraft,babyai"`` -> ``["textcraft", "babyai"]`` (each checked, no repeats)."""
    names = [part.strip() for part in str(text).split(",") if part.strip()]
    if not names:
        raise UnknownEnvironment(f"no environment named in {text!r}; the trainer knows {', '.join(SPECS)}")
    for name in names:
        get(name)
    if len(set(names)) != len(names):
        raise UnknownEnvironment(f"an environment is named twice in {text!r}")
    return names


__all__ = ["SPECS", "WEBSHOP", "EnvSpec", "Outcome", "Parsed", "TaskError", "UnknownEnvironment", "by_agent_name",
           "get", "ids", "parse_ids", "task_index"]  # fmt: skip
