"""One interface over two text environments: the original WebShop's and this project's.

``record`` plays its episode plan through a ``TextEnvAdapter`` only, so the same code path that records the
original (``OriginalAdapter``, imported from the user's own checkout, never vendored) is tested here against
this project's environment (``LocalAdapter``). The adapter also exports what pinning needs: the goal list in
the environment's order, the point price of every product and the title nouns the type reward compares.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..catalog.raw import ATTRIBUTE_FILES, HUMAN_FILE, PRODUCT_FILES, find_raw_file
from ..core.goals import GOAL_SETS


class AdapterError(RuntimeError):
    """The environment behind an adapter cannot be loaded or driven (a setup problem, with what to do)."""


@dataclass(frozen=True)
class EnvStep:
    """What a text environment shows after reset or a step, in the trace format's terms."""

    observation: str
    available_actions: dict[str, Any]
    reward: float = 0.0
    done: bool = False
    verbose_info: dict[str, Any] | None = field(default=None)


class TextEnvAdapter(Protocol):
    """A WebShop text environment with one open episode at a time."""

    name: str

    def goal_sets(self) -> list[str]: ...

    def goals(self, goal_set: str) -> list[dict[str, Any]]:
        """The goal list in the environment's order, each goal as the original holds it."""
        ...

    def product_prices(self) -> dict[str, float]:
        """asin -> the point price the reward compares with a goal's ceiling, in product order."""
        ...

    def title_nouns(self) -> dict[str, list[str]]:
        """asin -> lower-cased NOUN/PROPN tokens of the title, in order with repeats."""
        ...

    def reset(self, goal_set: str, goal: int) -> EnvStep: ...

    def step(self, action: str) -> EnvStep: ...

    def close(self) -> None: ...


# ---- this project -------------------------------------------------------------------------------------------
class LocalAdapter:
    """This project's stateless ``WebShopEnv`` behind the adapter interface (keeps the state token itself)."""

    def __init__(self, catalog_dir: Path) -> None:
        from ..catalog.store import open_catalog
        from ..core.env import WebShopEnv

        self.catalog = open_catalog(catalog_dir)
        self.env = WebShopEnv(self.catalog)
        self.name = f"agent-envs catalog {catalog_dir} ({self.catalog.manifest.get('fingerprint', '?')})"
        self._state: Any = None

    def goal_sets(self) -> list[str]:
        return [s for s in GOAL_SETS if s in self.catalog.goal_sets and self.catalog.goal_count(s)]

    def goals(self, goal_set: str) -> list[dict[str, Any]]:
        return [
            goal_as_original(self.catalog.goal(goal_set, i)) for i in range(self.catalog.goal_count(goal_set))
        ]

    def product_prices(self) -> dict[str, float]:
        return {p.asin: p.price for p in self._products()}

    def title_nouns(self) -> dict[str, list[str]]:
        return {p.asin: list(p.title_nouns) for p in self._products()}

    def _products(self) -> Iterator[Any]:
        for index in range(self.catalog.product_count):
            yield self.catalog.product(index)

    def reset(self, goal_set: str, goal: int) -> EnvStep:
        step = self.env.reset(goal, goal_set=goal_set)
        self._state = step.state
        return EnvStep(step.observation, step.available_actions)

    def step(self, action: str) -> EnvStep:
        step = self.env.step(self._state, action)
        self._state = step.state
        return EnvStep(
            step.observation, step.available_actions, step.reward, step.done, step.info.get("reward_info")
        )

    def close(self) -> None:
        self._state = None


def goal_as_original(goal: Any) -> dict[str, Any]:
    """A prepared goal record in the original's goal-dict shape (the fixtures' goals.json)."""
    return {
        "asin": goal.asin,
        "category": goal.category,
        "query": goal.query,
        "name": goal.name,
        "product_category": goal.product_category,
        "instruction_text": goal.instruction_text,
        "attributes": list(goal.attributes),
        "price_upper": goal.price_upper,
        "goal_options": goal.goal_options,
        "weight": goal.weight,
    }


# ---- the original WebShop, from the user's checkout ---------------------------------------------------------
# Where the original's search index for each ``num_products`` lives, relative to its checkout (its
# ``init_search_engine`` picks one of these; any other value is not supported by the original).
ORIGINAL_INDEXES = {None: "indexes", 100: "indexes_100", 1000: "indexes_1k", 100000: "indexes_100k"}
NOUN_TAGS = ("PNOUN", "NOUN", "PROPN")  # the original's filter ("PNOUN" is not a real tag; kept as it does)


@contextlib.contextmanager
def _working_directory(path: Path) -> Iterator[None]:
    previous = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


class OriginalAdapter:
    """The original ``WebAgentTextEnv`` (text observation mode) from a local checkout of princeton-nlp/WebShop.

    The checkout's own dependencies (gym, Flask, bs4, pyserini + Java, spaCy + its model, thefuzz) must be
    installed in the running interpreter, and its search index must have been built from the same raw files
    (tests/fixtures/conformance/README.md gives the steps). The original reads its data paths from module
    constants of ``web_agent_site.utils``; they are pointed at ``raw_dir`` before its engine is imported.
    ``seed`` seeds Python's global ``random`` right before each environment is built, which makes the
    original's otherwise unseeded range prices and goal price ceilings reproducible run to run.
    """

    def __init__(
        self,
        original: Path,
        raw_dir: Path,
        *,
        num_products: int | None = 1000,
        seed: int = 1234,
        goal_sets: tuple[str, ...] = GOAL_SETS,
    ) -> None:
        self.root = Path(original).resolve()
        self.raw_dir = Path(raw_dir).resolve()
        self.seed = seed
        if num_products not in ORIGINAL_INDEXES:
            raise AdapterError(f"the original supports num_products in {sorted(map(str, ORIGINAL_INDEXES))}")
        self.num_products = num_products
        package = self.root / "web_agent_site"
        if not (package / "envs").is_dir():
            raise AdapterError(f"{self.root} is not a WebShop checkout (no web_agent_site/envs)")
        index = self.root / "search_engine" / ORIGINAL_INDEXES[num_products]
        if not index.is_dir():
            raise AdapterError(
                f"no search index at {index}: build it from {self.raw_dir} first "
                "(tests/fixtures/conformance/README.md, 'Re-recording')"
            )
        self._paths = _raw_paths(self.raw_dir)
        self._envs: dict[str, Any] = {}
        self._current: Any = None
        with _working_directory(self.root):
            self._import()
            for goal_set in goal_sets:
                random.seed(seed)
                self._envs[goal_set] = self._text_env(
                    observation_mode="text",
                    file_path=str(self._paths["product"]),
                    num_products=num_products,
                    human_goals=goal_set == "human",
                )
        commit = _git_head(self.root)
        self.name = f"original WebShop {self.root} ({commit})"

    def _import(self) -> None:
        if str(self.root) not in sys.path:
            sys.path.insert(0, str(self.root))
        try:
            import web_agent_site.utils as utils
        except ImportError as error:
            raise AdapterError(
                f"cannot import the original's web_agent_site from {self.root}: {error}"
            ) from None
        utils.DEFAULT_FILE_PATH = str(self._paths["product"])
        utils.DEFAULT_ATTR_PATH = str(self._paths["attributes"])
        utils.HUMAN_ATTR_PATH = str(self._paths["human"])
        try:
            from web_agent_site.engine import goal as goal_module
            from web_agent_site.envs import WebAgentTextEnv
        except ImportError as error:
            raise AdapterError(f"the original's dependencies are not all installed: {error}") from None
        self._text_env = WebAgentTextEnv
        self._nlp = goal_module.nlp

    def _server(self, goal_set: str) -> Any:
        return self._envs[goal_set].server

    def goal_sets(self) -> list[str]:
        return list(self._envs)

    def goals(self, goal_set: str) -> list[dict[str, Any]]:
        keys = ("asin", "category", "query", "name", "product_category", "instruction_text", "attributes")
        rest = ("price_upper", "goal_options", "weight")
        return [{k: goal[k] for k in (*keys, *rest)} for goal in self._server(goal_set).goals]

    def product_prices(self) -> dict[str, float]:
        return dict(self._server(next(iter(self._envs))).product_prices)

    def title_nouns(self) -> dict[str, list[str]]:
        products = self._server(next(iter(self._envs))).all_products
        return {
            p["asin"]: [t.text.lower() for t in self._nlp(p["Title"]) if t.pos_ in NOUN_TAGS]
            for p in products
        }

    def reset(self, goal_set: str, goal: int) -> EnvStep:
        self._current = self._envs[goal_set]
        with _working_directory(self.root):
            observation, _ = self._current.reset(session=goal)
            return EnvStep(observation, self._current.get_available_actions())

    def step(self, action: str) -> EnvStep:
        env = self._current
        with _working_directory(self.root):
            observation, reward, done, _ = env.step(action)
            available = env.get_available_actions()
        verbose = None
        if done:
            verbose = env.server.user_sessions.get(env.session, {}).get("verbose_info")
        return EnvStep(observation, available, reward, done, verbose)

    def close(self) -> None:
        self._envs.clear()


def _raw_paths(raw_dir: Path) -> dict[str, Path]:
    paths = {
        "product": find_raw_file(raw_dir, PRODUCT_FILES),
        "attributes": find_raw_file(raw_dir, ATTRIBUTE_FILES),
        "human": find_raw_file(raw_dir, (HUMAN_FILE,)),
    }
    missing = [name for name, path in paths.items() if path is None or not path.exists()]
    if missing:
        raise AdapterError(f"{raw_dir} lacks the raw {', '.join(missing)} file(s) (items_shuffle*.json etc.)")
    return paths  # type: ignore[return-value]


def _git_head(root: Path) -> str:
    head = root / ".git" / "HEAD"
    try:
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            return (root / ".git" / ref[5:]).read_text().strip()[:7]
        return ref[:7]
    except OSError:
        return "unknown commit"
