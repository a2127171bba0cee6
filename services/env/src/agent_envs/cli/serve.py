"""``serve`` (run the HTTP service with uvicorn) and ``bench-http`` (load-test a running service).

Wired into ``agent-envs`` by ``add_commands(subparsers)`` (``cli/main.py`` imports this module, never the
other way round); without the console script, run ``python -m agent_envs.cli serve ...``.

``serve`` exports its options as ``AGENTRL_*`` variables and starts uvicorn with the app *factory* import
string, so ``--workers N`` runs N processes that each build the app (and open the catalog) themselves. It
checks the configuration and the catalog in the parent first, so a mistake stops it with one clear line
instead of N crashing workers. With several workers it also sets up Prometheus' multiprocess directory.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import itertools
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson

from ..bench import percentile

APP_FACTORY = "agent_envs.api.app:create_app"
DEFAULT_PORT = 36001
MAX_EXPERT_GOALS = 500


def add_commands(subparsers: Any) -> None:
    """Add ``serve`` and ``bench-http`` to the ``agent-envs`` sub-command parser."""
    p = subparsers.add_parser("serve", help="serve the environment over HTTP (native + AgentGym endpoints)")
    p.add_argument(
        "--catalog", type=Path, default=None,
        help="prepared catalog directory (default: $WEBSHOP_CATALOG, $CATALOG_DIR or data/catalog)",
    )  # fmt: skip
    p.add_argument("--host", default=os.environ.get("AGENTRL_HOST", "127.0.0.1"), help="bind address")
    p.add_argument(
        "--envs", default=None,
        help="environments to serve, comma-separated: any registered one (webshop, textcraft, babyai, sciworld, "
        "plugins; `agent-envs envs` lists them; default: $AGENTRL_ENVS or webshop), each under /<env> (WebShop's "
        "also at the root)",
    )  # fmt: skip
    p.add_argument(
        "--placement", choices=["any", "sticky"], default=None,
        help="serve only those of the environments with this placement (their registrations'), or the default "
        "environment when none has it: a replica group of its own (compose's replicas serve --placement any)",
    )  # fmt: skip
    p.add_argument(
        "--port", type=int, default=int(os.environ.get("AGENTRL_PORT", DEFAULT_PORT)),
        help=f"port (default: $AGENTRL_PORT or {DEFAULT_PORT})",
    )  # fmt: skip
    p.add_argument(
        "--workers", type=int, default=int(os.environ.get("AGENTRL_WORKERS", 1)),
        help="worker processes (default: $AGENTRL_WORKERS or 1); AgentGym sessions need AGENTRL_REDIS_URL "
        "with more than 1",
    )  # fmt: skip
    p.add_argument(
        "--limit-concurrency", type=int, default=int(os.environ.get("AGENTRL_LIMIT_CONCURRENCY", 2048)),
        help="connections + requests per worker before it answers 503 (default: $AGENTRL_LIMIT_CONCURRENCY or 2048)",
    )  # fmt: skip
    p.add_argument(
        "--header-timeout", type=float, default=None,
        help="seconds a connection gets to send a complete request head (default: $AGENTRL_HEADER_TIMEOUT_S or 10)",
    )  # fmt: skip
    p.add_argument(
        "--max-header-bytes", type=int, default=None,
        help="largest request head in bytes (default: $AGENTRL_MAX_HEADER_BYTES or 32768)",
    )  # fmt: skip
    p.add_argument(
        "--watchdog-interval", type=float, default=float(os.environ.get("AGENTRL_WATCHDOG_INTERVAL_S", 10)),
        help="seconds between self-probes of /healthz; after $AGENTRL_WATCHDOG_FAILURES (3) unanswered probes "
        "in a row the replica exits so its supervisor restarts it (0: off; default $AGENTRL_WATCHDOG_INTERVAL_S or 10)",
    )  # fmt: skip
    p.add_argument(
        "--log-level", default=None, help="DEBUG, INFO, WARNING, ERROR (default: $AGENTRL_LOG_LEVEL)"
    )
    p.add_argument(
        "--allow-ephemeral-secret", action="store_true",
        help="without AGENTRL_STATE_SECRET, use a random secret shared by this replica's workers only",
    )  # fmt: skip
    # bench-http --calibrate serves its trivial app with exactly these server settings
    p.add_argument("--app-factory", default=APP_FACTORY, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_serve)

    p = subparsers.add_parser("bench-http", help="HTTP load test: concurrent expert episodes, one JSON line")
    p.add_argument("--url", default=None, help="balancer or replica base URL, e.g. http://127.0.0.1:36003")
    calibration = p.add_argument_group(
        "calibrated run (--calibrate): the service and a trivial app on the same local topology, one JSON object"
    )
    calibration.add_argument(
        "--calibrate", action="store_true",
        help="start the service and a trivial app (same nginx template and server settings) and load both",
    )  # fmt: skip
    calibration.add_argument("--kind", default="click", choices=["click", "search", "search-varied"])
    calibration.add_argument(
        "--catalog", type=Path, default=None, help="prepared catalog (default: data/catalog)"
    )
    calibration.add_argument("--replicas", type=int, default=2, help="replicas per cluster (default 2)")
    calibration.add_argument("--workers", type=int, default=1, help="uvicorn workers per replica (default 1)")
    calibration.add_argument(
        "--connections", type=int, default=64, help="keep-alive connections (default 64)"
    )
    calibration.add_argument(
        "--seconds", type=float, default=5.0, help="measured seconds per round (default 5)"
    )
    calibration.add_argument("--rounds", type=int, default=3, help="alternating rounds per side (default 3)")
    p.add_argument("--concurrency", type=int, default=256, help="episodes in flight at once (default 256)")
    p.add_argument("--episodes", type=int, default=1024, help="episodes to run (default 1024)")
    p.add_argument("--goal-set", default=None, help="goal set (default: the server's default)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per request attempt (default 60)")
    p.add_argument("--retries", type=int, default=5, help="retries per request (default 5)")
    p.add_argument("--json", action="store_true", help="JSON output (the only format; kept for clarity)")
    p.set_defaults(func=cmd_bench_http)


# ---- serve ----------------------------------------------------------------------------------------------
def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn
    from pydantic import ValidationError

    from ..api.logs import configure_logging
    from ..api.settings import Settings, SettingsError
    from ..deploy import start_problems

    if args.catalog is not None:
        os.environ["WEBSHOP_CATALOG"] = str(Path(args.catalog).resolve())
    if args.envs is not None:
        os.environ["AGENTRL_ENVS"] = args.envs
    if args.placement is not None:
        from .envs import placed

        try:
            os.environ["AGENTRL_ENVS"] = ",".join(placed(os.environ.get("AGENTRL_ENVS"), args.placement))
        except KeyError as error:  # an unknown environment: Settings says which below
            print(f"agent-envs serve: error: {error}", file=sys.stderr)
            return 2
    if args.log_level:
        os.environ["AGENTRL_LOG_LEVEL"] = args.log_level
    if args.allow_ephemeral_secret:
        os.environ["AGENTRL_ALLOW_EPHEMERAL_SECRET"] = "1"
    if args.header_timeout is not None:
        os.environ["AGENTRL_HEADER_TIMEOUT_S"] = str(args.header_timeout)
    if args.max_header_bytes is not None:
        os.environ["AGENTRL_MAX_HEADER_BYTES"] = str(args.max_header_bytes)
    if args.workers < 1 or args.limit_concurrency < 1 or args.watchdog_interval < 0:
        print(
            "agent-envs serve: error: --workers and --limit-concurrency must be at least 1, "
            "--watchdog-interval at least 0",
            file=sys.stderr,
        )
        return 2
    try:
        settings = Settings()
    except ValidationError as error:
        print(f"agent-envs serve: error: invalid AGENTRL_* setting:\n{error}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    # Both checks before either is reported: a newcomer with no secret and no catalog fixes both in one go.
    problems: list[str] = []
    if settings.state_secret is not None or not settings.allow_ephemeral_secret:
        try:
            settings.secret_bytes()
        except SettingsError as error:
            problems.append(str(error))
    problems.extend(start_problems(settings))
    if problems:
        print("\n".join(f"agent-envs serve: error: {problem}" for problem in problems), file=sys.stderr)
        return 2
    if settings.state_secret is None and settings.allow_ephemeral_secret:
        settings.secret_bytes()  # logs the warning once, in the parent
        os.environ["AGENTRL_STATE_SECRET"] = secrets.token_urlsafe(32)  # one secret for all workers
    if args.workers > 1:
        _multiprocess_metrics_dir()
        if not settings.redis_url:
            logging.getLogger("agent_envs.api").warning(
                "%d workers and no AGENTRL_REDIS_URL: the native /v1 protocol is served by any worker, but "
                "AgentGym-compatible sessions (/create, /reset, /step, ...) then live in one worker process "
                "each and fail on the others; set AGENTRL_REDIS_URL (make up-local and compose do)",
                args.workers,
            )
    from ..api.http_limits import LimitedHttpToolsProtocol

    if args.watchdog_interval > 0:
        start_watchdog(args.host, args.port, args.watchdog_interval)
    if args.workers > 1:
        patient_worker_supervision()
    uvicorn.run(
        args.app_factory,
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_config=None,  # configure_logging already routes uvicorn's loggers
        access_log=False,  # one structured line per request comes from the app
        timeout_keep_alive=75,  # longer than the balancer's upstream keepalive_timeout (no reuse races)
        http=LimitedHttpToolsProtocol,  # header timeout and size limit, JSON errors (api/http_limits.py)
        limit_concurrency=args.limit_concurrency,
        timeout_graceful_shutdown=10,
    )
    return 0


#: How long uvicorn's supervisor waits for a worker's answer to its liveness ping (uvicorn 0.34: 5 s) before it
#: kills and restarts the worker (AGENTRL_WORKER_PING_TIMEOUT_S).
WORKER_PING_TIMEOUT_S = 30.0


def patient_worker_supervision() -> None:
    """Give uvicorn's worker supervisor AGENTRL_WORKER_PING_TIMEOUT_S (default 30 s) instead of its 5 s.

    Why: the supervisor pings every worker every half second, and a worker answers only once its interpreter has
    started and imported uvicorn; on a loaded machine (load average 30 on 2 cores) a worker takes longer than 5 s
    to get there, is killed and restarted, over and over, and the replica never becomes healthy (seen with
    compose). A worker that really hangs is still caught, later, and the replica's own watchdog
    (``start_watchdog``) probes the service end to end."""
    from uvicorn.supervisors import multiprocess

    from ._worker_supervision import PatientProcess

    PatientProcess.ping_timeout_s = float(
        os.environ.get("AGENTRL_WORKER_PING_TIMEOUT_S", WORKER_PING_TIMEOUT_S)
    )
    multiprocess.Process = (
        PatientProcess  # Multiprocess looks the name up when it starts or restarts a worker
    )


def start_watchdog(host: str, port: int, interval: float) -> threading.Thread:
    """Probe this replica's own ``/healthz``; exit after ``AGENTRL_WATCHDOG_FAILURES`` misses in a row.

    Why: a replica that hangs (a stuck worker, a deadlock) still holds its port, so nothing restarts it;
    compose restarts a container only when its process exits. The probe runs in a thread of the uvicorn
    parent, starts once the replica first answered, and on failure kills the worker processes and exits
    with status 70, so the supervisor (compose's ``restart: unless-stopped``) starts a fresh replica.
    """
    failures_allowed = max(1, int(os.environ.get("AGENTRL_WATCHDOG_FAILURES", 3)))
    probe_host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    url = f"http://{probe_host}:{port}/healthz"
    log = logging.getLogger("agent_envs.api")

    def probe() -> bool:
        """True when the server answered at all: any HTTP status proves its event loop runs.

        A busy replica may answer 503 (``--limit-concurrency`` reached, or not ready while it drains); that is
        load, not a hang, and killing it would only move the load to the other replicas and lose requests.
        """
        try:
            with urllib.request.urlopen(url, timeout=min(5.0, interval)) as response:
                return response.status > 0
        except urllib.error.HTTPError:
            return True
        except Exception:
            return False

    def watch() -> None:
        while not probe():  # start-up: wait until the replica answered once
            time.sleep(1.0)
        misses = 0
        while True:
            time.sleep(interval)
            misses = 0 if probe() else misses + 1
            if misses >= failures_allowed:
                log.error(
                    "watchdog: %s did not answer %d probes in a row; exiting so the supervisor restarts "
                    "this replica", url, misses,
                )  # fmt: skip
                _kill_children()
                os._exit(70)

    thread = threading.Thread(target=watch, name="webshop-watchdog", daemon=True)
    thread.start()
    return thread


def _kill_children() -> None:
    """SIGKILL this process's children (the uvicorn workers), found through /proc."""
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == me:
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            continue


def _multiprocess_metrics_dir() -> None:
    """Point PROMETHEUS_MULTIPROC_DIR at an empty directory shared by the workers (before they start)."""
    existing = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if existing:
        directory = Path(existing)
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob("*.db"):
            stale.unlink()
        return
    directory = Path(tempfile.mkdtemp(prefix="webshop-prometheus-"))
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    atexit.register(shutil.rmtree, directory, True)


# ---- bench-http -----------------------------------------------------------------------------------------
def cmd_bench_http(args: argparse.Namespace) -> int:
    if args.calibrate:
        return _cmd_calibrate(args)
    if not args.url:
        print("agent-envs bench-http: error: give --url, or --calibrate", file=sys.stderr)
        return 2
    result = asyncio.run(
        bench_http(
            args.url, concurrency=args.concurrency, episodes=args.episodes, goal_set=args.goal_set,
            timeout=args.timeout, retries=args.retries,
        )
    )  # fmt: skip
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    sys.stdout.flush()
    return 0 if result["errors"] == 0 else 1


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from ..calibrate import calibrate
    from ..settings import default_catalog_dir

    if args.url:
        print(
            "agent-envs bench-http: error: --calibrate starts its own clusters; drop --url", file=sys.stderr
        )
        return 2
    if min(args.replicas, args.workers, args.connections, args.rounds) < 1 or args.seconds <= 0:
        print(
            "agent-envs bench-http: error: counts must be at least 1 and --seconds positive", file=sys.stderr
        )
        return 2
    result = calibrate(
        args.catalog or default_catalog_dir(), kind=args.kind, replicas=args.replicas, workers=args.workers,
        connections=args.connections, seconds=args.seconds, rounds=args.rounds,
    )  # fmt: skip
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    sys.stdout.flush()
    return 0 if result["calibration"]["errors"] == 0 and result["service"]["errors"] == 0 else 1


async def bench_http(
    url: str,
    concurrency: int = 256,
    episodes: int = 1024,
    goal_set: str | None = None,
    timeout: float = 60.0,
    retries: int = 5,
) -> dict[str, Any]:
    """Run ``episodes`` expert episodes, ``concurrency`` at a time, through the native protocol.

    The expert's actions come from the server (``/v1/goals/{goal}/expert``) before the clock starts. Latency
    percentiles cover every timed request (resets and steps); ``steps`` counts ``/v1/step`` calls.
    """
    from ..client import ServiceError, WebShopClient

    concurrency = max(1, concurrency)
    async with WebShopClient(
        url, timeout=timeout, retries=retries, max_connections=concurrency + 8
    ) as client:
        await client.wait_until_ready(timeout)
        summary = await client.goals(goal_set)
        name = goal_set or summary["default_goal_set"]
        count = summary["goal_sets"][name]["count"]
        candidates = list(range(min(count, episodes, MAX_EXPERT_GOALS)))
        gate = asyncio.Semaphore(concurrency)

        async def plan(goal: int) -> tuple[int, list[str]]:
            async with gate:
                return goal, await client.expert(goal, goal_set=name)

        plans = [(g, a) for g, a in await asyncio.gather(*(plan(g) for g in candidates)) if a]
        if not plans:
            raise SystemExit(f"bench-http: the expert found no episode to play among {len(candidates)} goals")

        latencies: list[float] = []
        rewards: list[float] = []
        counters = {"steps": 0, "resets": 0, "errors": 0}
        episode_ids = itertools.count()

        async def timed(call: Any) -> dict[str, Any]:
            started = time.perf_counter()
            result = await call
            latencies.append(time.perf_counter() - started)
            return result

        async def worker() -> None:
            while (index := next(episode_ids)) < episodes:
                goal, actions = plans[index % len(plans)]
                try:
                    page = await timed(client.reset(goal, goal_set=name))
                    counters["resets"] += 1
                    for action in actions:
                        page = await timed(client.step(page["state"], action))
                        counters["steps"] += 1
                        if page["done"]:
                            rewards.append(float(page["reward"]))
                            break
                except ServiceError:
                    counters["errors"] += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(min(concurrency, episodes))))
        seconds = time.perf_counter() - started

    return {
        "url": url,
        "episodes": episodes,
        "steps": counters["steps"],
        "resets": counters["resets"],
        "concurrency": concurrency,
        "seconds": round(seconds, 3),
        "steps_per_s": round(counters["steps"] / seconds, 1) if seconds else 0.0,
        "requests_per_s": round((counters["steps"] + counters["resets"]) / seconds, 1) if seconds else 0.0,
        "p50_ms": round(percentile(latencies, 0.50) * 1000.0, 2),
        "p99_ms": round(percentile(latencies, 0.99) * 1000.0, 2),
        "errors": counters["errors"],
        "mean_reward": round(sum(rewards) / len(rewards), 4) if rewards else 0.0,
        "goal_set": name,
        "distinct_goals": len(plans),
    }
