"""``agent-envs bench-envs --agentgym ENV=URL``: this project beside AgentGym's own servers, in one run.

Per environment, three servers get the same AgentGym client requests (``/create`` once per client, then per
episode ``/reset`` and ``/step`` after ``/step``, ``/close`` at the end), with the same actions:

- **ours, one process**: ``agent-envs serve --workers 1`` serving that environment alone, its AgentGym
  sessions in the process (no Redis, no balancer): one process against AgentGym's one process;
- **ours, deployed**: ``make up-local``'s topology (``cluster.up``: nginx, ``--replicas`` replicas of
  ``--workers`` workers, the Redis session store with its default persistence), through the balancer;
- **AgentGym**: the server ``--agentgym ENV=URL`` names (AgentGym's own code, unmodified, one process:
  ``scripts/agentgym_servers.sh`` starts them).

Why the figures can be trusted on a shared machine: the three are measured in **interleaved rounds** (each
round plays the same episodes against each server in turn, the order rotated every round, so that load from
elsewhere falls on all three alike); each client count starts with an untimed **warm-up** batch per server
(other tasks: code paths, caches and connections warmed, not the measured episodes' levels); every round draws
**new tasks**, so a server's cache of reset levels cannot serve the measured resets from an earlier round; the
load generator is a lean HTTP/1.1 client (``calibrate.exchange``) so that it takes as little of the shared
cores as it can, opening a connection per request as AgentGym's client does (``requests.post``; with
``--keep-alive``, one kept-alive connection per client); and **every failed call is counted** (a status other than 200,
a body that is not JSON or answers ``{"error": ...}``, a dropped connection), warm-up included, and shown: a
row with errors is not a measurement.

The actions come from this project's core in process, before any timing: BabyAI a seeded random walk over the
listed actions (20 rounds, AgentGym-RL's), TextCraft the expert's plan with ``inventory`` after each action
(30 rounds), SciWorld the first 20 actions of the gold path. Our BabyAI answers exactly as AgentGym's does, so
its episodes end at the same step on both; TextCraft's and SciWorld's originals are not deterministic in some
texts (docs/deviations.md), and an episode ends where a server says ``done``, so step counts may differ a little.

``steps/s`` is steps answered over the rounds' wall time (each round's resets included: a reset stalls its
client); p50/p99 are over every measured step (and reset) of every round; ``× AgentGym`` divides a server's
steps/s by AgentGym's in the same run, over all rounds, and (in brackets) round by round: the median, least
and greatest of the rounds' ratios, each from runs minutes apart at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from ..calibrate import exchange
from . import registry

ONE = "ours, one process"
DEPLOYED = "ours, deployed"
AGENTGYM = "AgentGym"
ROUNDS = {"textcraft": 30, "babyai": 20, "sciworld": 20}  # AgentGym-RL's max_rounds per environment
SCIWORLD_TASKS = 4
CREATE_BODY = {"textcraft": {"minecraft_dir": "agentenv_textcraft/", "commands": None, "goal": None}}


# ---- the episodes ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Episode:
    task: int
    actions: tuple[str, ...]


def make_episodes(env_id: str, count: int, rng: random.Random) -> list[Episode]:
    """``count`` episodes, each with the actions every server will be sent (see the module doc)."""
    env = registry.make(env_id)
    rounds = ROUNDS.get(env_id, 20)
    if env_id == "sciworld":
        # A gold path costs a JVM of its own, and no server keeps anything per SciWorld task: the episodes
        # cycle over a few tasks drawn once (the others draw a new task for every episode).
        few: list[Episode] = []
        while len(few) < SCIWORLD_TASKS:
            task = rng.randrange(env.task_count())
            plan = env.expert(task)
            if plan:
                few.append(Episode(task, tuple(plan)[:rounds]))
        return [few[n % len(few)] for n in range(count)]
    out: list[Episode] = []
    while len(out) < count:
        task = rng.randrange(env.task_count())
        if env_id == "babyai":
            transition = env.reset(task)
            actions: list[str] = []
            while len(actions) < rounds and not transition.done:
                actions.append(rng.choice(transition.info["available_actions"]))
                transition = env.step(transition.state, actions[-1])
        elif env_id == "textcraft":  # the expert's plan, with "inventory" after each action
            actions = [a for action in env.expert(task) for a in (action, "inventory")][:rounds]
        else:  # an environment added later: its expert's plan
            actions = list(env.expert(task) or ())[:rounds]
        out.append(Episode(task, tuple(actions)))
    return out


# ---- the load generator ------------------------------------------------------------------------------------
class CallFailed(Exception):
    """A call that did not answer as AgentGym's client needs: it counts as an error."""


@dataclass
class Tally:
    """What one server did over the measured rounds (and how many calls failed, warm-up included)."""

    steps: list[float] = field(default_factory=list)
    resets: list[float] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)
    round_steps: list[int] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, reason: str) -> None:
        self.errors[reason] = self.errors.get(reason, 0) + 1


class Client:
    """One AgentGym client: its own keep-alive connection and the session it created."""

    def __init__(self, base: str, keep_alive: bool = False) -> None:
        parts = urlsplit(base)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.keep_alive = keep_alive
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.session: int | None = None

    async def call(self, path: str, body: Any = None) -> Any:
        """POST as AgentGym's client does (JSON body, none for BabyAI's and SciWorld's /create)."""
        payload = b"" if body is None else orjson.dumps(body)
        head = f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
        if body is not None:
            head += "Content-Type: application/json\r\n"
        if not self.keep_alive:
            head += "Connection: close\r\n"
        request = f"{head}Content-Length: {len(payload)}\r\n\r\n".encode() + payload
        try:
            if self.writer is None:
                self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            assert self.reader is not None
            status, raw = await exchange(self.reader, self.writer, request)
        except (OSError, asyncio.IncompleteReadError, ValueError) as error:
            self.close_connection()
            raise CallFailed(f"{path}: connection ({type(error).__name__})") from None
        if not self.keep_alive:
            self.close_connection()
        if status != 200:
            raise CallFailed(f"{path}: status {status}")
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise CallFailed(f"{path}: not JSON") from None
        if isinstance(data, dict) and "error" in data:
            raise CallFailed(f"{path}: error answer")
        return data

    def close_connection(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def create(self, env_id: str) -> None:
        created = await self.call("/create", CREATE_BODY.get(env_id))
        self.session = created["id"] if isinstance(created, dict) else int(created)

    async def play(self, episode: Episode, tally: Tally | None) -> int:
        """One episode: its reset and steps until the plan ends or the server says done; the steps answered."""
        t = time.perf_counter()
        await self.call("/reset", {"data_idx": episode.task, "id": self.session})
        if tally is not None:
            tally.resets.append(time.perf_counter() - t)
        done = 0
        for action in episode.actions:
            t = time.perf_counter()
            answer = await self.call("/step", {"action": action, "id": self.session})
            if tally is not None:
                tally.steps.append(time.perf_counter() - t)
            done += 1
            if answer.get("done"):
                break
        return done


async def run_batch(
    clients: Sequence[Client], episodes: Sequence[Episode], tally: Tally, measure: bool
) -> None:
    """The episodes shared out among the clients, each taking the next one when it is free. Kept-alive
    connections start afresh: a server closes one left idle while the others were measured (uvicorn after
    5 s), and a request sent into that close would count as an error that no AgentGym client meets."""
    for client in clients:
        client.close_connection()
    queue = deque(episodes)
    answered = 0

    async def worker(client: Client) -> None:
        nonlocal answered
        while queue:
            episode = queue.popleft()
            try:
                steps = await client.play(episode, tally if measure else None)
            except CallFailed as failure:
                tally.error(str(failure))
            else:
                answered += (
                    steps  # after the await: ``answered += await ...`` would lose other clients' steps
                )

    started = time.perf_counter()
    await asyncio.gather(*(worker(client) for client in clients))
    if measure:
        tally.walls.append(time.perf_counter() - started)
        tally.round_steps.append(answered)


async def interleaved(
    env_id: str,
    targets: dict[str, str],
    clients: int,
    warmup: list[Episode],
    rounds: list[list[Episode]],
    keep_alive: bool = False,
) -> dict[str, Tally]:
    """Warm-up, then the rounds, each against every server in turn (the order rotated every round)."""
    names = list(targets)
    tallies = {name: Tally() for name in names}
    sessions = {name: [Client(base, keep_alive) for _ in range(clients)] for name, base in targets.items()}
    try:
        for name in names:
            for client in sessions[name]:
                try:
                    await client.create(env_id)
                except CallFailed as failure:
                    tallies[name].error(str(failure))
            await run_batch(sessions[name], warmup, tallies[name], measure=False)
        for number, episodes in enumerate(rounds):
            for name in names[number % len(names) :] + names[: number % len(names)]:
                await run_batch(sessions[name], episodes, tallies[name], measure=True)
    finally:
        for name in names:
            for client in sessions[name]:
                if client.session is not None:
                    try:
                        await client.call("/close", {"id": client.session})
                    except CallFailed as failure:
                        tallies[name].error(str(failure))
                client.close_connection()
    return tallies


# ---- the servers -------------------------------------------------------------------------------------------
def start_one_process(env_id: str, run_dir: Path) -> tuple[subprocess.Popen, str]:
    """``agent-envs serve --workers 1`` serving ``env_id`` alone, sessions in the process; (process, URL)."""
    from .. import cluster

    (port,) = cluster.free_ports(1)
    env = {**os.environ, "AGENTRL_ENVS": env_id, "AGENTRL_ALLOW_EPHEMERAL_SECRET": "1"}
    env.pop("AGENTRL_REDIS_URL", None)
    log = (run_dir / f"one-process-{env_id}.log").open("wb")
    command = [sys.executable, "-m", "agent_envs.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
               "--workers", "1"]  # fmt: skip
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while cluster.http_status(url + "/readyz") != 200:
        if process.poll() is not None or time.monotonic() > deadline:
            stop_process(process)
            raise RuntimeError(f"agent-envs serve ({env_id}) did not start; see {log.name}")
        time.sleep(0.2)
    return process, url


def stop_process(process: subprocess.Popen) -> None:
    """Its whole process group (SciWorld's JVMs are its children)."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


# ---- the run -----------------------------------------------------------------------------------------------
def _ms(samples: Sequence[float], q: float) -> float | str:
    if not samples:
        return "-"
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)


def rows_of(env_id: str, clients: int, tallies: dict[str, Tally]) -> list[dict[str, Any]]:
    """One row per server; ``vs_agentgym``: its steps/s over AgentGym's in the same run."""

    def rate(tally: Tally) -> float:
        return sum(tally.round_steps) / sum(tally.walls) if tally.walls and sum(tally.walls) else 0.0

    def per_round(tally: Tally) -> list[float]:
        return [n / w if w else 0.0 for n, w in zip(tally.round_steps, tally.walls, strict=True)]

    theirs = rate(tallies[AGENTGYM]) if AGENTGYM in tallies else 0.0
    their_rounds = per_round(tallies[AGENTGYM]) if AGENTGYM in tallies else []
    rows = []
    for name, tally in tallies.items():
        rounds = per_round(tally)
        # each round's ratio pairs measurements taken minutes apart at most: less of the machine's drift
        paired = sorted(
            ours / agentgym for ours, agentgym in zip(rounds, their_rounds, strict=False) if agentgym
        )
        rows.append({
            "env": env_id, "clients": clients, "server": name, "rounds": len(tally.walls),
            "steps": sum(tally.round_steps), "errors": sum(tally.errors.values()), "error_kinds": tally.errors,
            "steps_per_s": round(rate(tally), 1),
            "round_steps_per_s": [round(min(rounds), 1), round(max(rounds), 1)] if rounds else [],
            "step": {"p50_ms": _ms(tally.steps, 0.5), "p99_ms": _ms(tally.steps, 0.99)},
            "reset": {"p50_ms": _ms(tally.resets, 0.5), "p99_ms": _ms(tally.resets, 0.99)},
            "vs_agentgym": round(rate(tally) / theirs, 2) if theirs else None,
            "vs_agentgym_rounds": (
                {"median": round(paired[len(paired) // 2], 2), "min": round(paired[0], 2),
                 "max": round(paired[-1], 2)} if paired else None
            ),
            "load": round(os.getloadavg()[0], 2),
        })  # fmt: skip
    return rows


def compare(
    env_ids: Sequence[str],
    agentgym: dict[str, str],
    clients: Sequence[int] = (1, 8),
    rounds: int = 3,
    episodes: int = 4,
    replicas: int = 2,
    workers: int = 2,
    seed: int = 0,
    url: str | None = None,
    keep_alive: bool = False,
) -> list[dict[str, Any]]:
    """Every environment of ``env_ids`` that ``agentgym`` names, at every client count; ``url``: a running
    deployment instead of the local cluster this starts (``make up-local``'s shape)."""
    from .. import cluster

    env_ids = [env_id for env_id in env_ids if env_id in agentgym]
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    run_dir = Path(tempfile.mkdtemp(prefix="bench-agentgym-"))
    started_cluster = url is None
    if url is None:
        record = cluster.up(replicas=replicas, catalog=Path("data/catalog"), base_port=0, port=0, workers=workers,
                            run_dir=run_dir / "cluster", env={"AGENTRL_ENVS": ",".join(env_ids),
                                                              "AGENTRL_ALLOW_EPHEMERAL_SECRET": "1"},
                            timeout=300, quiet=True)  # fmt: skip
        url = record["url"]
    try:
        for env_id in env_ids:
            process, single = start_one_process(env_id, run_dir)
            try:
                targets = {ONE: f"{single}/{env_id}", DEPLOYED: f"{url}/{env_id}", AGENTGYM: agentgym[env_id]}
                for count in clients:
                    warmup = make_episodes(env_id, count, rng)
                    plan = [make_episodes(env_id, count * episodes, rng) for _ in range(rounds)]
                    tallies = asyncio.run(interleaved(env_id, targets, count, warmup, plan, keep_alive))
                    rows += rows_of(env_id, count, tallies)
                    print(markdown(rows[-len(tallies) :], header=False), file=sys.stderr, flush=True)
            finally:
                stop_process(process)
    finally:
        if started_cluster:
            cluster.down(run_dir / "cluster", quiet=True)
    return rows


def markdown(rows: Sequence[dict[str, Any]], header: bool = True) -> str:
    lines = (
        ["| env | clients | server | steps | errors | steps/s (rounds: min-max) | × AgentGym (rounds: median, "
         "min-max) | step p50 / p99 ms | reset p50 / p99 ms | load |",
         "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        if header else []
    )  # fmt: skip
    for row in rows:
        spread = "-".join(str(v) for v in row["round_steps_per_s"])
        errors = str(row["errors"]) + (f" {row['error_kinds']}" if row["errors"] else "")
        paired = row.get("vs_agentgym_rounds")
        versus = f"{row['vs_agentgym']}" + (
            f" ({paired['median']}, {paired['min']}-{paired['max']})" if paired else ""
        )
        lines.append(
            f"| {row['env']} | {row['clients']} | {row['server']} | {row['steps']} | {errors} | "
            f"{row['steps_per_s']} ({spread}) | {versus} | {row['step']['p50_ms']} / "
            f"{row['step']['p99_ms']} | {row['reset']['p50_ms']} / {row['reset']['p99_ms']} | {row['load']} |"
        )
    return "\n".join(lines)
