"""An environment's dataset rows (verl's parquet format), one per task: ``RowBuilder``, and the schema every
environment's rows share (:data:`SCHEMA`), so one file can hold a mix.

A row's first user turn is the environment's own reset text for the task, shown through the spec
(``EnvSpec.first_message``), so the row's prompt is exactly what the episode will show (the 0.7.1 interaction
checks it against the service's at the first turn). The reset comes from the environment's core in this process
(``webshop_env.envs.registry``), or, where the core cannot be made here (the trainer images install the env
package without the environments' extras), from the service at ``DataOptions.env_url``, each episode closed at
once. The route a row names (``agent_name``): ``tool_agent`` (verl 0.7.1's ``ToolAgentLoop`` + the environment's
interaction) or ``<env>_agent`` (the agent loop, both lines).

An environment whose rows come another way brings a subclass in its module and names it in its spec (``rows``):
WebShop's come from its catalog (``envs.webshop.WebShopRows``), SciWorld's from a pool of fresh JVMs
(``envs.sciworld.SciWorldRows``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

import pyarrow as pa
from tqdm import tqdm

from ..config import AGENT_NAME
from .spec import DataError, DataOptions, EnvSpec

_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
#: The rows of every environment: verl's columns (``data_source``, ``agent_name``, ``prompt``, ``ability``,
#: ``reward_model``) and ``extra_info`` with the environment, its task, and ``interaction_kwargs`` (what the 0.7.1
#: interaction's ``start_interaction`` reads).
SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("agent_name", pa.string()),
        ("prompt", pa.list_(_MESSAGE)),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        ("extra_info", pa.struct([
            ("index", pa.int64()), ("env", pa.string()), ("task", pa.int64()), ("goal", pa.int64()),
            ("goal_set", pa.string()), ("split", pa.string()), ("instruction", pa.string()),
            ("interaction_kwargs", pa.struct([("name", pa.string()), ("task", pa.int64()), ("goal", pa.int64()),
                                              ("goal_set", pa.string()), ("split", pa.string())])),
        ])),
    ]
)  # fmt: skip


def instruction_line(opening: str) -> str:
    """The line of a first user turn that states the goal (``Goal: ...``, ``Your goal: ...``), else its first: the
    rows' ``instruction`` and eval's."""
    lines = [line.strip() for line in opening.splitlines() if line.strip()]
    for line in lines:
        if line.lower().startswith(("goal:", "your goal:", "your task")):
            return line
    return lines[0] if lines else ""


class RowBuilder:
    """One environment's rows, from its resets (see the module docstring).

    ``interaction``: rows for verl 0.7.1's ``ToolAgentLoop`` + the environment's interaction (``agent_name``
    ``tool_agent``) instead of its agent loop (``<env>_agent``). An environment that holds a simulator per
    episode, or one served from ``data.env_url``, resets ``prefetch``'s tasks several at a time (``workers``),
    each episode closed at once. ``close`` stops the simulators it started.
    """

    def __init__(self, spec: EnvSpec, data: DataOptions, interaction: bool = False) -> None:
        self.spec = spec
        self.data = data
        self.agent_name = AGENT_NAME if interaction else spec.agent_name
        self.progress = data.progress
        self.workers = 1
        self.core: Any = None
        self.env_url: str | None = None  # set: the resets are the service's (``source`` says which)
        self._first: dict[int, dict[str, Any]] = {}  # task -> its reset {observation, info} (prefetched, used once)
        self.open()

    def open(self) -> None:
        """The environment's core in this process, else (with ``data.env_url``) its service."""
        from webshop_env.envs import registry

        try:  # may fail on its package (ImportError), its data (TextCraft's RecipeDataMissing), ...
            self.core = registry.make(self.spec.env_id)
        except Exception as error:
            if not self.data.env_url:  # the trainer images install the env package without its environments' extras
                raise DataError(f"{self.spec.env_id}: its core cannot be made here ({type(error).__name__}: {error}); "
                                f"pip install -e 'services/env[{self.spec.env_id}]', or give --env-url (or "
                                "$WEBSHOP_URL): a service whose resets then make the rows") from None  # fmt: skip
            self.env_url = self.data.env_url.rstrip("/")

    @property
    def source(self) -> str | None:
        """Where the first turns come from: ``in process`` or the service's URL (None: the environment's own local
        data, WebShop's catalog, the only place they can come from)."""
        return self.env_url or "in process"

    def data_fingerprint(self) -> str:
        """The environment's data as the service names it (``<env>:<core fingerprint>``): the core's here, else
        the service's (``GET /<env>/v1/info``)."""
        if self.core is not None:
            return f"{self.spec.env_id}:{self.core.fingerprint()}"
        from webshop_env.client import WebShopError

        async def info() -> dict[str, Any]:
            async with self.spec.client(self.env_url or "", timeout=30.0) as client:
                return await client.info()

        try:
            return str(asyncio.run(info())["fingerprint"])
        except (WebShopError, OSError, KeyError) as error:
            raise DataError(
                f"{self.spec.env_id}: {self.env_url} does not say which data it serves: {error}"
            ) from None

    def prefetch(self, tasks: Sequence[int], split: str) -> None:
        """Reset ``tasks`` now, ``workers`` at a time, with a progress bar (SciWorld: each reset is a JVM's);
        ``row`` then uses these resets. Other environments reset in ``row`` (a few milliseconds each)."""
        if not self.spec.holds_simulator and not self.env_url:
            return
        todo = [task for task in dict.fromkeys(tasks) if task not in self._first]
        if not todo:
            return
        bar = tqdm(total=len(todo), desc=f"{self.spec.env_id} resets ({split}, {self.source})", unit="task",
                   disable=not self.progress or len(todo) < 2)  # fmt: skip  (one row's reset: no bar)
        with bar:
            if self.env_url:
                asyncio.run(self._fetch(todo, bar))
                return
            with ThreadPoolExecutor(self.workers, thread_name_prefix=f"{self.spec.env_id}-data") as pool:
                futures = {pool.submit(self._reset, task): task for task in todo}
                try:
                    for future in as_completed(futures):
                        self._first[futures[future]] = future.result()
                        bar.update()
                except BaseException:
                    for future in futures:
                        future.cancel()
                    raise

    async def _fetch(self, tasks: Sequence[int], bar: Any) -> None:
        """The service's resets of ``tasks``, ``workers`` at a time, each episode closed at once."""
        from webshop_env.client import WebShopError

        limit = asyncio.Semaphore(self.workers)

        async def one(task: int) -> None:
            async with limit:
                result = await client.reset(task)
                await client.close(result["state"])
            self._first[task] = {"observation": result["observation"], "info": dict(result.get("info") or {})}
            bar.update()

        async with self.spec.client(self.env_url or "", timeout=120.0) as client:
            try:
                await asyncio.gather(*(one(task) for task in tasks))
            except (WebShopError, OSError) as error:
                raise DataError(f"{self.spec.env_id}: a reset at {self.env_url} failed: {error}") from None

    def _reset(self, task: int) -> dict[str, Any]:
        """The core's reset of ``task`` as {observation, info}; an episode that holds a simulator is closed at
        once (its JVM freed)."""
        from webshop_env.envs.contract import EnvError

        if self.env_url:
            self.prefetch([task], "row")
            return self._first.pop(task)
        try:
            first = self.core.reset(task)
            if self.spec.holds_simulator:
                self.core.close(first.state)
        except EnvError as error:
            raise DataError(f"{self.spec.env_id}: the reset of task {task} failed: {error}") from None
        return {"observation": first.observation, "info": dict(first.info)}

    def close(self) -> None:
        """Stop the simulators this builder started (SciWorld's JVMs); the builder resets no more."""
        if self.spec.holds_simulator and self.core is not None:
            self.core.shutdown()

    def row(self, task: int, split: str, index: int) -> dict[str, Any]:
        """The row of ``task`` in ``split`` (``train``, ``val``, ``test``), at position ``index`` of its file."""
        spec = self.spec
        first = self._first.pop(task, None) or self._reset(task)
        opening = spec.first_message(first)
        instruction = instruction_line(opening)
        return {
            "data_source": spec.data_source,
            "agent_name": self.agent_name,
            "prompt": [{"role": "system", "content": spec.system_prompt}, {"role": "user", "content": opening}],
            "ability": spec.ability,
            "reward_model": {"style": "environment", "ground_truth": str(first["info"].get("goal") or instruction)},
            "extra_info": {"index": index, "env": spec.env_id, "task": task, "goal": task, "goal_set": None,
                           "split": split, "instruction": instruction,
                           "interaction_kwargs": {"name": spec.env_id, "task": task, "goal": task,
                                                  "goal_set": None, "split": split}},
        }  # fmt: skip
