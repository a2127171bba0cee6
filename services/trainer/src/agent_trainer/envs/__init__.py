"""The environments the trainer can train on, by id: one ``EnvSpec`` each (``spec.EnvSpec``), in one module per
environment (``webshop``, ``textcraft``, ``babyai``, ``sciworld``), and those of installed environment packages
(plugins), found through the env service's registry: a plugin's registration names its trainer spec
(``Registration.trainer``, ``"module:SPEC"``), so the package that brings the environment brings the spec too.

Adding one: a module with its ``SPEC`` (prompt, parser, outcome, rounds), a line in :data:`SPECS`, and the
environment served under ``/<id>/v1`` by the env service (docs/training-environments.md); or a package of its own
(docs/environments/adding.md). Its entries in configs/agent_loop.yaml (``<id>_agent``) and
configs/interaction.yaml are derived from its spec and registration (:mod:`.entries`: ``agent-train configs
--write``).
"""

from __future__ import annotations

from functools import cache

from . import babyai, sciworld, textcraft, webshop
from .spec import CoreUnavailable, EnvSpec, Outcome, Parsed, TaskError, task_index

SPECS: dict[str, EnvSpec] = {s.env_id: s for s in (webshop.SPEC, textcraft.SPEC, babyai.SPEC, sciworld.SPEC)}
#: WebShop's id, for what names no environment (records and metrics of WebShop's runner, which carry none). Not to
#: branch on: what sets WebShop apart is its spec's fields (``needs_catalog``, ``eval_protocol``, ``reset_fields``,
#: ``max_rounds``), which a fifth environment declares the same way.
WEBSHOP = "webshop"


class UnknownEnvironment(ValueError):
    pass


@cache
def plugins() -> dict[str, EnvSpec]:
    """The specs of the installed environment packages' environments: those their registrations name
    (``agent_envs.envs.registry``), by id; each is checked to be an ``EnvSpec`` of that id."""
    from agent_envs.envs import registry

    found: dict[str, EnvSpec] = {}
    for registration in registry.registrations().values():
        if registration.id in SPECS or registration.trainer is None:
            continue
        spec = registry.resolve(registration.trainer)
        if not isinstance(spec, EnvSpec) or spec.env_id != registration.id:
            raise UnknownEnvironment(f"{registration.id}'s registration names {registration.trainer}, which is not "
                                     f"the trainer's EnvSpec of {registration.id!r}")  # fmt: skip
        found[registration.id] = spec
    return found


def specs() -> dict[str, EnvSpec]:
    """Every spec the trainer knows, by id: its own table's, then those the registrations name (Sokoban's, a
    plugin's)."""
    return {**SPECS, **plugins()}


def ids() -> list[str]:
    return list(specs())


def get(env_id: str) -> EnvSpec:
    """The spec of ``env_id`` (raises ``UnknownEnvironment`` naming the known ones)."""
    spec = SPECS.get(env_id) or plugins().get(env_id)
    if spec is None:
        raise UnknownEnvironment(f"unknown environment {env_id!r}: the trainer knows {', '.join(ids())}")
    return spec


def by_agent_name(agent_name: str) -> EnvSpec | None:
    """The spec whose agent-loop entry is ``agent_name`` (``textcraft_agent`` -> TextCraft), else None."""
    return next((s for s in (*SPECS.values(), *plugins().values()) if s.agent_name == agent_name), None)


def parse_ids(text: str) -> list[str]:
    """``"textcraft,babyai"`` -> ``["textcraft", "babyai"]`` (each checked, no repeats)."""
    names = [part.strip() for part in str(text).split(",") if part.strip()]
    if not names:
        raise UnknownEnvironment(f"no environment named in {text!r}; the trainer knows {', '.join(ids())}")
    for name in names:
        get(name)
    if len(set(names)) != len(names):
        raise UnknownEnvironment(f"an environment is named twice in {text!r}")
    return names


__all__ = ["SPECS", "WEBSHOP", "CoreUnavailable", "EnvSpec", "Outcome", "Parsed", "TaskError", "UnknownEnvironment", "by_agent_name",
           "get", "ids", "parse_ids", "plugins", "task_index"]  # fmt: skip
