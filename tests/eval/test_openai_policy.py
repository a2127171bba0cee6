"""The ``openai`` policy against a scripted OpenAI-compatible server, through the real cluster; the
``checkpoint`` policy's command line and its error without sglang."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from _eval_support import ScriptedChatServer

from agent_trainer.config import TURN_TOKENS
from agent_trainer.envs.webshop import prompts
from agent_trainer.eval_cli import EXIT_ERROR, EXIT_INCOMPLETE, main
from agent_trainer.evaluation import policies
from agent_trainer.evaluation.policies import (
    SGLANG_MISSING,
    CheckpointPolicy,
    ContextLengthExceeded,
    OpenAIPolicy,
    PolicyError,
    sglang_command,
)
from agent_trainer.evaluation.runner import EvalConfig, PolicySpec, evaluate

SAMPLES = 8


def run_openai(
    cluster: dict, chat: ScriptedChatServer, out: Path, samples: int = SAMPLES, **spec: Any
) -> Any:
    config = EvalConfig(
        out=out,
        url=cluster["url"],
        split="test",
        goal_set="synthetic",
        max_samples=samples,
        concurrency=4,
        progress=False,
    )
    options = {"retries": 3, "backoff": 0.01, **spec}
    return evaluate(config, PolicySpec(name="openai", base_url=chat.base_url, model="scripted", **options))


@pytest.mark.cluster
def test_openai_policy_uses_the_training_prompt_and_retries(
    eval_cluster: dict, chat: ScriptedChatServer, tmp_path: Path
) -> None:
    chat.fail_next = [503, 429, 500]  # three transient failures, each retried
    result = run_openai(eval_cluster, chat, tmp_path)
    m = result.metrics
    assert m["complete"] and m["episodes"] == SAMPLES and m["failed_episodes"] == []
    assert m["success_rate"] == 1.0  # the scripted replies carry the expert's actions
    assert chat.statuses[:3] == [503, 429, 500] and chat.statuses.count(200) == len(chat.statuses) - 3
    assert m["policy"]["name"] == "openai" and m["policy"]["model"] == "scripted"
    assert m["endpoint"]["retried"] == 3

    request = chat.requests[-1]
    assert (
        request["model"] == "scripted"
        and request["temperature"] == 0.1
        and request["max_tokens"] == TURN_TOKENS
    )
    system, first_user = request["messages"][:2]
    assert system == {"role": "system", "content": prompts.SYSTEM_PROMPT}
    assert first_user["role"] == "user" and first_user["content"].startswith("Instruction: ")
    assert "\nPage: WebShop [SEP] Instruction: [SEP] " in first_user["content"]
    roles = [message["role"] for message in request["messages"]]
    assert roles[2:] == ["assistant", "user"] * ((len(roles) - 2) // 2)

    records = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    step = records[0]["turns"][0]
    assert step["output"].startswith("The page shows what I need") and step["action"].startswith("search[")
    assert records[0]["usage"]["completion_tokens"] == 12 * records[0]["steps"]


@pytest.mark.cluster
def test_unparseable_reply_is_an_invalid_step_with_the_corrective_message(
    eval_cluster: dict, chat: ScriptedChatServer, plans_by_instruction: dict, tmp_path: Path
) -> None:
    instruction = next(iter(plans_by_instruction))  # goal 0's
    chat.garbage_first_turn = {instruction}
    m = run_openai(eval_cluster, chat, tmp_path, samples=1).metrics
    assert m["episodes"] == 1 and m["success_rate"] == 1.0
    assert m["unparsed_output_rate"] > 0 and m["invalid_action_rate"] == m["unparsed_output_rate"]
    record = json.loads((tmp_path / "trajectories.jsonl").read_text())
    assert record["turns"][0]["action"] is None and record["turns"][0]["valid"] is False
    assert record["unparsed_outputs"] == 1
    second_request = chat.requests[1]["messages"]
    assert second_request[3]["role"] == "user"
    assert second_request[3]["content"].startswith(prompts.INVALID_REPLY_MESSAGE)


@pytest.mark.cluster
def test_dead_endpoint_is_reported_not_scored(
    eval_cluster: dict, chat: ScriptedChatServer, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    chat.always_fail = 500
    out = tmp_path / "dead"
    code = main(
        [
            "eval",
            "--policy",
            "openai",
            "--base-url",
            chat.base_url,
            "--model",
            "scripted",
            "--url",
            eval_cluster["url"],
            "--goal-set",
            "synthetic",
            "--max-samples",
            "6",
            "--concurrency",
            "1",
            "--retries",
            "1",
            "--retry-backoff",
            "0.01",
            "--max-policy-errors",
            "2",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == EXIT_INCOMPLETE
    err = capsys.readouterr().err
    assert "INCOMPLETE" in err and "HTTP 500" in err and "rerun the same command" in err
    m = json.loads((out / "metrics.json").read_text())
    assert m["complete"] is False and m["episodes"] == 0  # nothing was scored 0 behind our back
    assert len(m["failed_episodes"]) == 2 and m["not_run"] == 4
    assert (out / "trajectories.jsonl").read_text() == ""
    assert chat.statuses == [500] * 4  # 2 episodes x (1 try + 1 retry)
    assert "Incomplete run" in (out / "report.html").read_text()

    chat.always_fail = None  # the endpoint is back: the same command resumes and completes
    code = main(
        [
            "eval",
            "--policy",
            "openai",
            "--base-url",
            chat.base_url,
            "--model",
            "scripted",
            "--url",
            eval_cluster["url"],
            "--goal-set",
            "synthetic",
            "--max-samples",
            "6",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    assert json.loads((out / "metrics.json").read_text())["episodes"] == 6


@pytest.mark.cluster
def test_refused_request_is_not_retried(eval_cluster: dict, chat: ScriptedChatServer, tmp_path: Path) -> None:
    chat.always_fail = 401
    result = run_openai(eval_cluster, chat, tmp_path, samples=2, retries=5)
    assert not result.complete and result.metrics["episodes"] == 0
    assert "HTTP 401" in result.failures[0]["error"]
    assert chat.statuses == [401, 401]  # one request per episode: a 401 does not get better by retrying


def test_context_length_error_ends_the_episode(chat: ScriptedChatServer) -> None:
    chat.fail_next = [400]

    async def go() -> None:
        policy = OpenAIPolicy(chat.base_url, "scripted", retries=0)
        original = chat.answer

        def answer(path: str, body: dict) -> tuple[int, dict]:
            status, payload = original(path, body)
            if status == 400:
                payload = {"error": {"message": "This model's maximum context length is 4096 tokens"}}
            return status, payload

        chat.answer = answer  # type: ignore[method-assign]
        try:
            with pytest.raises(ContextLengthExceeded):
                await policy.complete([{"role": "user", "content": "hi"}])
        finally:
            del chat.answer
            await policy.close()

    asyncio.run(go())


def test_openai_policy_needs_url_and_model() -> None:
    with pytest.raises(PolicyError, match="--base-url"):
        OpenAIPolicy("", "m")
    with pytest.raises(PolicyError, match="--model"):
        OpenAIPolicy("http://x/v1", "")


# ---- checkpoint -------------------------------------------------------------------------------------------
def test_sglang_command_line(tmp_path: Path) -> None:
    command = sglang_command(
        tmp_path / "model",
        31234,
        python="/opt/py/bin/python",
        served_model_name="ckpt",
        extra_args=["--tp", "2"],
    )
    assert command == [
        "/opt/py/bin/python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(tmp_path / "model"),
        "--host",
        "127.0.0.1",
        "--port",
        "31234",
        "--served-model-name",
        "ckpt",
        "--tp",
        "2",
    ]
    policy = CheckpointPolicy(tmp_path, port=31235, server_args=["--mem-fraction-static", "0.8"])
    assert policy.command()[1:] == [
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(tmp_path),
        "--host",
        "127.0.0.1",
        "--port",
        "31235",
        "--served-model-name",
        "checkpoint",
        "--mem-fraction-static",
        "0.8",
    ]
    assert policy.base_url == "http://127.0.0.1:31235/v1" and policy.model == "checkpoint"


def test_checkpoint_without_sglang_fails_clearly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(policies, "sglang_available", lambda python=None: False)
    policy = CheckpointPolicy(tmp_path, port=31236)
    with pytest.raises(PolicyError) as caught:
        asyncio.run(policy.start())
    assert str(caught.value) == SGLANG_MISSING
    assert "--policy openai" in SGLANG_MISSING


@pytest.mark.cluster
def test_cli_checkpoint_without_sglang(
    eval_cluster: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(policies, "sglang_available", lambda python=None: False)
    code = main(
        [
            "eval",
            "--policy",
            "checkpoint",
            "--model-path",
            str(tmp_path),
            "--url",
            eval_cluster["url"],
            "--max-samples",
            "2",
            "--out",
            str(tmp_path / "out"),
            "--no-progress",
        ]
    )
    assert code == EXIT_ERROR
    assert "needs sglang" in capsys.readouterr().err
