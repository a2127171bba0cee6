"""The OpenEnv protocol this project speaks (``agent_envs.api.routes_openenv``) against the installed client's.

OpenEnv's client (``openenv`` in .venv-trl, pinned in constraints-trl.txt) reports what it speaks: the WebSocket path
it connects to, the messages it sends and the answer types it reads, the error codes, the request and answer models'
fields (all and required), the HTTP routes OpenEnv's own server serves, and what its client reads from a frame
(``_openenv_driver.facts``). :func:`drift` lists every difference from what ``routes_openenv.PROTOCOL`` says and what
its wire models and routes actually hold; the test fails on any, naming them. An upgrade of ``openenv`` that changes
its protocol fails here first, before a user's client meets the balancer.

Fast (one driver process, no fleet): in `make test` where .venv-trl exists, else skipped with the command that makes
it; `make test-all` makes it first.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from _openenv import OpenEnvDriver

from agent_envs.api import routes_openenv as ours
from agent_envs.api.app import create_app
from agent_envs.api.settings import Settings

SECRET = "openenv-drift-secret-0123456789-abcdef"


@pytest.fixture(scope="module")
def facts(openenv_python: Path) -> dict[str, Any]:
    with OpenEnvDriver(openenv_python) as driver:
        return driver.call("facts")


def _fields(model: Any) -> set[str]:
    return set(model.model_fields)


def drift(facts: dict[str, Any]) -> list[str]:
    """Every way the installed client's protocol (``facts``) differs from the one this project speaks."""
    found: list[str] = []
    protocol = ours.PROTOCOL
    required = facts["required"]

    def check(what: str, ok: bool, detail: Any) -> None:
        if not ok:
            found.append(f"{what}: {detail}")

    # the transport: where the client connects, what it sends, what it reads back
    check("WebSocket path", facts["ws_suffix"] == protocol["ws_path"],
          f"the client connects to <base>{facts['ws_suffix']}, we serve <base>{protocol['ws_path']}")  # fmt: skip
    check("WebSocket route", protocol["ws_path"] in facts["websocket_routes"],
          f"OpenEnv's server serves {facts['websocket_routes']}")  # fmt: skip
    check("client messages", set(facts["client_messages"]) == set(protocol["client_messages"]),
          f"client sends {facts['client_messages']}, we answer {list(protocol['client_messages'])}")  # fmt: skip
    check("answer types", set(facts["answers"]) == set(protocol["answers"]),
          f"client reads {facts['answers']}, we send {list(protocol['answers'])}")  # fmt: skip
    unknown = set(protocol["error_codes"]) - set(facts["error_codes"])
    check(
        "error codes",
        not unknown,
        f"we send {sorted(unknown)}, unknown to the client ({facts['error_codes']})",
    )
    reads = facts["client_reads"]
    check("frame fields", {"type", "data"} <= set(reads["_send_and_receive"]),
          f"the client's _send_and_receive reads {reads['_send_and_receive']}")  # fmt: skip
    check("error fields", set(protocol["error_fields"]) <= set(reads["_send_and_receive"]) | {"message", "code"}
          and {"message", "code"} <= set(reads["_send_and_receive"]),
          f"the client's error handling reads {reads['_send_and_receive']}, we send {protocol['error_fields']}")  # fmt: skip
    for name in ("_reset_async", "_step_async", "_state_async"):
        check(f"{name} reads", {"type", "data"} <= set(reads[name]), reads[name])
    # the HTTP routes OpenEnv's server has (AutoEnv and scripts call them)
    theirs = {tuple(route) for route in facts["http_routes"]}
    check("HTTP routes", theirs == set(protocol["http_routes"]),
          f"OpenEnv serves {sorted(theirs)}, we serve {sorted(protocol['http_routes'])}")  # fmt: skip
    # the models: ours hold every field the client's hold and nothing its answers would refuse
    answer = _fields(ours.ObservationAnswer)
    for model in ("StepResponse", "ResetResponse"):
        wanted = set(
            facts["observation_fields"] if model == "StepResponse" else facts["reset_response_fields"]
        )
        check(f"{model} fields", answer == wanted, f"theirs {sorted(wanted)}, ours {sorted(answer)}")
    check("observation_fields", set(protocol["observation_fields"]) == set(facts["observation_fields"]),
          f"theirs {facts['observation_fields']}, PROTOCOL {protocol['observation_fields']}")  # fmt: skip
    state = _fields(ours.SessionState)
    check("State fields", set(facts["state_fields"]) <= state and set(protocol["state_fields"]) == set(facts["state_fields"]),
          f"theirs {facts['state_fields']}, ours {sorted(state)}")  # fmt: skip
    for model, mine, key in (("ResetRequest", ours.ResetParams, "reset_fields"),
                             ("StepRequest", ours.StepBody, "step_fields")):  # fmt: skip
        check(f"{model} fields", set(facts[key]) <= _fields(mine) and set(protocol[key]) == set(facts[key]),
              f"theirs {facts[key]}, ours {sorted(_fields(mine))}, PROTOCOL {protocol[key]}")  # fmt: skip
        check(f"{model} required", set(required[model]) <= _fields(mine), f"theirs require {required[model]}")
    metadata = _fields(ours.Metadata)
    check("EnvironmentMetadata fields", metadata == set(facts["metadata_fields"]),
          f"theirs {facts['metadata_fields']}, ours {sorted(metadata)}")  # fmt: skip
    schema = set(protocol["schema_fields"])
    check("SchemaResponse fields", set(required["SchemaResponse"]) <= schema <= set(facts["schema_fields"]),
          f"theirs {facts['schema_fields']} (required {required['SchemaResponse']}), ours {sorted(schema)}")  # fmt: skip
    check(
        "health",
        facts["health"] == protocol["health"],
        f"theirs {facts['health']}, ours {protocol['health']}",
    )
    return found


def test_the_protocol_we_speak_is_the_installed_clients(facts: dict[str, Any]) -> None:
    print(f"openenv {facts['versions'].get('openenv')}, trl {facts['versions'].get('trl')}")
    assert drift(facts) == [], "OpenEnv's protocol drifted from routes_openenv.PROTOCOL:\n" + "\n".join(
        drift(facts)
    )


@pytest.mark.parametrize(
    ("change", "what"),
    [
        (lambda f: f.update(ws_suffix="/socket"), "WebSocket path"),
        (lambda f: f["client_messages"].append("render"), "client messages"),
        (lambda f: f["error_codes"].remove("EXECUTION_ERROR"), "error codes"),
        (lambda f: f["http_routes"].append(["POST", "/render"]), "HTTP routes"),
        (lambda f: f["observation_fields"].append("truncated"), "StepResponse fields"),
        (lambda f: f["required"]["StepRequest"].append("session_id"), "StepRequest required"),
        (lambda f: f["client_reads"]["_send_and_receive"].remove("code"), "error fields"),
    ],
)
def test_a_drift_is_caught(facts: dict[str, Any], change: Any, what: str) -> None:
    """The check itself: each kind of change in the client's protocol is reported by name."""
    changed = copy.deepcopy(facts)
    change(changed)
    assert any(line.startswith(what) for line in drift(changed)), drift(changed)


def test_every_environment_serves_the_protocols_routes(tmp_path: Path) -> None:
    """What PROTOCOL says is served is served, under every environment's prefix and a named session's base: its
    HTTP routes in the app's OpenAPI document, its WebSocket answering a ``state`` message."""
    from fastapi.testclient import TestClient

    settings = Settings(catalog=tmp_path, envs="textcraft,babyai", state_secret=SECRET, access_log=False)
    with TestClient(create_app(settings)) as client:
        paths = client.get("/openapi.json").json()["paths"]
        for env_id in ("textcraft", "babyai"):
            for base in (f"/{env_id}{ours.MOUNT}", f"/{env_id}{ours.MOUNT}/sessions/drift-check"):
                template = base.replace("drift-check", "{session}")
                for method, path in ours.PROTOCOL["http_routes"]:
                    assert method.lower() in paths.get(template + path, {}), (method, template + path)
                with client.websocket_connect(base + ours.PROTOCOL["ws_path"]) as socket:
                    socket.send_json({"type": "state"})
                    answer = socket.receive_json()
                assert answer["type"] == "state" and answer["data"]["env"] == env_id, answer
