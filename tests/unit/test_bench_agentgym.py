"""``bench-envs --agentgym``'s load generator against small fake AgentGym servers (in this test's event loop):
every server is sent the same episodes in rounds whose order rotates, every step answered is counted, and every
failed call (an ``{"error"}`` answer, a status other than 200, a dropped connection) is counted and shown. The
figures themselves are never asserted."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import orjson
import pytest

from agent_envs.envs import bench_agentgym
from agent_envs.envs.bench_agentgym import Episode, interleaved, markdown, rows_of


class FakeAgentGym:
    """A minimal HTTP/1.1 server with AgentGym's four routes. ``faults`` maps the n-th call of a route (1-based)
    to what goes wrong there: ``"error"`` (an ``{"error"}`` answer), ``"500"``, ``"drop"`` (the connection
    closed without an answer)."""

    def __init__(
        self, name: str, log: list[tuple[str, str, Any]], faults: dict[tuple[str, int], str]
    ) -> None:
        self.name, self.log, self.faults = name, log, faults
        self.calls: Counter[str] = Counter()
        self.sessions = 0
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/fake"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ")[1].decode().removeprefix("/fake")
                length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                              if line.startswith(b"content-length:"))  # fmt: skip
                body = orjson.loads(await reader.readexactly(length)) if length else None
                self.calls[path] += 1
                self.log.append((self.name, path, body))
                fault = self.faults.get((path, self.calls[path]))
                if fault == "drop":
                    break
                status, answer = 200, self.answer(path)
                if fault == "error":
                    answer = {"error": "The id 0 is not valid."}
                elif fault == "500":
                    status, answer = 500, {"detail": "boom"}
                data = orjson.dumps(answer)
                writer.write(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s" % (status, len(data), data))
                await writer.drain()
                if b"connection: close" in head.lower():
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def answer(self, path: str) -> Any:
        if path == "/create":
            self.sessions += 1
            return {"id": self.sessions - 1}
        if path == "/close":
            return True
        return {"observation": "ok", "reward": 0, "done": False}


EPISODES = [Episode(task, tuple(f"act {task}.{n}" for n in range(task % 3 + 2))) for task in range(100, 112)]


def run(faults: dict[str, dict[tuple[str, int], str]], keep_alive: bool) -> tuple[dict, list]:
    log: list[tuple[str, str, Any]] = []

    async def main() -> dict:
        servers = {name: FakeAgentGym(name, log, faults.get(name, {})) for name in ("a", "b", "c")}
        targets = {name: await server.start() for name, server in servers.items()}
        warmup = [Episode(7, ("look",))]
        rounds = [EPISODES[0:4], EPISODES[4:8], EPISODES[8:12]]
        return await interleaved("babyai", targets, 2, warmup, rounds, keep_alive)

    return asyncio.run(main()), log


@pytest.mark.parametrize("keep_alive", [False, True])
def test_every_server_gets_the_same_episodes_in_rotated_rounds(keep_alive: bool) -> None:
    tallies, log = run({}, keep_alive)
    want_steps = sum(len(episode.actions) for episode in EPISODES)
    sent = {name: Counter() for name in "abc"}
    for name, path, body in log:
        if path == "/step":
            sent[name][body["action"]] += 1
    assert (
        sent["a"] == sent["b"] == sent["c"] and sum(sent["a"].values()) == want_steps + 1
    )  # + the warm-up's
    for tally in tallies.values():
        assert tally.errors == {} and tally.round_steps == [12, 13, 11] and len(tally.steps) == want_steps
        assert len(tally.resets) == len(EPISODES) and len(tally.walls) == 3
    # which server each round began with: a, then b, then c (the order rotates)
    first_reset = {}
    for name, path, body in log:
        if path == "/reset" and body["data_idx"] != 7:
            first_reset.setdefault((body["data_idx"] - 100) // 4, name)
    assert first_reset == {0: "a", 1: "b", 2: "c"}
    rows = rows_of("babyai", 2, {"ours": tallies["a"], bench_agentgym.AGENTGYM: tallies["c"]})
    assert [row["errors"] for row in rows] == [0, 0] and rows[1]["vs_agentgym"] == 1.0
    assert rows[1]["vs_agentgym_rounds"] == {"median": 1.0, "min": 1.0, "max": 1.0}
    assert len(rows[0]["round_steps_per_s"]) == 2 and "(1.0, 1.0-1.0)" in markdown(rows)


def test_every_failed_call_is_counted_and_shown() -> None:
    faults = {
        "b": {("/step", 3): "error", ("/reset", 2): "500", ("/create", 1): "drop"},
        "c": {("/step", 5): "drop", ("/close", 2): "error"},
    }
    tallies, _ = run(faults, keep_alive=True)
    assert tallies["a"].errors == {}
    assert tallies["b"].errors == {"/create: connection (IncompleteReadError)": 1, "/step: error answer": 1,
                                   "/reset: status 500": 1}  # fmt: skip
    assert tallies["c"].errors == {"/step: connection (IncompleteReadError)": 1, "/close: error answer": 1}
    rows = rows_of("babyai", 2, tallies)
    assert [row["errors"] for row in rows] == [0, 3, 2]
    assert "/reset: status 500" in markdown(rows)
