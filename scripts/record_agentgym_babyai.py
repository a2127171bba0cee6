"""Record oracle episodes from AgentGym's own BabyAI server over HTTP, in the trace format of
tests/fixtures/conformance/agentgym-babyai/ (one episode per line), for `tests/envs/test_babyai.py` to replay.

The server is AgentGym's `agentenv-babyai`, run unmodified in a throwaway venv (scripts/agentgym_servers.sh
builds one and starts it); this script only talks HTTP to it, with the request bodies AgentGym's
`BabyAIEnvClient` sends. Its policies aim at what the 240 shared recordings exercise least: long random walks,
`go to` of objects seen earlier and no longer in view, `go to` of objects never seen, the same `go to` sent
again and again, and actions the server does not recognise. The draw is seeded, so a run against the same
server reproduces its file byte for byte.

    .venv/bin/python scripts/record_agentgym_babyai.py --url http://127.0.0.1:36202 --episodes 400 \\
        --seed 1 --out tests/fixtures/conformance/agentgym-babyai-oracle/traces.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

LEVELS = 40
TASKS = 200_000  # data_idx 0..199,999: 40 levels x seeds 0..4,999 (the range the project serves natively)
COLOURS = ("red", "green", "blue", "purple", "yellow", "grey")
KINDS = ("ball", "key", "box", "open door", "closed door", "locked door")
POLICIES = ("random", "goto", "edge")
UNRECOGNISED = (
    "jump",
    "pick up the ball",
    "go to the red ball",
    "go forward",
    "turn around",
    "toggle",
    "drop",
    "go to goal",
    "pickup",
    "go to",
    "go through",
    "open door",
    "move backward",
    "done",
    "  Move Forward  ",
    "TURN LEFT",
    "go to red ball 0",
    "go to red ball 10",
    "Action: turn left",
    "turn left\n",
    "\tturn right",
    "go to red ball 1.",
    "go  to red ball 1",
    "türn left",
    "checkmate",
    "",
)
ACTIONS_LINE = re.compile(r"\nAvailable actions: (\[.*\])\s*$", re.S)


def post(url: str, path: str, body: dict[str, Any] | None) -> tuple[int, Any]:
    """One POST as AgentGym's client sends it (a JSON body, or none for /create)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method="POST")
    if data is not None:
        request.add_header("content-type", "application/json")
    with urllib.request.urlopen(request, timeout=120) as response:
        return response.status, json.loads(response.read())


def listed(observation: str) -> list[str]:
    """The observation's "Available actions" list (empty when it has none)."""
    match = ACTIONS_LINE.search(observation)
    return json.loads(match.group(1)) if match else []


def objects_named(observation: str) -> list[str]:
    """ "<name> <k>" for every object an observation describes ("There is a red ball 1 ...")."""
    names = []
    for sentence in observation.split("There is a ")[1:]:
        words = sentence.split(" ")
        # <colour> <type> <k> or <colour> <open|closed|locked> door <k>
        size = 4 if len(words) > 3 and words[2] == "door" else 3
        names.append(" ".join(words[:size]))
    return names


class Policy:
    """Chooses the next action from what the episode has shown so far (a seeded draw)."""

    def __init__(self, kind: str, rng: random.Random) -> None:
        self.kind = kind
        self.rng = rng
        self.seen: list[str] = []  # every "<name> <k>" described so far, first sighting first
        self.last_goto: str | None = None

    def observe(self, observation: str) -> None:
        for name in objects_named(observation):
            if name not in self.seen:
                self.seen.append(name)

    def unseen(self) -> str:
        """An object name the episode may never have shown, with a small number."""
        return f"{self.rng.choice(COLOURS)} {self.rng.choice(KINDS)} {self.rng.randint(1, 3)}"

    def choose(self, actions: list[str]) -> str:
        rng = self.rng
        gotos = [a for a in actions if a.startswith(("go to ", "pickup ", "go through ", "toggle and go"))]
        roll = rng.random()
        if self.kind == "random":
            action = rng.choice(actions) if actions else "check available actions"
        elif self.kind == "goto":
            if roll < 0.35 and gotos:
                action = rng.choice(gotos)
            elif roll < 0.55 and self.last_goto:
                action = self.last_goto  # the same go to again
            elif roll < 0.75 and self.seen:
                action = f"go to {rng.choice(self.seen)}"  # perhaps no longer in view
            elif roll < 0.85:
                action = f"go to {self.unseen()}"
            else:
                action = rng.choice(actions) if actions else "turn left"
        else:  # edge
            if roll < 0.3 and actions:
                action = rng.choice(actions)
            elif roll < 0.45 and self.seen:
                verb = rng.choice(("go to", "pickup", "go through", "toggle and go through"))
                action = f"{verb} {rng.choice(self.seen)}"
            elif roll < 0.55:
                action = f"{rng.choice(('go to', 'pickup'))} {self.unseen()}"
            elif roll < 0.65 and self.last_goto:
                action = self.last_goto
            elif roll < 0.85:
                action = rng.choice(UNRECOGNISED)
            else:
                action = rng.choice(("check available actions", "check", "move forward", "drop", "toggle"))
        if action.startswith("go to "):
            self.last_goto = action
        return action


def record_episode(
    url: str, data_idx: int, kind: str, steps: int, rng: random.Random, seq: int
) -> dict[str, Any]:
    """One episode as the shared recordings store it: whole request records for /create, /reset, /close, and
    per step the action sent with the status and response."""
    status, created = post(url, "/create", None)
    rid = created["id"]
    body = {"data_idx": data_idx, "id": rid}
    reset_status, reset = post(url, "/reset", body)
    level = data_idx % LEVELS + 1
    episode: dict[str, Any] = {
        "env": "babyai",
        "data_idx": data_idx,
        "level_no": level,
        "seed": data_idx // LEVELS,
        "policy": kind,
        "episode_seq": seq,
        "create": {"method": "POST", "path": "/create", "status": status, "response": created},
        "reset": {
            "method": "POST",
            "path": "/reset",
            "body": body,
            "status": reset_status,
            "response": reset,
        },
        "steps": [],
    }
    policy = Policy(kind, rng)
    observation = reset.get("observation", "")
    actions = listed(observation)
    policy.observe(observation)
    for _ in range(steps):
        action = policy.choose(actions)
        step_status, answer = post(url, "/step", {"action": action, "id": rid})
        episode["steps"].append({"action": action, "status": step_status, "response": answer})
        if "observation" not in answer:
            break  # an error ("has finished" after done): recorded, and the episode ends there
        observation = answer["observation"]
        actions = listed(observation) or actions
        policy.observe(observation)
    close_body = {"id": rid}
    close_status, closed = post(url, "/close", close_body)
    episode["close"] = {
        "method": "POST",
        "path": "/close",
        "body": close_body,
        "status": close_status,
        "response": closed,
    }
    return episode


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", required=True, help="AgentGym's BabyAI server, e.g. http://127.0.0.1:36202")
    parser.add_argument("--episodes", type=int, default=400)
    parser.add_argument("--seed", type=int, default=1, help="seeds the tasks, policies and actions drawn")
    parser.add_argument("--min-steps", type=int, default=15)
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with args.out.open("w") as out:
        for seq in range(args.episodes):
            data_idx = rng.randrange(TASKS)
            kind = POLICIES[seq % len(POLICIES)]
            steps = rng.randint(args.min_steps, args.max_steps)
            episode = record_episode(args.url, data_idx, kind, steps, random.Random(rng.random()), seq)
            out.write(json.dumps(episode, sort_keys=True) + "\n")
            if (seq + 1) % 50 == 0:
                print(f"{seq + 1} episodes, {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
