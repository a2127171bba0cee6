"""The policies ``agent-train eval`` can evaluate.

- ``expert``: the oracle's actions (from the server's ``/v1/goals/{goal}/expert``, or computed in-process
  from a local catalog); the upper bracket of the scale.
- ``random``: uniform over the page's clicks (plus, on the search page, a search for words of the
  instruction), seeded per goal; the lower bracket.
- ``openai``: any OpenAI-compatible chat endpoint (sglang, vLLM, a hosted model), driven with the training
  prompt and the training action extraction (WebShop's: ``agent_trainer.envs.webshop.prompts`` /
  ``agent_trainer.envs.webshop.actions`` through ``conversation``), so eval numbers mean what training optimised.
- ``checkpoint``: starts an sglang server from a model directory, then is the ``openai`` policy against it.

On the environments played through their spec (``runner.SpecPlay``: TextCraft, BabyAI, SciWorld) the expert plays
the environment's plan and ``EnvRandomPolicy`` its listed actions (else actions of training tasks' plans), both replying ``Action: ...``
(``as_agentgym_reply``) so that the environment's parser reads them like a model's; the LLM policies take the
environment's spec (``OpenAIPolicy.env_spec``: its system prompt and first turn, ``conversation.EnvConversation``).

A policy hands out one ``EpisodeAgent`` per episode (``begin``); the agent answers one ``Decision`` per turn.
Endpoint failures that survive the retries raise ``PolicyError``: the runner reports them and never scores
such an episode as a 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import random
import re
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agent_envs.cluster import free_ports

from ..config import TURN_TOKENS

POLICIES = ("expert", "random", "openai", "checkpoint")


class PolicyError(RuntimeError):
    """The policy could not produce an action (endpoint down, refusing, misconfigured); says why."""


class ContextLengthExceeded(PolicyError):
    """The conversation no longer fits the model's context: the episode ends there, like in training."""


@dataclass(frozen=True)
class Turn:
    """What the agent sees before acting: the page as text and its available actions."""

    goal: int
    goal_set: str
    instruction: str
    observation: str
    available_actions: dict[str, Any]
    index: int  # 0 for the first action of the episode


@dataclass
class Decision:
    """One reply of the agent: its raw output and the action parsed from it (None: nothing parseable)."""

    output: str
    action: str | None
    stop: bool = False  # the policy gives up (e.g. the expert found no way to the product)
    usage: dict[str, int] = field(default_factory=dict)
    send: str | None = None  # what goes to the env when it differs from ``action`` (a reply without one)

    @property
    def env_action(self) -> str:
        return self.send if self.send is not None else (self.action or "")


class EpisodeAgent(ABC):
    """A policy's per-episode state (a conversation, a plan, a random generator)."""

    @abstractmethod
    async def act(self, turn: Turn) -> Decision: ...

    def observe(self, turn: Turn, decision: Decision, valid: bool) -> None:  # noqa: B027 - optional hook
        """Called with the new page after ``decision`` was played (and did not end the episode)."""


class Policy(ABC):
    """A policy under evaluation; ``start``/``close`` bracket the whole run."""

    name: str = "policy"

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Acquire resources (connections, a model server)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release what ``start`` acquired."""

    @abstractmethod
    async def begin(self, first: Turn) -> EpisodeAgent: ...

    def describe(self) -> dict[str, Any]:
        """The policy's settings as recorded in ``metrics.json`` (never secrets)."""
        return {"name": self.name}


# ---- expert ----------------------------------------------------------------------------------------------
PlanSource = Callable[[int, str], Awaitable[list[str]]]


def as_action(action: str) -> str:
    """WebShop's expert and random policies reply with the bare action (what WebShop's parser reads)."""
    return action


def as_agentgym_reply(action: str) -> str:
    """The reply an AgentGym client reads ``action`` from (TextCraft, BabyAI, SciWorld: ``Action: <action>``), so
    the expert's and the random policy's actions go through the environment's own parser like a model's."""
    return f"Action: {action}"


class ExpertPolicy(Policy):
    """Plays the oracle's plan; an empty plan (no way to the product found) ends the episode at once.

    ``reply`` turns an action into the reply the runner parses (``as_agentgym_reply`` for the other
    environments)."""

    name = "expert"

    def __init__(self, plans: PlanSource, source: str, reply: Callable[[str], str] = as_action) -> None:
        self._plans = plans
        self._source = source
        self._reply = reply

    async def begin(self, first: Turn) -> EpisodeAgent:
        return _PlanAgent(list(await self._plans(first.goal, first.goal_set)), self._reply)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "plan_source": self._source}


class _PlanAgent(EpisodeAgent):
    def __init__(self, plan: list[str], reply: Callable[[str], str] = as_action) -> None:
        self._plan = plan
        self._reply = reply

    async def act(self, turn: Turn) -> Decision:
        if turn.index >= len(self._plan):
            return Decision(output="", action=None, stop=True)
        action = self._plan[turn.index]
        return Decision(output=self._reply(action), action=action)


def catalog_plans(catalog: Any) -> PlanSource:
    """Expert plans computed in-process from a local copy of the served catalog (opened, or its directory)."""
    from agent_envs.envs.webshop.catalog.store import open_catalog
    from agent_envs.envs.webshop.core.env import WebShopEnv
    from agent_envs.envs.webshop.core.oracle import expert_actions

    env = WebShopEnv(open_catalog(catalog) if isinstance(catalog, str | Path) else catalog)

    async def plans(goal: int, goal_set: str) -> list[str]:
        return expert_actions(env, goal, goal_set=goal_set)

    return plans


# ---- random ----------------------------------------------------------------------------------------------
SEARCH_WORDS = (2, 6)  # a random search uses this many consecutive instruction words (inclusive)
_WORD = re.compile(r"[a-z0-9](?:[a-z0-9'&.-]*[a-z0-9])?")  # "30.00" and "t-shirt" stay whole


class RandomPolicy(Policy):
    """Uniform over the page's ``click[...]`` actions plus, on the search page, one instruction search.

    ``click[search]`` is left out: in text mode it is not an action (the environment rejects it), so it would
    only make the random agent waste turns on invalid moves. Seeded per (seed, goal set, goal), so a
    resumed or differently-parallel run draws the same actions.
    """

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    async def begin(self, first: Turn) -> EpisodeAgent:
        return _RandomAgent(random.Random(f"{self.seed}:{first.goal_set}:{first.goal}"))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "seed": self.seed}


class _RandomAgent(EpisodeAgent):
    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    async def act(self, turn: Turn) -> Decision:
        actions = random_choices(turn, self._rng)
        if not actions:
            return Decision(output="", action=None, stop=True)
        action = self._rng.choice(actions)
        return Decision(output=action, action=action)


class EnvRandomPolicy(Policy):
    """The random policy of the other environments: at every turn a uniformly random action among those the
    environment lists (``available_actions``, BabyAI), else among ``pool`` (the actions of expert plans of
    *training* tasks: commands of the right form, mostly useless for the task at hand), sent as a reply the
    environment's parser reads. Seeded per (seed, environment, task), like ``RandomPolicy``."""

    name = "random"

    def __init__(self, pool: Callable[[], Awaitable[list[str]]], seed: int = 0,
                 reply: Callable[[str], str] = as_agentgym_reply) -> None:  # fmt: skip
        self.seed = seed
        self._pool_source = pool
        self._pool: list[str] | None = None
        self._lock = asyncio.Lock()
        self._reply = reply

    async def _actions(self) -> list[str]:
        """The pool, built at the first episode that needs it (BabyAI lists its actions and never does)."""
        async with self._lock:
            if self._pool is None:
                self._pool = sorted(set(await self._pool_source()))
        return self._pool

    async def begin(self, first: Turn) -> EpisodeAgent:
        rng = random.Random(f"{self.seed}:{first.goal_set}:{first.goal}")
        return _EnvRandomAgent(rng, self._actions, self._reply)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "seed": self.seed, "pool_size": len(self._pool or [])}


class _EnvRandomAgent(EpisodeAgent):
    def __init__(self, rng: random.Random, pool: Callable[[], Awaitable[list[str]]], reply: Callable[[str], str]
                 ) -> None:  # fmt: skip
        self._rng, self._pool, self._reply = rng, pool, reply

    async def act(self, turn: Turn) -> Decision:
        choices = list(turn.available_actions.get("actions") or []) or await self._pool()
        if not choices:
            return Decision(output="", action=None, stop=True)
        action = self._rng.choice(choices)
        return Decision(output=self._reply(action), action=action)


def random_choices(turn: Turn, rng: random.Random) -> list[str]:
    """The candidate actions of the random policy on this page."""
    clicks = [
        f"click[{label}]" for label in turn.available_actions.get("clickables", []) if label != "search"
    ]
    if turn.available_actions.get("has_search_bar"):
        words = _WORD.findall(turn.instruction.lower())
        if words:
            size = min(len(words), rng.randint(*SEARCH_WORDS))
            start = rng.randrange(len(words) - size + 1)
            clicks.append(f"search[{' '.join(words[start : start + size])}]")
    return clicks


# ---- OpenAI-compatible endpoint ----------------------------------------------------------------------------
RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
_CONTEXT_HINTS = ("context length", "context_length", "maximum context", "too long", "max_model_len")


class OpenAIPolicy(Policy):
    """Chat completions against an OpenAI-compatible server, with the training prompt and action parser.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:30000/v1`` (``/chat/completions`` is appended).
        model: the served model name.
        api_key: sent as a bearer token (``OPENAI_API_KEY`` when None; local servers ignore it).
        temperature, top_p, max_tokens: sampling settings of every request.
        timeout: seconds per request.
        retries: attempts after the first on connection errors, timeouts, 408/409/425/429 and 5xx.
        backoff: base delay (s); attempt ``k`` sleeps ``uniform(0, min(max_backoff, backoff * 2**k))``.
        seed: sent as the request's ``seed`` (servers that honour it make sampling reproducible).
        max_observation_chars: the interaction setting of the same name (pages cut in later user turns).
    """

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        max_tokens: int = TURN_TOKENS,
        timeout: float = 120.0,
        retries: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 20.0,
        seed: int | None = 0,
        max_connections: int = 256,
        max_observation_chars: int = 0,
    ) -> None:
        if not base_url:
            raise PolicyError("the openai policy needs --base-url (e.g. http://127.0.0.1:30000/v1)")
        if not model:
            raise PolicyError("the openai policy needs --model (the served model name)")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.retries = max(0, retries)
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.seed = seed
        self.max_connections = max_connections
        self.max_observation_chars = max_observation_chars
        self._http: httpx.AsyncClient | None = None
        self._random = random.Random()
        #: set by the runner for an environment other than WebShop (``agent_trainer.envs.EnvSpec``)
        self.env_spec: Any = None
        self.requests = 0
        self.retried = 0

    async def start(self) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        limits = httpx.Limits(
            max_connections=self.max_connections, max_keepalive_connections=self.max_connections
        )
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(self.timeout), limits=limits, headers=headers)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def begin(self, first: Turn) -> EpisodeAgent:
        from ..envs.webshop.actions import UNPARSEABLE_ACTION
        from .conversation import Conversation, EnvConversation  # only LLM policies need the prompt

        if self.env_spec is not None:  # another environment: its spec's system prompt; the runner parses
            return _ChatAgent(self, EnvConversation.start(self.env_spec, first.observation), "")
        conversation = Conversation.start(
            first.instruction, first.observation, first.available_actions, self.max_observation_chars
        )
        return _ChatAgent(self, conversation, UNPARSEABLE_ACTION)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "base_url": self.base_url,
            "model": self.model,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "seed": self.seed,
            "retries": self.retries,
            "timeout_s": self.timeout,
            "max_observation_chars": self.max_observation_chars,
        }

    async def complete(self, messages: Sequence[dict[str, Any]]) -> tuple[str, dict[str, int]]:
        """The assistant's reply to ``messages`` (with retries); raises ``PolicyError`` when it cannot."""
        if self._http is None:
            await self.start()
        assert self._http is not None
        body: dict[str, Any] = {
            "model": self.model,
            "messages": list(messages),
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "n": 1,
        }
        if self.seed is not None:
            body["seed"] = self.seed
        url = f"{self.base_url}/chat/completions"
        attempt = 0
        while True:
            self.requests += 1
            try:
                response = await self._http.post(url, json=body)
            except httpx.HTTPError as error:
                problem = f"{type(error).__name__}: {error}".rstrip(": ")
            else:
                if response.status_code == 200:
                    return _reply(response, url)
                text = response.text[:500]
                if response.status_code == 400 and any(hint in text.lower() for hint in _CONTEXT_HINTS):
                    raise ContextLengthExceeded(f"the conversation exceeds the model's context: {text}")
                if response.status_code not in RETRYABLE_STATUS:
                    raise PolicyError(f"POST {url} was refused with HTTP {response.status_code}: {text}")
                problem = f"HTTP {response.status_code}: {text}"
            if attempt >= self.retries:
                raise PolicyError(
                    f"the model endpoint failed {attempt + 1} time(s) in a row (POST {url}); last: {problem}"
                )
            self.retried += 1
            await asyncio.sleep(self._random.uniform(0.0, min(self.max_backoff, self.backoff * 2**attempt)))
            attempt += 1


def _reply(response: httpx.Response, url: str) -> tuple[str, dict[str, int]]:
    try:
        data = response.json()
        content = data["choices"][0]["message"].get("content") or ""
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise PolicyError(
            f"POST {url} answered 200 without a chat completion: {response.text[:300]}"
        ) from None
    usage = data.get("usage") or {}
    return str(content), {k: int(v) for k, v in usage.items() if isinstance(v, int)}


class _ChatAgent(EpisodeAgent):
    def __init__(self, policy: OpenAIPolicy, conversation: Any, unparseable: str) -> None:
        self._policy = policy
        self._conversation = conversation
        self._unparseable = unparseable

    async def act(self, turn: Turn) -> Decision:
        output, usage = await self._policy.complete(self._conversation.messages)
        self._conversation.add_reply(output)
        action = self._conversation.action_of(output)
        return Decision(output=output, action=action, usage=usage, send=action or self._unparseable)

    def observe(self, turn: Turn, decision: Decision, valid: bool) -> None:
        self._conversation.add_step(turn.observation, turn.available_actions, decision.action, valid)


# ---- checkpoint (sglang) -----------------------------------------------------------------------------------
def sglang_command(
    model_path: str | Path,
    port: int,
    host: str = "127.0.0.1",
    python: str | None = None,
    served_model_name: str | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The command line that serves ``model_path`` with sglang's OpenAI-compatible server."""
    command = [
        python or sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model_path),
        "--host",
        host,
        "--port",
        str(port),
    ]
    if served_model_name:
        command += ["--served-model-name", served_model_name]
    return [*command, *extra_args]


def serveable_model(model_path: str | Path, python: str | None = None) -> str:
    """What sglang serves for ``model_path`` (hub id, HF directory, or a verl checkpoint merged once), or a
    ``PolicyError`` that says what was found and what to pass."""
    from .model_path import ModelPathError, resolve_model_path

    try:
        resolved = resolve_model_path(model_path, python=python)
    except ModelPathError as error:
        raise PolicyError(str(error)) from None
    if resolved.merged_now:
        print(
            f"eval: merged the verl checkpoint {resolved.checkpoint} into {resolved.serve}", file=sys.stderr
        )
    return resolved.serve


def sglang_available(python: str | None = None) -> bool:
    """Whether ``python`` (default: this interpreter) can import sglang."""
    if python is None or os.path.realpath(python) == os.path.realpath(sys.executable):
        return importlib.util.find_spec("sglang") is not None
    try:
        return (
            subprocess.run([python, "-c", "import sglang"], capture_output=True, timeout=120).returncode == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


SGLANG_MISSING = (
    "the checkpoint policy needs sglang (and a GPU): it is installed in the trainer image "
    "(docker/trainer). Elsewhere, serve the model with any OpenAI-compatible server (vLLM, sglang) and use "
    "`--policy openai --base-url http://HOST:PORT/v1 --model NAME`"
)


class CheckpointPolicy(OpenAIPolicy):
    """Serves ``model_path`` with sglang on a local port for the run, then evaluates it like ``openai``.

    ``server="cpu"`` serves it with the rehearsal's CPU chat server instead (``agent_trainer.rehearsal.
    chat_server``: a tiny model on a machine without a GPU); everything else is the same path.
    """

    name = "checkpoint"

    def __init__(
        self,
        model_path: str | Path,
        port: int = 0,
        python: str | None = None,
        startup_timeout: float = 900.0,
        server_args: Sequence[str] = (),
        log_path: Path | None = None,
        server: str = "sglang",
        **openai: Any,
    ) -> None:
        if server not in ("sglang", "cpu"):
            raise PolicyError(f"the checkpoint policy serves with sglang or cpu, not {server!r}")
        self.server = server
        self.model_path = Path(model_path)
        self.serve_path = str(model_path)  # what sglang loads: set by start() (a merged verl checkpoint)
        self.port = port or free_ports(1)[0]
        self.python = python
        self.startup_timeout = startup_timeout
        self.server_args = list(server_args)
        self.log_path = log_path
        self.served_model_name = "checkpoint"
        self._process: subprocess.Popen[bytes] | None = None
        super().__init__(base_url=f"http://127.0.0.1:{self.port}/v1", model=self.served_model_name, **openai)

    def command(self) -> list[str]:
        if self.server == "cpu":
            return [self.python or sys.executable, "-m", "agent_trainer.rehearsal.chat_server", "--model",
                    self.serve_path, "--port", str(self.port), "--served-model-name", self.served_model_name]  # fmt: skip
        from .sglang_defaults import sglang_default_args  # verl's attention backend for this sglang

        return sglang_command(
            self.serve_path,
            self.port,
            python=self.python,
            served_model_name=self.served_model_name,
            extra_args=[*self.server_args, *sglang_default_args(self.server_args, self.python)],
        )

    async def start(self) -> None:
        if self.server == "sglang" and not sglang_available(self.python):
            raise PolicyError(SGLANG_MISSING)
        self.serve_path = serveable_model(self.model_path, self.python)
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            if log is not subprocess.DEVNULL:
                log.close()  # type: ignore[union-attr]
        await super().start()
        try:
            await self._wait_healthy()
        except BaseException:
            await self.close()
            raise

    async def _wait_healthy(self) -> None:
        assert self._http is not None and self._process is not None
        url = f"http://127.0.0.1:{self.port}/health"
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self._process.poll() is not None:
                raise PolicyError(
                    f"the {self.server} server exited with code {self._process.returncode} during start-up"
                    + (f"; see {self.log_path}" if self.log_path else "")
                )
            with contextlib.suppress(httpx.HTTPError):
                if (await self._http.get(url, timeout=5.0)).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise PolicyError(
                    f"the {self.server} server was not healthy within {self.startup_timeout:.0f} s ({url})"
                )
            await asyncio.sleep(2.0)

    async def close(self) -> None:
        await super().close()
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, 15)
            try:
                await asyncio.to_thread(process.wait, 30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, 9)
                await asyncio.to_thread(process.wait, 10)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "name": self.name,
            "model_path": str(self.model_path),
            "served": self.serve_path,
            "server_args": self.server_args,
        }
