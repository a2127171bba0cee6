"""What an environment declares about itself for operations: ``Registration`` (Gymnasium's ``EnvSpec``, for a served
environment).

A registration is plain data, importable without the environment's own dependencies (minigrid, a JVM, a catalog):
the balancer's routes, the local cluster's replica groups, the compose services' environment filter, the images'
and virtual environments' extras, the commands' choices and the docs' list are all derived from registrations
(``agent_envs.deploy``), on machines that may not have the environment installed. Everything the serving layer needs at
run time is the package's (``module``): its core (``make``), AgentGym's routes for it (``AGENTGYM_ROUTES``), and, for
an environment with a protocol of its own, its HTTP side (``http``).

Every value here ends up in an nginx configuration or a command line, so each is checked when the registration is
made: ids, route names and field names are lower-case words, package names and extras are what pip and apt accept,
slow paths are a small regex alphabet (no space, quote, brace or semicolon: nothing that could end an nginx
directive).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

Placement = Literal["any", "sticky"]

#: The native protocol's slow call of every environment served by the serving layer's routes: the expert's plan.
EXPERT_PATH = "v1/tasks/[0-9]+/expert"
#: Paths an environment id may not take: the serving layer's own routes at the root.
RESERVED_IDS = frozenset({"v1", "healthz", "readyz", "metrics", "docs", "redoc", "openapi", "nginx"})

_WORD = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_OBJECT = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*$")
_EXTRA = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
_DEBIAN_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9.+-]{0,63}$")
_SLOW_PATH = re.compile(r"^[A-Za-z0-9_/\[\]^+*.?|()-]{1,120}$")
#: A pip requirement as an extra lists it (a name, optional extras, version bounds; no URL, marker or space).
_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[a-z0-9,_-]+\])?((==|>=|<=|~=|!=|<|>)[A-Za-z0-9.*+!]+)?"
                          r"(,(==|>=|<=|~=|!=|<|>)[A-Za-z0-9.*+!]+)*$")  # fmt: skip
#: A pin: one package at one version.
_PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!]+$")


class RegistrationError(ValueError):
    """A registration that cannot be deployed as it is; the message names the field and what it takes."""


@dataclass(frozen=True)
class Timeouts:
    """How long the balancer waits for one of the environment's requests (nginx's upstream timeouts).

    Attributes:
        read_s: one attempt of a reset, a step or an AgentGym call (a replica that takes longer is given up on,
            marked failed for a while, and the request goes to another).
        retry_window_s: all attempts of one request together.
        slow_read_s, slow_retry_window_s: the same for the environment's slow calls (``Registration.slow_paths``:
            an expert's plan, a batch of steps).
    """

    read_s: float = 2.0
    retry_window_s: float = 8.0
    slow_read_s: float = 10.0
    slow_retry_window_s: float = 25.0

    def __post_init__(self) -> None:
        for name in ("read_s", "retry_window_s", "slow_read_s", "slow_retry_window_s"):
            value = getattr(self, name)
            if not 0 < value <= 3600:
                raise RegistrationError(f"timeouts.{name} = {value!r}: a number of seconds in (0, 3600]")
        if self.retry_window_s < self.read_s or self.slow_retry_window_s < self.slow_read_s:
            raise RegistrationError("a retry window shorter than one attempt: raise retry_window_s")


@dataclass(frozen=True)
class Registration:
    """One environment, as the registry and every deployment file know it.

    Attributes:
        id: the environment's id (``"textcraft"``): its URL prefix (``/textcraft/...``) and its name in
            ``AGENTRL_ENVS``, ``--env`` options and the trainer's rows.
        module: the package with ``make()`` (or ``make(settings)``: the service's ``Settings``) returning its core
            (``envs.contract.TextEnv``) and ``AGENTGYM_ROUTES``; imported on first use only.
        title: one line for the docs and ``agent-envs envs``.
        placement: ``"any"``: any replica serves any request (the state travels in the token; least connections,
            failed requests retried on another replica, several workers per replica); ``"sticky"``: a replica holds
            each episode's simulator (SciWorld's JVM), so the balancer keeps an episode on one replica, its
            replicas run one worker each, in a group of their own (another replica can serve a step only by
            replaying the episode), and a replica's own 503 is not retried elsewhere.
        timeouts: the balancer's timeouts for its requests.
        hedge: whether the client may send a slow reset or step to a second address as well (never for a sticky
            environment: the second replica would replay the episode, doubling the load where it is high).
        extra: the ``agent-envs`` extra that installs what its core needs (None: nothing beyond the base, or a
            plugin's own distribution).
        requires: the pip requirements of that extra (``services/env/pyproject.toml``'s extra is written from them
            by ``agent-envs envs --write-deploy``). A plugin's are its own distribution's: none here.
        pins: the exact versions (``name==version``) of what ``requires`` installs, the ones its recordings and tests
            were made with: the environments' block of ``constraints.txt`` is written from them.
        system_packages: Debian packages its core needs besides Python's (SciWorld: a Java 17 runtime); an image
            without them does not serve it.
        agentgym_routes: the route names of AgentGym's server for it (``create``, ``step``, ...): the balancer
            routes these by session.
        agentgym_id: the request field that names an AgentGym session (``id``; WebShop's server: ``env_idx``).
        max_steps: the episode's step limit, as its core enforces it (None: none).
        root_alias: its routes are served at the root as well as under ``/<id>`` (WebShop's, as they always were;
            one environment at most).
        slow_paths: its slow native calls, as regexes of the path after ``/<id>/`` (nginx's slow timeouts).
        http: ``"module:attribute"`` of an HTTP side of its own (a protocol the serving layer's routes do not
            speak; ``api.routes_envs.HttpSide``); None: the serving layer's native and AgentGym routes.
        check: ``"module:function"``, ``function(settings) -> list[str]``: problems that stop ``serve`` before any
            worker starts (WebShop: no prepared catalog; SciWorld: no ``java``).
        data_setting: the service setting (a ``Settings`` field) naming a directory of prepared data the environment
            reads at start (WebShop: ``catalog``, ``WEBSHOP_CATALOG``, made by ``make data``); None: its data comes
            with its package. What prepares data before serving reads this, never an environment's name: ``make
            up-local``/``up-ray`` and ``make demo`` run ``make data`` first only where a served environment has one,
            and a Slurm job stages that directory onto each node (``AGENTRL_RAY_STAGE_CATALOG``).
        trainer: ``"module:attribute"`` of the trainer's spec for it (``agent_trainer.envs.spec.EnvSpec``): how the
            trainer finds a plugin's prompt, parser and splits.
        docs: its page in the docs (``environments/textcraft.md``), or a URL.
    """

    id: str
    module: str
    title: str
    placement: Placement = "any"
    timeouts: Timeouts = field(default_factory=Timeouts)
    hedge: bool = True
    extra: str | None = None
    requires: tuple[str, ...] = ()
    pins: tuple[str, ...] = ()
    system_packages: tuple[str, ...] = ()
    agentgym_routes: tuple[str, ...] = ()
    agentgym_id: str = "id"
    max_steps: int | None = None
    root_alias: bool = False
    slow_paths: tuple[str, ...] = (EXPERT_PATH,)
    http: str | None = None
    check: str | None = None
    data_setting: str | None = None
    trainer: str | None = None
    docs: str | None = None

    def __post_init__(self) -> None:
        def refuse(name: str, what: str) -> None:
            raise RegistrationError(f"registration of {self.id!r}: {name} = {getattr(self, name)!r}: {what}")

        if not _WORD.match(self.id) or self.id in RESERVED_IDS:
            refuse("id", f"a lower-case word of at most 32 characters, not one of {sorted(RESERVED_IDS)}")
        if not _MODULE.match(self.module):
            refuse("module", "a dotted module name")
        if not self.title or "\n" in self.title:
            refuse("title", "one line")
        if self.placement not in ("any", "sticky"):
            refuse("placement", "'any' or 'sticky'")
        if self.placement == "sticky" and self.hedge:
            refuse(
                "hedge",
                "False for a sticky environment (a hedge would replay the episode on another replica)",
            )
        if self.extra is not None and not _EXTRA.match(self.extra):
            refuse("extra", "a pip extra name (lower-case letters, digits, dashes)")
        if not all(_REQUIREMENT.match(r) for r in self.requires):
            refuse("requires", "pip requirements as an extra lists them ('name>=1.2,<2', no URL or marker)")
        if self.requires and self.extra is None:
            refuse("requires", "requirements of its extra: name the extra too")
        if not all(_PIN.match(p) for p in self.pins):
            refuse("pins", "exact versions ('name==1.2.3')")
        if not all(_DEBIAN_PACKAGE.match(p) for p in self.system_packages):
            refuse("system_packages", "Debian package names")
        if not all(_WORD.match(r) for r in self.agentgym_routes):
            refuse("agentgym_routes", "route names (lower-case words, no slashes)")
        if not _WORD.match(self.agentgym_id):
            refuse("agentgym_id", "a field name (a lower-case word)")
        if self.data_setting is not None and not _WORD.match(self.data_setting):
            refuse("data_setting", "a settings field name (a lower-case word)")
        if self.max_steps is not None and self.max_steps < 1:
            refuse("max_steps", "a positive number of steps, or None")
        if not all(_SLOW_PATH.match(p) for p in self.slow_paths):
            refuse("slow_paths", "regexes of letters, digits and _/[]^+*.?|()- only")
        for name in ("http", "check", "trainer"):
            value = getattr(self, name)
            if value is not None and not _OBJECT.match(value):
                refuse(name, "'module:attribute'")

    @property
    def prefixes(self) -> tuple[str, ...]:
        """Where its routes are mounted: ``/<id>``, and first the root for a root alias."""
        return ("", f"/{self.id}") if self.root_alias else (f"/{self.id}",)
