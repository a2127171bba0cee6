"""Clients that speak to the service exactly as AgentGym's ``TextCraftEnvClient``, ``BabyAIEnvClient`` and
``SciworldEnvClient`` (``agentenv.envs``) do, request for request; shared by the integration and fault tests
(the root conftest puts this folder on sys.path). AgentGym's classes are not installable from PyPI; this is a
clean-room description of their HTTP behaviour, written from reading it:

- each call is a fresh ``requests.post`` / ``requests.get`` (no session, no keep-alive between calls) with the
  client's ``timeout``; nothing is ever retried;
- ``__init__`` posts ``/create`` once (TextCraft with the JSON body ``{"minecraft_dir", "commands", "goal"}``,
  the others with no body at all), raises when the status is not 200, and keeps ``id`` from the JSON answer
  (TextCraft also keeps the first observation);
- a POST puts ``"id"`` into its JSON body, a GET sends ``?id=``; any status but 200 fails an ``assert``;
- TextCraft and BabyAI ``step`` take the model's text: with more than one ``Action:`` line they answer an error
  observation without a request; otherwise the last ``Action:`` line's text, every character that is not a
  letter, a digit, a comma or a space removed and runs of whitespace collapsed, is the action;
- SciWorld ``step`` drops five characters from a text ending in ``</s>`` (AgentGym's off-by-one), then takes
  the text after the last ``Action:`` (ReAct format, AgentGym's default);
- ``reset(idx)`` posts ``{"data_idx": idx}``; ``close()`` posts ``{}`` (plus the id).

``observation``, ``reward``, ``done``: what the client would hand to AgentGym's agent loop (TextCraft's reward is
the step's reward, BabyAI's and SciWorld's the score).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, NamedTuple

import requests

ONE_ACTION_ONLY = "Error: Only one 'Action' is allowed per response. Please adjust your response."


class StepOutput(NamedTuple):
    state: str
    reward: float
    done: bool


class AgentGymEnvClient:
    """What the three clients share (one session per client object, created in ``__init__``)."""

    env_name: ClassVar[str] = ""
    create_body: ClassVar[dict[str, Any] | None] = None  # None: /create is posted without a body

    def __init__(self, env_server_base: str, data_len: int = 0, timeout: int = 300) -> None:
        self.env_server_base = env_server_base
        self.timeout = timeout
        self.data_len = data_len
        if self.create_body is None:
            created = requests.post(f"{env_server_base}/create", timeout=timeout)
        else:
            created = requests.post(f"{env_server_base}/create", timeout=timeout, json=dict(self.create_body))
        if created.status_code != 200:
            raise requests.RequestException(f"Failed to create environment: {created}")
        answer = created.json()
        self.env_id = answer["id"]
        self.info: dict[str, Any] = self._after_create(answer)

    def _after_create(self, answer: dict[str, Any]) -> dict[str, Any]:
        return {}

    def _post(self, path: str, data: dict[str, Any]) -> Any:
        data["id"] = self.env_id
        res = requests.post(f"{self.env_server_base}/{path}", json=data, timeout=self.timeout)
        assert res.status_code == 200
        return res.json()

    def _get(self, path: str) -> Any:
        res = requests.get(f"{self.env_server_base}/{path}?id={self.env_id}", timeout=self.timeout)
        assert res.status_code == 200
        return res.json()

    def observe(self) -> str:
        return self.info["observation"]

    def close(self) -> Any:
        return self._post("close", {})


def last_action_line(text: str) -> str | None:
    """TextCraft's and BabyAI's reading of a model reply: None when it has more than one ``Action:`` line, else
    the last one's text with everything but letters, digits, commas and spaces removed, whitespace collapsed."""
    found = re.findall(r"Action:\s*(.*?)(?=\n|$)", text, re.DOTALL)
    if len(found) > 1:
        return None
    action = found[-1] if found else ""
    action = re.sub(r"[^A-Za-z0-9, ]+", "", action)
    return " ".join(action.split()).strip()


class TextCraftEnvClient(AgentGymEnvClient):
    env_name = "TextCraft"
    create_body: ClassVar[dict[str, Any] | None] = {
        "minecraft_dir": "agentenv_textcraft/",
        "commands": None,
        "goal": None,
    }

    def _after_create(self, answer: dict[str, Any]) -> dict[str, Any]:
        return {"observation": answer["observation"], "reward": 0, "done": False}

    def step(self, text: str) -> StepOutput:
        action = last_action_line(text)
        if action is None:
            return StepOutput(ONE_ACTION_ONLY, 0, False)
        answer = self._post("step", {"action": action})
        self.info = {"observation": answer["observation"], "reward": answer["reward"], "done": answer["done"]}
        return StepOutput(answer["observation"], answer["reward"], answer["done"])

    def reset(self, idx: int = 0) -> dict[str, Any]:
        answer = self._post("reset", {"data_idx": idx})
        self.info.update({"observation": answer["observation"], "reward": 0, "done": False})
        return answer


class BabyAIEnvClient(AgentGymEnvClient):
    env_name = "BabyAI"

    def step(self, text: str) -> StepOutput:
        action = last_action_line(text)
        if action is None:
            return StepOutput(ONE_ACTION_ONLY, 0, False)
        answer = self._post("step", {"action": action})
        self.info = {key: answer[key] for key in ("observation", "reward", "score", "done")}
        return StepOutput(answer["observation"], answer["score"], answer["done"])

    def reset(self, data_idx: int = 0) -> dict[str, Any]:
        answer = self._post("reset", {"data_idx": data_idx})
        self.info = {key: answer[key] for key in ("observation", "reward", "score", "done")}
        return answer


def react_action(text: str) -> str:
    """AgentGym's ReAct parsing (its default action format): the text after the last ``Action:``, stripped;
    without one, the whole text where it looks like a WebShop action, else nothing."""
    parts = text.rsplit("Action:", 1)
    if len(parts) == 2:
        return parts[1].strip()
    return text.strip() if ("search[" in text or "click[" in text) else ""


class SciworldEnvClient(AgentGymEnvClient):
    env_name = "SciWorld"

    def step(self, text: str) -> StepOutput:
        if text.endswith("</s>"):
            text = text[:-5]  # sic: AgentGym's client cuts five characters for the four of "</s>"
        answer = self._post("step", {"action": react_action(text)})
        self.info = {key: answer[key] for key in ("observation", "reward", "score", "done")}
        return StepOutput(answer["observation"], answer["score"], answer["done"])

    def reset(self, data_idx: int = 0) -> dict[str, Any]:
        answer = self._post("reset", {"data_idx": data_idx})
        self.info = {
            "observation": answer["task_description"] + "\n" + answer["observation"],
            "reward": 0,
            "score": 0,
            "done": False,
        }
        return answer


CLIENTS: dict[str, type[AgentGymEnvClient]] = {
    "textcraft": TextCraftEnvClient,
    "babyai": BabyAIEnvClient,
    "sciworld": SciworldEnvClient,
}
