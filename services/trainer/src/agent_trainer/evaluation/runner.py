"""``agent-train eval``: run a policy on a split's goals through the balancer, concurrently, resumably (WebShop;
``env_runner`` plays the other environments and mixes with this module's runner, outputs and resumption).

Outputs in ``--out``:
- ``trajectories.jsonl``: one JSON object per finished episode (goal, category, reward, ended_by, ...) with
  ``turns``: every step as the agent saw it (observation, available actions, model output, parsed action,
  reward, done, valid). Appended as episodes finish, so an interrupted run keeps its work;
- ``metrics.json``: ``metrics.summarize`` plus the run's identity (config, policy, seeds, catalog) and its
  completeness (``complete``, ``failed_episodes``, ``not_run``);
- ``report.html``: the self-contained report (``report_html``);
- ``eval_config.json``: what identifies the run; a rerun with the same ``--out`` resumes (finished episodes
  are skipped) only when it matches, and refuses otherwise (``--overwrite`` starts afresh).

Failure policy: an episode whose policy fails after its retries (``PolicyError``) is *not* scored; it is
listed in ``metrics.json`` and the run stops after ``max_policy_errors`` such failures (a dead endpoint would
fail them all), reporting ``complete: false``. An unreachable environment or a refused request aborts the run
with ``EvalError``; rerunning the same command resumes.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from webshop_env.client import WebShopClient, WebShopError, WebShopRequestError, WebShopUnavailable
from webshop_env.envs.webshop.catalog.fidelity import fidelity_limits

from ..actions import step_was_valid
from ..config import default_env_url, turn_tokens
from ..reward import is_success
from ..turns import TRAINING_ENV_STEPS
from .budget import training_budget
from .metrics import UNKNOWN_CATEGORY, solved, summarize
from .policies import (
    CheckpointPolicy,
    ContextLengthExceeded,
    ExpertPolicy,
    OpenAIPolicy,
    Policy,
    PolicyError,
    RandomPolicy,
    Turn,
    catalog_plans,
)

DEFAULT_URL = default_env_url()  # $WEBSHOP_URL, else the local balancer: the same default as training
TRAJECTORIES = "trajectories.jsonl"
METRICS = "metrics.json"
REPORT = "report.html"
RUN_CONFIG = "eval_config.json"


class EvalError(RuntimeError):
    """The evaluation cannot run or go on; the message says why and what to do."""


@dataclass
class PolicySpec:
    """Which policy to evaluate and its settings (what the CLI flags carry)."""

    name: str
    seed: int = 0
    base_url: str | None = None
    model: str | None = None
    api_key: str | None = None
    temperature: float = 0.1  # the guides' evaluation temperature
    top_p: float = 1.0
    max_tokens: int | None = (
        None  # new tokens per reply; None: each environment's training budget (budget.py)
    )
    request_timeout: float = 120.0
    retries: int = 5
    backoff: float = 0.5
    model_path: str | None = None
    server_port: int = 0
    server: str = "sglang"  # checkpoint: sglang, or cpu (the rehearsal's CPU chat server, for a tiny model)
    server_python: str | None = None
    server_args: list[str] = field(default_factory=list)
    startup_timeout: float = 900.0
    max_observation_chars: int = 0


@dataclass
class EvalConfig:
    """One evaluation run."""

    out: Path
    url: str = DEFAULT_URL
    split: str = "test"
    goal_set: str | None = None  # None: the server's default goal set
    max_samples: int | None = None  # None: the whole split
    tasks: tuple[int, ...] | None = None  # only these tasks of the split (other environments than WebShop)
    max_turns: int = (
        TRAINING_ENV_STEPS  # actions (env steps) per episode; training allows the same (turns.py)
    )
    concurrency: int = 32
    catalog: Path | None = None  # a local copy of the served catalog: categories and in-process expert plans
    max_policy_errors: int = 3
    overwrite: bool = False
    ready_timeout: float = 60.0
    env_timeout: float = 10.0
    env_retry_budget_s: float = 60.0
    progress: bool = True
    write_report: bool = True
    explicit_turns: bool = False  # max_turns was given (a mix then uses it for every environment)
    # every turn after the first together (replies and pages), in tokens, as verl's data.max_response_length: the
    # episode ends when a reply would pass it. None: each environment's training budget (budget.py); 0: no cap
    max_response_tokens: int | None = None


@dataclass
class EvalResult:
    metrics: dict[str, Any]
    out: Path
    complete: bool
    failures: list[dict[str, Any]]

    @property
    def metrics_path(self) -> Path:
        return self.out / METRICS

    @property
    def report_path(self) -> Path:
        return self.out / REPORT


# ---- policy construction --------------------------------------------------------------------------------
def use_budget(policy: Policy, spec: PolicySpec, env_id: str) -> None:
    """Give a chat policy ``env_id``'s per-reply budget from training (``--max-tokens`` where it was given): one
    model server plays a mix's environments one after the other, each with its own."""
    if isinstance(policy, OpenAIPolicy):
        policy.max_tokens = spec.max_tokens or training_budget(env_id).turn_tokens


def response_cap(config: EvalConfig, env_id: str) -> int:
    """Tokens of every turn after the first together that an episode of ``env_id`` may spend (0: no cap)."""
    if config.max_response_tokens is not None:
        return config.max_response_tokens
    return training_budget(env_id).response_tokens


class ResponseBudget:
    """verl's response budget in eval: the model's replies and the env's pages after the first turn, counted from the
    model server's own token counts (a request's prompt tokens less the first request's, plus its new tokens).
    ``exceeded(usage)`` is true once a reply would go past it: training would have cut that reply and ended."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.first_prompt: int | None = None
        self.spent = 0

    def exceeded(self, usage: dict[str, int]) -> bool:
        if self.cap <= 0 or "prompt_tokens" not in usage:  # no cap, or a policy without token counts
            return False
        if self.first_prompt is None:
            self.first_prompt = usage["prompt_tokens"]
        self.spent = usage["prompt_tokens"] - self.first_prompt + usage.get("completion_tokens", 0)
        return self.spent > self.cap

    def note(self) -> str:
        return f"the response budget of {self.cap} tokens is spent ({self.spent}: training would have ended here)"


def build_policy(spec: PolicySpec, client: WebShopClient, catalog: Any | None, out: Path) -> Policy:
    """The ``Policy`` of ``spec``; the expert takes its plans from ``catalog`` when given, else the server."""
    if spec.name == "expert":
        if catalog is not None:
            return ExpertPolicy(catalog_plans(catalog), source="catalog")

        async def server_plans(goal: int, goal_set: str) -> list[str]:
            return await client.expert(goal, goal_set=goal_set)

        return ExpertPolicy(server_plans, source="server")
    if spec.name == "random":
        return RandomPolicy(seed=spec.seed)
    chat: dict[str, Any] = {
        "api_key": spec.api_key,
        "temperature": spec.temperature,
        "top_p": spec.top_p,
        "max_tokens": spec.max_tokens or turn_tokens(),
        "timeout": spec.request_timeout,
        "retries": spec.retries,
        "backoff": spec.backoff,
        "seed": spec.seed,
        "max_observation_chars": spec.max_observation_chars,
    }
    if spec.name == "openai":
        return OpenAIPolicy(base_url=spec.base_url or "", model=spec.model or "", **chat)
    if spec.name == "checkpoint":
        if not spec.model_path:
            raise EvalError("the checkpoint policy needs --model-path (MODEL_PATH=... for `make eval`)")
        return CheckpointPolicy(
            spec.model_path,
            port=spec.server_port,
            python=spec.server_python,
            startup_timeout=spec.startup_timeout,
            server_args=spec.server_args,
            log_path=out / f"{spec.server}_server.log",
            server=spec.server,
            **chat,
        )
    raise EvalError(f"unknown policy {spec.name!r}; expected expert, random, openai or checkpoint")


# ---- the run ----------------------------------------------------------------------------------------------
def evaluate(config: EvalConfig, spec: PolicySpec) -> EvalResult:
    """Synchronous entry point (the CLI's)."""
    return asyncio.run(evaluate_async(config, spec))


async def evaluate_async(config: EvalConfig, spec: PolicySpec, policy: Policy | None = None) -> EvalResult:
    """Run (or resume) the evaluation and write its outputs; see the module docstring. ``policy``: one the
    caller started (a mixed evaluation shares its model server), used as it is and left open."""
    if config.max_turns < 1:
        raise EvalError("--max-turns must be at least 1")
    if config.concurrency < 1:
        raise EvalError("--concurrency must be at least 1")
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    client = WebShopClient(
        config.url,
        timeout=config.env_timeout,
        retry_budget=config.env_retry_budget_s,
        max_connections=max(16, 2 * config.concurrency),
    )
    try:
        try:
            await client.wait_until_ready(config.ready_timeout)
            info = await client.info()
            summary = await client.goals(goal_set=config.goal_set, split=config.split)
        except WebShopRequestError as error:
            raise EvalError(f"the environment refused the run's set-up: {error}") from error
        except WebShopError as error:
            raise EvalError(str(error)) from error
        goal_set = config.goal_set or summary["default_goal_set"]
        if goal_set not in summary["goal_sets"]:
            raise EvalError(f"the server has no goal set {goal_set!r}: it has {', '.join(info['goal_sets'])}")
        split = summary["goal_sets"][goal_set]["splits"][config.split]
        goals = list(range(split["start"], split["stop"]))
        if config.max_samples is not None:
            goals = goals[: max(0, config.max_samples)]
        if not goals:
            raise EvalError(f"the {config.split} split of the {goal_set} goals is empty on this server")

        catalog = _open_catalog(config.catalog, info["fingerprint"]) if config.catalog else None
        owned = policy is None
        if policy is None:
            policy = build_policy(spec, client, catalog, out)
        use_budget(policy, spec, "webshop")
        identity = {
            "policy": _identity(policy.describe()),
            "split": config.split,
            "goal_set": goal_set,
            "max_turns": config.max_turns,
            "catalog_fingerprint": info["fingerprint"],
        }
        done = _prepare_out_dir(out, identity, config.overwrite)
        done = {key: record for key, record in done.items() if record["goal"] in set(goals)}
        todo = [goal for goal in goals if _key(goal_set, goal) not in done]
        runner = _Runner(config, client, policy, goal_set, catalog)
        failures: list[dict[str, Any]] = []
        if todo:
            if owned:
                await policy.start()
            try:
                failures = await runner.run(todo, out / TRAJECTORIES, already=len(done), total=len(goals))
            finally:
                if owned:
                    await policy.close()
        records = {**done, **{_key(goal_set, r["goal"]): r for r in runner.finished}}
    finally:
        await client.aclose()

    ordered = sorted(records.values(), key=lambda r: r["goal"])
    not_run = len(goals) - len(ordered) - len(failures)
    metrics = summarize(ordered, bootstrap_seed=spec.seed)
    metrics.update(
        complete=not failures and not_run == 0,
        requested_episodes=len(goals),
        resumed_episodes=len(done),
        failed_episodes=failures,
        not_run=not_run,
        policy=policy.describe(),
        seeds={
            "seed": spec.seed,
            "random_policy": f"Random('{spec.seed}:<goal_set>:<goal>')",
            "sampling": spec.seed if spec.name in ("openai", "checkpoint") else None,
            "bootstrap": spec.seed,
        },
        config={**_jsonable(asdict(config)), "goal_set": goal_set, "goals": [goals[0], goals[-1]]},
        catalog={
            "fingerprint": info["fingerprint"],
            "products": info.get("products"),
            "version": info.get("version"),
            "categories_from": _category_source(ordered, catalog is not None),
            # the reward's definition on this catalog (noun extractor, seeded or pinned prices and ceilings)
            "fidelity": fidelity_limits(info.get("catalog") or {}),
        },
        wall_s=round(time.monotonic() - started, 3),
        created_unix=int(time.time()),
    )
    if isinstance(policy, OpenAIPolicy):
        metrics["endpoint"] = {"requests": policy.requests, "retried": policy.retried}
    (out / METRICS).write_text(json.dumps(metrics, indent=2) + "\n")
    if config.write_report:
        from .report_html import write_report

        write_report(out / REPORT, metrics, ordered)
    return EvalResult(metrics=metrics, out=out, complete=bool(metrics["complete"]), failures=failures)


class _Runner:
    """Runs episodes with bounded concurrency; collects finished records and policy failures."""

    def __init__(
        self, config: EvalConfig, client: WebShopClient, policy: Policy, goal_set: str, catalog: Any | None
    ) -> None:
        self.config = config
        self.client = client
        self.policy = policy
        self.goal_set = goal_set
        self.catalog = catalog
        self.finished: list[dict[str, Any]] = []

    async def run(self, goals: list[int], path: Path, already: int, total: int) -> list[dict[str, Any]]:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for goal in goals:
            queue.put_nowait(goal)
        failures: list[dict[str, Any]] = []
        stop = asyncio.Event()
        bar = _Progress(total, already, self.config.progress, self.policy.name)
        fatal: list[BaseException] = []

        with open(path, "a", encoding="utf-8") as sink:

            async def worker() -> None:
                while not stop.is_set():
                    try:
                        goal = queue.get_nowait()
                    except asyncio.QueueEmpty:
                        return
                    try:
                        record = await self.episode(goal)
                    except PolicyError as error:
                        failures.append({"goal": goal, "goal_set": self.goal_set, "error": str(error)})
                        if len(failures) >= self.config.max_policy_errors:
                            stop.set()
                        continue
                    except (WebShopError, EvalError) as error:
                        fatal.append(error)
                        stop.set()
                        return
                    sink.write(json.dumps(record, ensure_ascii=False) + "\n")
                    sink.flush()
                    self.finished.append(record)
                    bar.update(record)

            workers = [asyncio.create_task(worker()) for _ in range(min(self.config.concurrency, len(goals)))]
            try:
                await asyncio.gather(*workers)
            finally:
                for task in workers:
                    task.cancel()
                bar.close()
        if fatal:
            error = fatal[0]
            kept = already + len(self.finished)
            if isinstance(error, WebShopRequestError):
                raise EvalError(
                    f"the environment refused a request: {error} ({kept} episodes kept)"
                ) from error
            if isinstance(error, WebShopUnavailable):
                raise EvalError(
                    f"the environment became unreachable: {error}. {kept} finished episodes are kept in "
                    f"{path}; rerun the same command to resume"
                ) from error
            raise EvalError(str(error)) from error
        return failures

    def category(self, goal: int, info: dict[str, Any]) -> str:
        if info.get("category"):
            return str(info["category"])
        if self.catalog is not None:
            return str(self.catalog.goal(self.goal_set, goal).category or UNKNOWN_CATEGORY)
        return UNKNOWN_CATEGORY

    async def episode(self, goal: int) -> dict[str, Any]:
        """Play one episode; the record that goes into ``trajectories.jsonl``."""
        started = time.monotonic()
        first = await self.client.reset(goal, goal_set=self.goal_set, split=self.config.split)
        instruction = first["instruction"]
        turn = Turn(goal, self.goal_set, instruction, first["observation"], first["available_actions"], 0)
        agent = await self.policy.begin(turn)
        state = first["state"]
        steps: list[dict[str, Any]] = []
        usage: dict[str, int] = {}
        reward, ended_by, final_info, note = 0.0, "max_turns", {}, ""
        invalid = unparsed = 0
        spent = ResponseBudget(response_cap(self.config, "webshop"))
        for index in range(self.config.max_turns):
            turn = Turn(goal, self.goal_set, instruction, turn.observation, turn.available_actions, index)
            try:
                decision = await agent.act(turn)
            except ContextLengthExceeded as error:
                ended_by, note = "context_length", str(error)
                break
            for name, value in decision.usage.items():
                usage[name] = usage.get(name, 0) + value
            if decision.stop:
                ended_by = "policy_stopped"
                break
            if spent.exceeded(decision.usage):
                ended_by, note = "response_budget", spent.note()
                break
            unparsed += decision.action is None
            result = await self.client.step(state, decision.env_action)
            state = result["state"]
            valid = step_was_valid(decision.action, result["info"])
            invalid += not valid
            steps.append(
                {
                    "observation": turn.observation,
                    "available_actions": turn.available_actions,
                    "output": decision.output,
                    "action": decision.action,
                    "reward": float(result["reward"]),
                    "done": bool(result["done"]),
                    "valid": valid,
                }
            )
            if result["done"]:
                reward, final_info = float(result["reward"]), result["info"]
                ended_by = "server_truncated" if result["info"].get("truncated") else "purchase"
                break
            turn = Turn(
                goal,
                self.goal_set,
                instruction,
                result["observation"],
                result["available_actions"],
                index + 1,
            )
            agent.observe(turn, decision, valid)
        record: dict[str, Any] = {
            "goal": goal,
            "goal_set": self.goal_set,
            "split": self.config.split,
            "category": self.category(goal, first.get("info", {})),
            "instruction": instruction,
            "policy": self.policy.name,
            "reward": reward,
            "success": is_success(reward),
            "steps": len(steps),
            "invalid_actions": invalid,
            "unparsed_outputs": unparsed,
            "truncated": ended_by in ("max_turns", "server_truncated", "response_budget"),
            "ended_by": ended_by,
            "reward_info": final_info.get("reward_info"),
            "elapsed_s": round(time.monotonic() - started, 4),
        }
        if usage:
            record["usage"] = usage
        if note:
            record["note"] = note
        record["turns"] = steps
        return record


# ---- helpers ----------------------------------------------------------------------------------------------
def _key(goal_set: str, goal: int) -> str:
    return f"{goal_set}:{goal}"


_VOLATILE = {"base_url", "retries", "timeout_s", "server_args"}


def _identity(description: dict[str, Any]) -> dict[str, Any]:
    """The parts of a policy description that change what episodes mean (not where the server runs)."""
    return {k: v for k, v in description.items() if k not in _VOLATILE}


def _prepare_out_dir(out: Path, identity: dict[str, Any], overwrite: bool) -> dict[str, dict[str, Any]]:
    """Finished episodes to keep (by key); refuses to mix runs of different configurations."""
    config_path, trajectories = out / RUN_CONFIG, out / TRAJECTORIES
    if overwrite:
        for name in (TRAJECTORIES, METRICS, REPORT, RUN_CONFIG):
            (out / name).unlink(missing_ok=True)
    if config_path.exists():
        previous = json.loads(config_path.read_text())
        if previous != identity:
            changed = sorted(k for k in set(previous) | set(identity) if previous.get(k) != identity.get(k))
            raise EvalError(
                f"{out} holds an evaluation with a different configuration (differs in: "
                f"{', '.join(changed)}); "
                "use another --out, or --overwrite to discard it"
            )
    elif trajectories.exists() and trajectories.stat().st_size:
        raise EvalError(f"{trajectories} exists without {RUN_CONFIG}; use another --out or --overwrite")
    config_path.write_text(json.dumps(identity, indent=2) + "\n")
    done: dict[str, dict[str, Any]] = {}
    if trajectories.exists():
        valid_lines = []
        for line in trajectories.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
                done[_key(record["goal_set"], int(record["goal"]))] = record
                valid_lines.append(line)
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by an interrupted run: that episode runs again
        trajectories.write_text("".join(f"{line}\n" for line in valid_lines), encoding="utf-8")
    return done


def _category_source(records: list[dict[str, Any]], have_catalog: bool) -> str:
    """Where the episodes' categories came from (reported so an all-"unknown" breakdown explains itself)."""
    if have_catalog:
        return "catalog"
    if records and all(r.get("category") not in (None, UNKNOWN_CATEGORY) for r in records):
        return "server"
    return "unknown (pass --catalog for per-category results)"


def _open_catalog(path: Path, served_fingerprint: str) -> Any:
    from webshop_env.envs.webshop.catalog.store import open_catalog

    try:
        catalog = open_catalog(path)
    except Exception as error:
        raise EvalError(f"cannot open the catalog {path}: {error}") from error
    if catalog.fingerprint != served_fingerprint:
        raise EvalError(
            f"--catalog {path} (fingerprint {catalog.fingerprint}) is not the catalog the server serves "
            f"({served_fingerprint}); pass the served catalog or leave --catalog out"
        )
    return catalog


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


class _Progress:
    """A tqdm bar with the running score and success rate (silent when ``enabled`` is false)."""

    def __init__(self, total: int, initial: int, enabled: bool, name: str) -> None:
        self._bar: Any = None
        self._rewards: list[float] = []
        self._solved = 0
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=f"eval {name}", unit="ep", dynamic_ncols=True)

    def update(self, record: dict[str, Any]) -> None:
        self._rewards.append(record["reward"])
        self._solved += solved(record)
        if self._bar is not None:
            n = len(self._rewards)
            score = 100 * sum(self._rewards) / n
            success = self._solved / n
            self._bar.set_postfix_str(f"score {score:.1f} success {success:.2f}", refresh=False)
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
