"""OpenEnv's protocol for every served environment, over the environment contract: ``/<env>/openenv``.

OpenEnv (``openenv`` on PyPI) reaches an environment server through ``EnvClient``: a WebSocket at
``<base_url>/ws`` carrying ``{"type": "reset" | "step" | "state" | "close", "data": ...}`` and answered with
``{"type": "observation" | "state" | "error", "data": ...}``, beside HTTP routes (``/reset``, ``/step``,
``/state``, ``/health``, ``/metadata``, ``/schema``) that ``AutoEnv`` probes and scripts call. This module speaks
that protocol for any registered environment, once, over ``EnvRuntime`` (its core, its token codec): nothing here
knows an environment by name. Two bases per environment:

- ``/<env>/openenv``: OpenEnv's own semantics. A WebSocket is one session, held in the connection (the episode's
  state token, in memory): the fastest path, and like OpenEnv's own server it ends with the connection, so a
  replica's death ends it (the client's next call reconnects to a new, empty session and is told to reset). HTTP
  ``/reset`` and ``/step`` are stateless, as OpenEnv's are, and made useful by the token: every observation carries
  the episode's signed ``state``, and a step that sends it back (``{"action": {"action", "state"}}``) continues the
  episode on any replica.
- ``/<env>/openenv/sessions/<name>``: a named session (the client picks the name: ``base_url=.../sessions/<uuid>``).
  It lives in the shared session store (Redis: every replica reads it), as AgentGym's sessions do, so it outlives a
  replica: a client whose connection died with its replica reconnects (OpenEnv's client does so on its next call)
  and goes on where the session was. Its HTTP routes act on the same session. A change is exactly once under its
  request key (the message's ``request_id``, else the HTTP request's ``Idempotency-Key`` or the balancer's
  ``X-Request-Id``), recorded in the store with the session's new state (``compat_sessions``): a reset or step sent
  again after a connection error gets the first answer instead of being applied twice.

The shapes are OpenEnv's (``openenv.core.env_server.types``, ``serialization.serialize_observation``): an
observation ``{"observation": {...}, "reward", "done", "metadata"}``, a state ``{"episode_id", "step_count", ...}``,
a WebSocket error ``{"type": "error", "data": {"message", "code"}}`` (and here ``error``, the service's kind, and
``status``). HTTP errors are the service's ``{"error", "detail"}``. ``PROTOCOL`` lists what this module speaks;
``tests/openenv/test_protocol_drift.py`` compares it with the installed client's.

Where the schemas say more than OpenEnv's (so that what they allow is accepted, and the API fuzz agrees): an HTTP
reset takes a JSON object (``{}``: a random task); a task or seed is a JSON integer up to ``MAX_INDEX``; a stateless
step's action must carry ``state`` and a session's must not (its own model each); a session name matches
``SESSION_NAME`` in the path.
"""

# no `from __future__ import annotations`: FastAPI reads the handlers' annotations at run time

import contextlib
import hashlib
import json
import logging
import random
import re
import uuid
import weakref
from dataclasses import dataclass
from typing import Annotated, Any

from annotated_types import Ge, Gt, Le
from fastapi import APIRouter, Depends, FastAPI, Request, WebSocket
from fastapi import Path as PathParam
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response
from starlette.websockets import WebSocketDisconnect, WebSocketState

from ..deploy import OPENENV_MOUNT, OPENENV_NAME
from ..envs import registry
from ..envs.agentgym import json_integer
from ..envs.contract import EnvError, Transition
from .compat_sessions import (
    MAX_REQUEST_KEY,
    AlreadyAnswered,
    Answer,
    IdTaken,
    SessionConflict,
    SessionStore,
    SessionStoreUnavailable,
    UnknownSession,
    request_key,
    session_store,
)
from .errors import ApiError, classify, json_bytes
from .http import (
    ERRORS,
    MAX_ACTION_CHARS,
    client_address,
    forwarded_client,
    header_key,
    package_version,
    utf8_text,
)
from .routes_envs import EnvRuntime
from .settings import Settings
from .tokens import TokenError

log = logging.getLogger("agent_envs.api")

#: Where OpenEnv's protocol is mounted under an environment's prefix (``/<env>/openenv``; the balancer's locations
#: are derived from the same constants, ``deploy.openenv_locations``).
MOUNT = OPENENV_MOUNT
#: A named session's path below the mount, and what a name may be (URL-safe, bounded: it keys the store and routes).
SESSION_PATH = "/sessions/{session}"
SESSION_NAME = f"^{OPENENV_NAME}$"
MAX_TOKEN_CHARS = 64 * 1024  # a state token, as the native protocol bounds it
MAX_EPISODE_ID = 255  # OpenEnv's ResetRequest.episode_id
NO_EPISODE = (
    "no episode in this session: reset first. A session of /<env>/openenv/ws lives in its connection (a new "
    "connection, as after the replica that held it died, starts empty); a named session (.../openenv/sessions/<name>) "
    "lives in the shared store and outlives its replica. A stateless HTTP step sends the last observation's `state`."
)
CREATE_ATTEMPTS = 4  # a named session created by two requests at once: the loser reads it and applies on top

#: What this module speaks of OpenEnv's protocol (tests/openenv/test_protocol_drift.py checks it against the
#: installed ``openenv``: the client's WebSocket path and messages, the server's message and answer types, its error
#: codes, its HTTP routes and their request fields).
PROTOCOL: dict[str, Any] = {
    "ws_path": "/ws",
    "client_messages": ("reset", "step", "state", "close"),
    "answers": ("observation", "state", "error"),
    "error_codes": ("INVALID_JSON", "UNKNOWN_TYPE", "VALIDATION_ERROR", "EXECUTION_ERROR", "SESSION_ERROR"),
    "error_fields": ("message", "code"),
    "observation_fields": ("observation", "reward", "done", "metadata"),
    "state_fields": ("episode_id", "step_count"),
    "http_routes": (
        ("POST", "/reset"),
        ("POST", "/step"),
        ("GET", "/state"),
        ("GET", "/health"),
        ("GET", "/metadata"),
        ("GET", "/schema"),
    ),  # fmt: skip
    "reset_fields": ("seed", "episode_id"),
    "step_fields": ("action", "timeout_s", "request_id"),
    "schema_fields": ("action", "observation", "state"),
    "metadata_fields": ("name", "description", "version", "readme_content", "author", "documentation_url"),
    "health": {"status": "healthy"},
}


# ---- the wire models (OpenEnv's shapes; the fields are this service's) ------------------------------------------
def _number(value: Any) -> Any:
    """A JSON number (``true`` is not 1.0, as JSON Schema has it)."""
    if isinstance(value, bool):
        raise ValueError("must be a number")
    return value


#: A task or a seed: a JSON integer (not ``true``) from 0 to 2**31 - 1 (a task past the last: 404 unknown_task; a
#: bound far from where a JSON reader's doubles round integers); a timeout: a JSON number above 0. The bounds come
#: before the validator, so that the schema shows them.
MAX_INDEX = 2**31 - 1
Index = Annotated[int, Ge(0), Le(MAX_INDEX), BeforeValidator(json_integer)]
Timeout = Annotated[float, Gt(0), BeforeValidator(_number)]
#: A request id is visible ASCII without spaces, as a request key header is (``http.key_header``); in the schema, so
#: what the schema allows is accepted.
REQUEST_ID = "^[!-~]+$"


class TextAction(BaseModel):
    """One action (OpenEnv's ``Action``: ``metadata`` and the environment's fields; unknown fields refused)."""

    model_config = ConfigDict(extra="forbid")

    action: str = Field(
        max_length=MAX_ACTION_CHARS, description="the action, as the environment's grammar has it"
    )
    metadata: dict[str, Any] = Field(default_factory=dict, description="OpenEnv's Action.metadata (unused)")
    request_id: str | None = Field(
        default=None, min_length=1, max_length=MAX_REQUEST_KEY, pattern=REQUEST_ID,
        description="a named session's step with a request id is applied once: sent again, it gets the first answer",
    )  # fmt: skip

    _check_action = field_validator("action")(utf8_text)


class StatelessAction(TextAction):
    """A stateless HTTP step's action (``POST /<env>/openenv/step``, no session): the episode travels with it."""

    state: str = Field(
        min_length=1, max_length=MAX_TOKEN_CHARS,
        description="the previous observation's `state`, unchanged (the episode's signed state token)",
    )  # fmt: skip


class ResetParams(BaseModel):
    """What a reset takes (OpenEnv's ``ResetRequest``: ``seed``, ``episode_id``; here also the task)."""

    model_config = ConfigDict(extra="forbid")

    task: Index | None = Field(default=None, description="the task (GET .../metadata: how many)")
    seed: Index | None = Field(default=None, description="no task: task = seed mod tasks")
    episode_id: str | None = Field(default=None, max_length=MAX_EPISODE_ID)
    request_id: str | None = Field(default=None, min_length=1, max_length=MAX_REQUEST_KEY, pattern=REQUEST_ID)

    _check_episode_id = field_validator("episode_id")(
        lambda value: value if value is None else utf8_text(value)
    )


class StepBody(BaseModel):
    """OpenEnv's HTTP ``StepRequest``."""

    model_config = ConfigDict(extra="forbid")

    action: TextAction
    timeout_s: Timeout | None = Field(
        default=None, description="accepted for OpenEnv's clients; steps are short"
    )
    request_id: str | None = Field(default=None, min_length=1, max_length=MAX_REQUEST_KEY, pattern=REQUEST_ID)


class StatelessStepBody(StepBody):
    """A stateless HTTP ``StepRequest``: its action carries the episode's ``state``."""

    action: StatelessAction


class TextObservation(BaseModel):
    """The ``observation`` of an answer (OpenEnv's ``Observation`` less ``reward`` and ``done``, which sit beside it)."""

    text: str = Field(description="what the environment says")
    info: dict[str, Any] = Field(description="what it adds (score, available actions, validity, ...)")
    state: str = Field(description="the episode's signed state token (a stateless step sends it back)")
    metadata: dict[str, Any] = Field(default_factory=dict)


class ObservationAnswer(BaseModel):
    """An answer to a reset or a step (OpenEnv's ``ResetResponse`` / ``StepResponse``)."""

    observation: TextObservation
    reward: float | None = None
    done: bool = False
    metadata: dict[str, Any] | None = None


class SessionState(BaseModel):
    """The answer to ``state`` (OpenEnv's ``State``: ``episode_id``, ``step_count``, and the environment's)."""

    model_config = ConfigDict(extra="allow")

    episode_id: str | None = None
    step_count: int = 0
    env: str
    task: int | None = None
    done: bool = False
    session: str | None = None


class Metadata(BaseModel):
    """OpenEnv's ``EnvironmentMetadata``."""

    name: str
    description: str
    version: str | None = None
    readme_content: str | None = None
    author: str | None = None
    documentation_url: str | None = None


# ---- an episode, and where a session keeps it ------------------------------------------------------------------
@dataclass(frozen=True)
class Episode:
    """A session's episode: what the store keeps (the native protocol's signed token and a few counters)."""

    task: int | None = None
    token: str | None = None
    steps: int = 0
    episode_id: str | None = None
    done: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"task": self.task, "token": self.token, "steps": self.steps, "episode": self.episode_id,
                "done": self.done}  # fmt: skip

    @classmethod
    def from_json(cls, value: Any) -> "Episode":
        if not isinstance(value, dict):
            raise ApiError(500, "internal_error", "a stored OpenEnv session is not an object")
        return cls(value.get("task"), value.get("token"), int(value.get("steps") or 0), value.get("episode"),
                   bool(value.get("done")))  # fmt: skip


def _encode_session(value: Any) -> str:
    """A session as the store keeps it: JSON whose episode is the native protocol's signed token (so a tampered
    store cannot forge an episode; the counters beside it are informational)."""
    return json_bytes(value).decode()


def _decode_session(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise ApiError(500, "internal_error", "a stored OpenEnv session is not JSON") from None


def session_id(name: str) -> int:
    """The store's integer id of a named session: 63 bits of a keyed hash of its name (collisions among even a
    million live sessions have odds of one in ten million)."""
    digest = hashlib.blake2b(name.encode(), digest_size=8, key=b"openenv-session").digest()
    return (int.from_bytes(digest, "big") >> 1) or 1


class OpenEnvSide:
    """One environment's OpenEnv protocol in one worker: resets, steps and states over its ``EnvRuntime``, and the
    named sessions in a store of their own (``openenv:<env>:`` keys)."""

    def __init__(self, runtime: EnvRuntime) -> None:
        self.runtime = runtime
        self.env_id = runtime.env_id
        metrics = runtime.metrics
        self.sessions: SessionStore = session_store(
            runtime.settings, _encode_session, _decode_session, None,
            lambda reason, count: metrics.compat_evictions.labels(f"openenv_{reason}").inc(count),
            name=f"{self.env_id}/openenv", prefix=f"openenv:{self.env_id}:",
        )  # fmt: skip
        self._random = random.SystemRandom()

    # ---- the environment ------------------------------------------------------------------------------------
    def pick_task(self, params: ResetParams) -> int:
        count = self.runtime.env.task_count()
        if params.task is not None:
            return params.task  # the core refuses one out of range (404 unknown_task)
        if params.seed is not None:
            return params.seed % count
        return self._random.randrange(count)

    async def reset(self, params: ResetParams) -> tuple[Episode, dict[str, Any]]:
        task = self.pick_task(params)
        result = await self.runtime.reset(task)
        episode = Episode(task, self.runtime.codec.encode(result.state), 0,
                          params.episode_id or uuid.uuid4().hex, result.done)  # fmt: skip
        return episode, self.answer(episode, result)

    async def step(
        self, episode: Episode, action: TextAction, token: str | None = None
    ) -> tuple[Episode, dict[str, Any]]:
        """One action on the session's episode, else (a stateless step) on the episode ``token`` carries."""
        token = token if episode.token is None else episode.token
        if token is None:
            raise ApiError(409, "no_episode", NO_EPISODE)
        state = self.runtime.codec.decode(token)
        result = await self.runtime.step(state, action.action, "openenv")
        after = Episode(episode.task, self.runtime.codec.encode(result.state), episode.steps + 1,
                        episode.episode_id, result.done)  # fmt: skip
        return after, self.answer(after, result)

    def answer(self, episode: Episode, result: Transition) -> dict[str, Any]:
        """OpenEnv's ``serialize_observation`` of the transition: metadata in the observation and beside it."""
        metadata: dict[str, Any] = {"env": self.env_id, "step_count": episode.steps}
        if episode.task is not None:
            metadata["task"] = episode.task
        if episode.episode_id is not None:
            metadata["episode_id"] = episode.episode_id
        observation = {"text": result.observation, "info": dict(result.info), "state": episode.token,
                       "metadata": metadata}  # fmt: skip
        return {
            "observation": observation,
            "reward": result.reward,
            "done": result.done,
            "metadata": metadata,
        }

    def state(self, episode: Episode | None, name: str | None) -> dict[str, Any]:
        episode = episode or Episode()
        return {"episode_id": episode.episode_id, "step_count": episode.steps, "env": self.env_id,
                "task": episode.task, "done": episode.done, "session": name}  # fmt: skip

    async def free(self, episode: Episode | None) -> None:
        """Free the simulator an episode holds (SciWorld's JVM), where the environment holds one."""
        closer = getattr(self.runtime.env, "close", None)
        if episode is None or episode.token is None or not callable(closer):
            return
        with contextlib.suppress(EnvError, TokenError):
            await run_in_threadpool(closer, self.runtime.codec.decode(episode.token))

    # ---- named sessions (in the store) ----------------------------------------------------------------------
    async def session_reset(self, name: str, params: ResetParams, key: str | None, client: str) -> Answer:
        """Reset the named session (made on its first reset), exactly once under ``key``."""
        sid = session_id(name)
        for _ in range(CREATE_ATTEMPTS):
            try:
                _, version = await self.sessions.get(sid, key, touch=True)
            except UnknownSession:
                version = None
            episode, body = await self.reset(params)
            sent = Answer(200, json_bytes(body))
            try:
                if version is None:
                    await self.sessions.create(sid, episode.to_json(), client, key, sent)
                else:
                    await self.sessions.put(sid, episode.to_json(), version, key, sent)
                return sent
            except (IdTaken, SessionConflict, UnknownSession):
                continue  # made, changed or closed meanwhile by another request: read it again
        raise ApiError(409, "session_conflict", f"session {name!r} kept changing under this reset; retry")

    async def session_step(self, name: str, action: TextAction, key: str | None) -> Answer:
        """One step of the named session, exactly once under ``key``; from this process's copy of the session when
        it is current (one store call), else from the store."""
        sid = session_id(name)
        cached = not self.runtime.blocking
        while True:
            try:
                stored, version = await self.sessions.get(sid, key, touch=True, cached=cached)
            except UnknownSession:
                raise ApiError(404, "unknown_session", f"no session {name!r}: reset it first (it was never reset, "
                                                       "was closed, or was evicted from a full store)") from None  # fmt: skip
            episode, body = await self.step(Episode.from_json(stored), action)
            sent = Answer(200, json_bytes(body))
            try:
                await self.sessions.put(sid, episode.to_json(), version, key, sent)
                return sent
            except (SessionConflict, UnknownSession) as error:
                if not version.cached:
                    if isinstance(error, UnknownSession):
                        raise ApiError(
                            404, "unknown_session", f"session {name!r} was closed meanwhile"
                        ) from None
                    raise
                cached = False  # this process's copy was stale: read the store and step again

    async def session_episode(self, name: str) -> Episode | None:
        try:
            stored, _ = await self.sessions.get(session_id(name), None, touch=True)
        except UnknownSession:
            return None
        return Episode.from_json(stored)

    async def session_close(self, name: str) -> bool:
        episode = await self.session_episode(name)
        closed = await self.sessions.close(session_id(name))
        await self.free(episode)
        return closed

    async def aclose(self) -> None:
        await self.sessions.aclose()


_SIDES: "weakref.WeakKeyDictionary[EnvRuntime, OpenEnvSide]" = weakref.WeakKeyDictionary()


def side_of(runtime: EnvRuntime) -> OpenEnvSide:
    """This worker's OpenEnv side of an environment (made on first use: most workers never see an OpenEnv client)."""
    side = _SIDES.get(runtime)
    if side is None:
        side = _SIDES[runtime] = OpenEnvSide(runtime)
    return side


async def aclose(runtime: EnvRuntime) -> None:
    """Close the OpenEnv session store of ``runtime`` (the app's shutdown)."""
    side = _SIDES.pop(runtime, None)
    if side is not None:
        await side.aclose()


def _runtime(app: Any, env_id: str) -> EnvRuntime:
    runtimes = getattr(app.state, "envs", None)
    if not runtimes or env_id not in runtimes:
        raise ApiError(
            503, "not_ready", f"the {env_id} environment is not ready yet (or any more); retry shortly"
        )
    return runtimes[env_id]


def _key(
    request_id: str | None, header: str | None, name: str, op: str, fields: dict[str, Any]
) -> str | None:
    """A change's request key: the client's own ``request_id``, else the request's key header; bound to the session,
    the operation and its fields (``compat_sessions.request_key``), so the same key over HTTP or WebSocket is one."""
    return request_key(request_id or header, f"openenv/{name}/{op}", fields)


# ---- the WebSocket ---------------------------------------------------------------------------------------------
class _Refusal(Exception):
    """A message answered with OpenEnv's error frame (``code``), the connection kept."""

    def __init__(self, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra


def _error_frame(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code, **extra}}


def _execution_error(error: Exception) -> _Refusal:
    """An error of the environment, the token or the store as OpenEnv's ``EXECUTION_ERROR``, with the service's
    kind and status (what the HTTP route would answer)."""
    status, kind = classify(error)
    if status >= 500 and status != 503:
        log.error("unhandled error on an OpenEnv message", exc_info=error)
        detail = "internal error; the server log has the details"
    else:
        detail = getattr(error, "detail", None) or str(error)
    message = f"{kind}: {detail}"  # OpenEnv's client shows the message and the code only
    extra: dict[str, Any] = {"error": kind, "status": status}
    if status == 503:
        extra["retry_after"] = 1
    return _Refusal("EXECUTION_ERROR", message, **extra)


def _validation_errors(error: ValidationError) -> list[dict[str, Any]]:
    return [{"loc": list(item.get("loc", ())), "msg": item.get("msg", ""), "type": item.get("type", "")}
            for item in error.errors()][:20]  # fmt: skip


class _Connection:
    """One WebSocket's session: the connection's own (anonymous), or a named one in the store."""

    def __init__(self, side: OpenEnvSide, name: str | None, client: str, header: str | None) -> None:
        self.side = side
        self.name = name
        self.client = client
        self.header = header  # the upgrade request's key: none of a message's (each message names its own)
        self.episode: Episode | None = None  # the anonymous session's episode

    async def handle(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """The answer frame to one message (None: close the connection)."""
        kind = message.get("type", "")
        if kind not in PROTOCOL["client_messages"]:
            raise _Refusal("UNKNOWN_TYPE", f"Unknown message type: {kind}")
        extra = set(message) - {"type", "data"}
        if extra:
            raise _Refusal("VALIDATION_ERROR", "Invalid message", errors=[{"loc": sorted(extra),
                           "msg": "Extra inputs are not permitted", "type": "extra_forbidden"}])  # fmt: skip
        data = message.get("data", {})
        if not isinstance(data, dict):
            raise _Refusal("VALIDATION_ERROR", "Invalid message: data must be an object")
        try:
            if kind == "reset":
                return {"type": "observation", "data": await self.reset(ResetParams.model_validate(data))}
            if kind == "step":
                return {"type": "observation", "data": await self.step(TextAction.model_validate(data))}
            if kind == "state":
                episode = await self.side.session_episode(self.name) if self.name else self.episode
                return {"type": "state", "data": self.side.state(episode, self.name)}
        except ValidationError as error:
            raise _Refusal("VALIDATION_ERROR", "Invalid message", errors=_validation_errors(error)) from None
        except AlreadyAnswered as retried:
            return {"type": "observation", "data": json.loads(retried.answer.body)}
        except (
            ApiError,
            EnvError,
            TokenError,
            UnknownSession,
            SessionConflict,
            SessionStoreUnavailable,
        ) as error:
            raise _execution_error(error) from None
        except (
            Exception
        ) as error:  # a bug: logged, answered as OpenEnv's server answers one, the connection kept
            raise _execution_error(error) from None
        await self.close()  # "close": OpenEnv's client ends its session
        return None

    async def reset(self, params: ResetParams) -> dict[str, Any]:
        if self.name is None:
            await self.side.free(self.episode)
            self.episode, body = await self.side.reset(params)
            return body
        key = _key(params.request_id, None, self.name, "reset", params.model_dump(exclude={"request_id"}))
        answer = await self.side.session_reset(self.name, params, key, self.client)
        return json.loads(answer.body)

    async def step(self, action: TextAction) -> dict[str, Any]:
        if self.name is None:
            self.episode, body = await self.side.step(self.episode or Episode(), action)
            return body
        fields = action.model_dump(exclude={"request_id", "metadata"})
        answer = await self.side.session_step(self.name, action, _key(action.request_id, None, self.name, "step",
                                                                      fields))  # fmt: skip
        return json.loads(answer.body)

    async def close(self) -> None:
        """OpenEnv's ``close``: the session ends (a named one leaves the store)."""
        if self.name is None:
            await self.side.free(self.episode)
            self.episode = None
        else:
            await self.side.session_close(self.name)

    async def disconnected(self) -> None:
        """The connection went away without ``close``: an anonymous session ends with it; a named one stays for
        the client's reconnection."""
        if self.name is None:
            await self.side.free(self.episode)
            self.episode = None


async def serve_websocket(websocket: WebSocket, env_id: str, name: str | None) -> None:
    """One OpenEnv WebSocket: messages answered in order until ``close`` or the client goes away."""
    await websocket.accept()
    connection: _Connection | None = None
    try:
        runtime = _runtime(websocket.app, env_id)
        settings: Settings = runtime.settings
        client = forwarded_client(websocket.headers.get("x-forwarded-for"),
                                  websocket.client.host if websocket.client else None)  # fmt: skip
        connection = _Connection(side_of(runtime), name, client, None)
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            frame = await _answer(connection, message, settings.max_body_bytes)
            if frame is None:
                break
            await websocket.send_text(json_bytes(frame).decode())
    except WebSocketDisconnect:
        pass
    except ApiError as error:  # not ready: OpenEnv's session error, then the connection ends
        with contextlib.suppress(Exception):
            await websocket.send_text(json_bytes(_error_frame("SESSION_ERROR", error.detail, error=error.kind,
                                                              status=error.status)).decode())  # fmt: skip
    finally:
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.disconnected()
        if websocket.client_state != WebSocketState.DISCONNECTED:
            with contextlib.suppress(Exception):
                await websocket.close()


async def _answer(connection: _Connection, message: dict[str, Any], max_bytes: int) -> dict[str, Any] | None:
    """The frame answering one received message (None: the session closed)."""
    text = message.get("text")
    if text is None:
        return _error_frame("INVALID_JSON", "Invalid JSON: send text frames of JSON")
    if len(text) > max_bytes:
        return _error_frame("VALIDATION_ERROR", f"message of {len(text)} characters exceeds the limit of {max_bytes} "
                                                "(AGENTRL_MAX_BODY_BYTES)")  # fmt: skip
    try:
        parsed = json.loads(text)
    except ValueError as error:
        return _error_frame("INVALID_JSON", f"Invalid JSON: {error}")
    if not isinstance(parsed, dict):
        return _error_frame("INVALID_JSON", "Invalid JSON: a message is an object")
    try:
        return await connection.handle(parsed)
    except _Refusal as refusal:
        return _error_frame(refusal.code, refusal.message, **refusal.extra)


# ---- the routes --------------------------------------------------------------------------------------------------


def openenv_router(env_id: str) -> APIRouter:
    """OpenEnv's routes of ``env_id`` at ``/<env_id>/openenv`` and ``/<env_id>/openenv/sessions/<name>``."""
    registration = registry.registration(env_id)
    base = f"/{env_id}{MOUNT}"
    router = APIRouter(prefix=base, tags=[f"{env_id} (OpenEnv)"])
    metadata = Metadata(name=env_id, description=registration.title, version=package_version(),
                        documentation_url=registration.docs if (registration.docs or "").startswith("http") else None)  # fmt: skip
    schema = {"action": TextAction.model_json_schema(), "observation": TextObservation.model_json_schema(),
              "state": SessionState.model_json_schema()}  # fmt: skip

    for session in ("", SESSION_PATH):
        _add_routes(router, env_id, session, metadata, schema)
    return router


def _add_routes(
    router: APIRouter, env_id: str, session: str, metadata: Metadata, schema: dict[str, Any]
) -> None:
    """OpenEnv's routes at one base: the environment's own (``session`` empty) or a named session's."""
    named = bool(session)
    # a named session's name, in the schema (a name outside it: 422 before the handler)
    checks = [Depends(_session_name)] if named else []

    def _name(request: Request) -> str | None:
        return request.path_params.get("session") if named else None

    @router.get(f"{session}/health", summary=f"OpenEnv: is {env_id} served here", responses=ERRORS,
                dependencies=checks)  # fmt: skip
    async def health(request: Request) -> Response:
        _runtime(request.app, env_id)
        return Response(json_bytes(PROTOCOL["health"]), media_type="application/json")

    @router.get(f"{session}/metadata", response_model=Metadata, summary="OpenEnv: what this environment is",
                responses=ERRORS, dependencies=checks)  # fmt: skip
    async def get_metadata() -> Metadata:
        return metadata

    @router.get(f"{session}/schema", summary="OpenEnv: the action, observation and state schemas",
                responses=ERRORS, dependencies=checks)  # fmt: skip
    async def get_schema() -> dict[str, Any]:
        return schema

    @router.post(f"{session}/reset", response_model=ObservationAnswer, responses=ERRORS, dependencies=checks,
                 summary=f"OpenEnv: start a {env_id} episode" + (" in the named session" if named else ""))  # fmt: skip
    async def reset(request: Request, params: ResetParams) -> Response:  # {}: a random task
        side = side_of(_runtime(request.app, env_id))
        name = _name(request)
        if name is None:
            _, body = await side.reset(params)
            return Response(json_bytes(body), media_type="application/json")
        key = _key(params.request_id, header_key(request), name, "reset",
                   params.model_dump(exclude={"request_id"}))  # fmt: skip
        answer = await side.session_reset(name, params, key, client_address(request))
        return Response(answer.body, status_code=answer.status, media_type="application/json")

    if named:

        @router.post(f"{session}/step", response_model=ObservationAnswer, responses=ERRORS, dependencies=checks,
                     summary=f"OpenEnv: one {env_id} action in the named session")  # fmt: skip
        async def session_step(request: Request, body: StepBody) -> Response:
            side = side_of(_runtime(request.app, env_id))
            name = request.path_params["session"]
            request_id = body.request_id or body.action.request_id
            fields = body.action.model_dump(exclude={"request_id", "metadata"})
            recorded = await side.session_step(name, body.action, _key(request_id, header_key(request), name, "step",
                                                                       fields))  # fmt: skip
            return Response(recorded.body, status_code=recorded.status, media_type="application/json")

    else:

        @router.post(f"{session}/step", response_model=ObservationAnswer, responses=ERRORS,
                     summary=f"OpenEnv: one {env_id} action (stateless: the action carries the episode's state)")  # fmt: skip
        async def stateless_step(request: Request, body: StatelessStepBody) -> Response:
            side = side_of(_runtime(request.app, env_id))
            _, answer = await side.step(Episode(), body.action, body.action.state)
            return Response(json_bytes(answer), media_type="application/json")

    @router.get(f"{session}/state", response_model=SessionState, responses=ERRORS, dependencies=checks,
                summary="OpenEnv: where the session is (no session: an empty state, as OpenEnv's HTTP /state)")  # fmt: skip
    async def get_state(request: Request) -> Response:
        side = side_of(_runtime(request.app, env_id))
        name = _name(request)
        episode = await side.session_episode(name) if name is not None else None
        return Response(json_bytes(side.state(episode, name)), media_type="application/json")

    @router.websocket(f"{session}/ws")
    async def websocket(websocket: WebSocket) -> None:
        name = websocket.path_params.get("session") if named else None
        if name is not None and not _valid_name(name):
            await websocket.close(code=1008, reason=f"session names are 1-64 of {OPENENV_NAME[:-6]}")
            return
        await serve_websocket(websocket, env_id, name)


def _session_name(
    session: Annotated[
        str, PathParam(pattern=SESSION_NAME, description="the session's name (the client picks it)")
    ],
) -> str:
    """A named session's name as the schema documents it (``OPENENV_NAME``)."""
    return session


def _valid_name(name: str) -> bool:
    return re.fullmatch(SESSION_NAME[1:-1], name) is not None


def include_openenv_routes(app: FastAPI, settings: Settings) -> None:
    """Mount OpenEnv's routes of every served environment (``/<env>/openenv``)."""
    for env_id in settings.env_ids():
        app.include_router(openenv_router(env_id))


__all__ = ["MOUNT", "PROTOCOL", "SESSION_NAME", "Episode", "OpenEnvSide", "ResetParams", "SessionState",
           "TextAction", "TextObservation", "aclose", "include_openenv_routes", "openenv_router", "session_id"]  # fmt: skip
