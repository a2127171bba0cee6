"""Probe: how long after `docker start` a restarted session store (Redis) answers, through Docker's network, with
the replicas' own Redis client settings (docs/reliability.md, "the window between docker start and a store that
answers").

Starts a Redis container (stand-in or real `redis:7.4.2-alpine`) and a client container (the env image, which has
redis-py) on a throwaway network; the client fills a pool of 32 connections, then sends 8 calls every 0.3 s; the
store is SIGKILLed and started again (with --squat, another container takes its address first, so it comes back
at a new one). Prints when `docker start` returned, the failing rounds after it, and the first round in which
every call succeeded. Everything it creates is removed at the end.

    DOCKER_HOST=unix:///run/webshop-dockerd/docker.sock .venv/bin/python scripts/probe_store_restart.py --squat
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

CLIENT = r"""
import asyncio, json, sys, time
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as CE, TimeoutError as TE, RedisError
# the replicas' settings (agent_envs.api.compat_sessions.RedisSessionStore)
r = aioredis.Redis.from_url(sys.argv[1], socket_timeout=2.0, socket_connect_timeout=0.5,
    retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 3), retry_on_error=[CE, TE], health_check_interval=30)
async def one(i):
    try:
        await asyncio.wait_for(r.set(f"k{i}", "v"), 1.5)
        return "ok"
    except (RedisError, asyncio.TimeoutError) as e:
        return (f"{type(e).__name__}: {e}")[:60]
async def main():
    await asyncio.gather(*(one(i) for i in range(32)))
    end = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end:
        print(json.dumps({"t": time.time(), "r": await asyncio.gather(*(one(i) for i in range(8)))}), flush=True)
        await asyncio.sleep(0.3)
asyncio.run(main())
"""


def docker(*args: str, check: bool = True) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check).stdout.strip()


def address(container: str) -> str:
    return docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", container)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--squat", action="store_true", help="another container takes the store's address first"
    )
    parser.add_argument("--redis-image", default="redis:7.4.2-alpine")
    parser.add_argument(
        "--client-image", default="agent-envs:local", help="an image with python3 and redis-py"
    )
    args = parser.parse_args()
    net, store, client, squat = "probe-store-net", "probe-store", "probe-store-client", "probe-store-squat"
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "client.py").write_text(CLIENT)
        Path(scratch).chmod(0o755)
        try:
            docker("network", "create", net)
            docker("run", "-d", "--name", store, "--network", net, "--network-alias", "sessions", args.redis_image,
                   "redis-server", "--appendonly", "yes")  # fmt: skip
            time.sleep(2)
            docker("run", "-d", "--name", client, "--network", net, "-v", f"{scratch}:/probe:ro", "--entrypoint",
                   "python3", args.client_image, "/probe/client.py", "redis://sessions:6379/0", "25")  # fmt: skip
            time.sleep(5)
            before = address(store)
            killed = time.time()
            docker("kill", "-s", "KILL", store)
            if args.squat:
                docker(
                    "run",
                    "-d",
                    "--name",
                    squat,
                    "--network",
                    net,
                    "--entrypoint",
                    "sleep",
                    args.redis_image,
                    "60",
                )
            time.sleep(1)
            docker("start", store)
            started = time.time()
            after = address(store)
            time.sleep(20)
            log = docker("logs", client)
        finally:
            docker("rm", "-f", store, client, squat, check=False)
            docker("network", "rm", net, check=False)
    failing, first_ok = [], None
    for line in log.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        bad = [result for result in row["r"] if result != "ok"]
        if row["t"] > started and bad:
            failing.append(f"+{row['t'] - started:.2f} s: {len(bad)} failed ({bad[0]})")
        if row["t"] > started and not bad and first_ok is None:
            first_ok = row["t"] - started
    print(f"store address {before} -> {after}; docker start returned {started - killed:.2f} s after the kill")
    print("failing rounds after it:", "; ".join(failing) or "none")
    print(
        f"first round with every call answered: +{first_ok:.2f} s"
        if first_ok is not None
        else "no round answered"
    )


if __name__ == "__main__":
    main()
