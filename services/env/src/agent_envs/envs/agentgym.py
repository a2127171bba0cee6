"""AgentGym's session protocol over one environment's pure routes, in one process: what the HTTP layer does
with a shared session store, minus HTTP. Used by the conformance replay (``replay_trace``) and the tests.

``InProcessAgentGym(env).call("POST", "/step", {"id": 3, "action": "inventory"})`` -> ``(status, body)``.
Ids count from 0 like AgentGym's servers (the HTTP layer hands out random ids instead; see docs/api.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field, ValidationError, create_model

from .contract import DELETE, KEEP, CompatAnswer, CompatCall, CompatRoute, TextEnv

Send = Callable[[str, str, Mapping[str, Any] | None], tuple[int, Any]]


def json_integer(value: object) -> int:
    """An integer as JSON Schema defines one: ``3`` or ``3.0``, never ``true``, ``"3"`` or ``3.5``.

    pydantic's lax ``int`` takes booleans and numeric strings (AgentGym's servers therefore do), its strict
    ``int`` refuses ``3.0``; the schema (``type: integer``) says exactly this, so code and schema agree.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a JSON integer (not a boolean, string or null)")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("must be a JSON integer (no fractional part)")
        return int(value)
    return value


JsonInt = Annotated[int, BeforeValidator(json_integer)]
MAX_FIELD_CHARS = 10_000  # an action or a name: AgentGym's recordings send actions of 5,000 characters
# The integers a request field may hold (a data_idx, a count): a signed 64-bit integer, what every reader of a
# stored session (orjson) and every core can take. AgentGym's servers take any Python integer, and answer one
# of 10**30 three ways (TextCraft takes it modulo its goals, BabyAI's gymnasium refuses the seed, SciWorld's list
# index fails); here every environment answers it one way, in AgentGym's own error shape.
MIN_FIELD_INT, MAX_FIELD_INT = -(2**63), 2**63 - 1


def request_model(env_id: str, route: CompatRoute, max_chars: int = MAX_FIELD_CHARS) -> type[BaseModel]:
    """The pydantic model of a route's request fields. AgentGym's servers validate with pydantic models too
    (lax integers, extra fields ignored), so the HTTP layer and ``InProcessAgentGym`` share this one.
    ``max_chars`` bounds every string field: the HTTP layer passes its request cap (2,048 characters, as on
    every other route), the in-process replay the cores' own bound."""
    text = Annotated[str, Field(max_length=max_chars)]
    field_types: dict[str, Any] = {"int": JsonInt, "str": text, "str_or_null": text | None}
    # a query string's values are text: there an integer is written "3" (JSON bodies: 3 or 3.0, never "3")
    types = {**field_types, "int": int} if route.method == "GET" else field_types
    fields: dict[str, Any] = {}
    if route.needs_id and not route.creates:
        fields["id"] = (types["int"], Field(description="the session id from /create"))
    for name, spec in route.fields.items():
        kind = types[spec.kind]
        if spec.required:
            fields[name] = (kind, ...)
        else:
            fields[name] = (kind, spec.default)  # null is no integer (AgentGym's models: `data_idx: int = 0`)
    name = (
        f"{env_id.capitalize()}{route.path.strip('/').replace('_', ' ').title().replace(' ', '') or 'Root'}"
    )
    return create_model(f"{name}{route.method.capitalize()}", **fields)


def out_of_range(args: Mapping[str, Any]) -> CompatAnswer | None:
    """AgentGym's error shape (HTTP 200 ``{"error": ...}``) for an integer field outside a signed 64-bit
    integer, before any environment sees it (``MIN_FIELD_INT``); None when every field is in range."""
    for name, value in args.items():
        if isinstance(value, int) and not isinstance(value, bool):
            if value > MAX_FIELD_INT:
                return CompatAnswer({"error": f"{name} must be at most {MAX_FIELD_INT}"})
            if value < MIN_FIELD_INT:
                return CompatAnswer({"error": f"{name} must be at least {MIN_FIELD_INT}"})
    return None


def close_session(call: CompatCall) -> CompatAnswer:
    """AgentGym's ``POST /close`` where closing forgets the id: ``true`` for a live session, ``false`` for an
    unknown or closed one (TextCraft's and BabyAI's servers)."""
    if call.session is None:
        return CompatAnswer(False)
    return CompatAnswer(True, DELETE)


class InProcessAgentGym:
    """AgentGym's server for ``env`` as a Python object (sessions in a dict, ids from a counter)."""

    def __init__(self, env: TextEnv, routes: tuple[CompatRoute, ...], first_id: int = 0) -> None:
        self.env = env
        self.routes = {(route.method, route.path): route for route in routes}
        self.models = {key: request_model(env.env_id, route) for key, route in self.routes.items()}
        self.sessions: dict[int, Any] = {}
        self.next_id = first_id

    def call(self, method: str, path: str, fields: Mapping[str, Any] | None = None) -> tuple[int, Any]:
        route = self.routes.get((method, path))
        if route is None:
            return 404, {"error": "not_found"}
        try:
            args = self.models[(method, path)].model_validate(dict(fields or {})).model_dump()
        except ValidationError as error:
            return 422, {"error": "validation_error", "detail": str(error)}
        env_idx = self.next_id if route.creates else args.pop("id", 0)
        refused = out_of_range(args)
        if refused is not None:
            return refused.status, refused.body
        if route.creates:
            self.next_id += 1
        answer = route.handler(CompatCall(self.env, env_idx, self.sessions.get(env_idx), args))
        if answer.session is DELETE:
            self.sessions.pop(env_idx, None)
        elif answer.session is not KEEP:
            self.sessions[env_idx] = answer.session
        return answer.status, answer.body


# ---- replaying a recorded episode ------------------------------------------------------------------------
def trace_requests(episode: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every recorded request of an episode in the order it was sent: (label, record with method, path,
    body or params, status, response), the steps turned into records of their own."""
    for key in ("extra_before_reset",):
        for record in episode.get(key) or []:
            yield key, record
    yield "reset", episode["reset"]
    rid = episode["create"]["response"].get("id") if isinstance(episode["create"]["response"], dict) else None
    for number, step in enumerate(episode["steps"]):
        yield f"step {number}", {"method": "POST", "path": "/step", "body": {"action": step["action"], "id": rid},
                                 **{k: v for k, v in step.items() if k != "action"}}  # fmt: skip
    for record in episode.get("extra") or []:
        yield "extra", record
    yield "close", episode["close"]
    for record in episode.get("extra_after_close") or []:
        yield "after close", record


def recorded_id(episode: Mapping[str, Any]) -> int:
    response = episode["create"]["response"]
    return response["id"] if isinstance(response, dict) else int(response)


def replay_trace(
    episode: Mapping[str, Any], send: Send, documented: Callable[[str], bool] = lambda difference: False
) -> list[str]:
    """Create a session as the episode did, send the episode's requests (its recorded id replaced by the id our
    /create gave) and list the differences from the recorded responses. Compared exactly: every 200 answer from
    /reset on, error texts included (the id in them mapped); for the original's 422 (a missing or mistyped
    field) and 500 (its own bugs), only that ours is a 4xx (docs/deviations.md). /create's own answer is not
    compared: the original's depends on how many sessions its process made before (TextCraft resets a new
    session to task ``id``)."""
    create = episode["create"]
    status, created = send("POST", "/create", create.get("body"))
    if status != 200:
        return [f"/create: status {status} {created!r}"]
    new_id = created["id"] if isinstance(created, dict) else int(created)
    rid = recorded_id(episode)
    differences: list[str] = []
    for label, record in trace_requests(episode):
        fields = record.get("body") if record["method"] == "POST" else record.get("params")
        fields = {k: (new_id if k == "id" and v == rid else v) for k, v in (fields or {}).items()}
        status, body = send(record["method"], record["path"], fields)
        want_status = record["status"]
        if want_status != 200:
            if not 400 <= status < 500:
                difference = (
                    f"{label} {record['path']}: status {status} {body!r}, want a 4xx (original {want_status})"
                )
                if not documented(difference):
                    differences.append(difference)
            continue
        want = remap_id(record["response"], rid, new_id)
        if status != 200 or body != want:
            difference = f"{label} {record['path']} {fields!r}: got {status} {body!r}, want {want!r}"
            if not documented(
                difference
            ):  # one docs/deviations.md lists (the environment package says which)
                differences.append(difference)
    return differences


def over_the_request_cap(difference: str) -> bool:
    """Whether a difference ``replay_trace`` reports over HTTP is the serving layer's request cap
    (docs/deviations.md): a recorded action longer than 2,048 characters, refused with 422 instead of answered
    (the original takes any length; the cores alone give the recorded answers for those steps too)."""
    return (
        "got 422 {'error': 'validation_error', 'detail': 'action: String should have at most 2048"
        in difference
    )


def remap_id(value: Any, old: int, new: int) -> Any:
    """A recorded response with the recorded session id replaced by ours where the original printed it."""
    if old == new:
        return value
    if isinstance(value, dict):
        return {k: (new if k == "id" and v == old else remap_id(v, old, new)) for k, v in value.items()}
    if isinstance(value, list):
        return [remap_id(v, old, new) for v in value]
    if isinstance(value, str):
        if value == str(old):
            return str(new)
        for template in ("The id {} is", "environment {} "):
            value = value.replace(template.format(old), template.format(new))
    return value
