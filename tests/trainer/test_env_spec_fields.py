"""What sets WebShop apart is its spec's fields, not its id (issue 37): the report's words, the env cluster a run
reuses or starts, and the replay of an episode in process read ``EnvSpec`` (``name``, ``needs_catalog``,
``eval_protocol``), so an environment that declares the same fields is treated the same way."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from agent_trainer import envs
from agent_trainer.evaluation import report_html
from agent_trainer.harness import cluster

URL = "http://service"


@pytest.fixture
def shop(monkeypatch: pytest.MonkeyPatch) -> envs.EnvSpec:
    """A fifth environment, ``shop``: WebShop's spec under its own id (a plugin's), so every field WebShop declares."""
    spec = dataclasses.replace(envs.get("webshop"), env_id="shop", title="Shop: WebShop under another id")
    installed = envs.plugins()  # Sokoban's among them
    monkeypatch.setattr(envs, "plugins", lambda: {**installed, "shop": spec})
    return spec


def record(env: str | None = None) -> dict[str, Any]:
    found = {"goal": 3, "reward": 1.0, "success": True, "steps": 1, "turns": []}
    return found if env is None else found | {"env": env}


def test_the_reports_name_and_show_each_environment_as_its_spec_says(shop: envs.EnvSpec) -> None:
    """Titles are the specs' names (a record without ``env`` is WebShop's runner's); where eval plays the pages (the
    spec's ``eval_protocol``), a turn is captioned as a page, no system prompt is folded above the episodes and
    the summary is the page protocol's (the catalog's)."""
    titles = [
        report_html.env_title(e) for e in (None, "webshop", "textcraft", "babyai", "sciworld", "sokoban")
    ]
    assert titles == ["WebShop", "WebShop", "TextCraft", "BabyAI", "SciWorld", "Sokoban"]
    assert report_html.env_title("shop") == "Shop" and report_html.env_title("alfworld") == "alfworld"
    pages = {
        e: report_html._episode_payload(record(e))["page"] for e in (None, "shop", "textcraft", "alfworld")
    }
    assert pages == {None: True, "shop": True, "textcraft": False, "alfworld": False}
    assert "ep.page ?" in report_html._JS and 'ep.env === "webshop"' not in report_html._JS
    assert report_html.system_prompt_html(None) == report_html.system_prompt_html("shop") == ""
    assert envs.get("textcraft").system_prompt[:40] in report_html.system_prompt_html("textcraft")
    metrics = {"score": 75.0, "score_ci95": [50.0, 100.0], "success_rate": 0.5, "success_rate_ci95": [0.1, 0.9],
               "episodes": 2, "mean_steps": 3.0, "invalid_action_rate": 0.0, "truncated_rate": 0.0,
               "mean_reward": 0.75}  # fmt: skip
    catalog_rows = [label for label, _ in report_html.summary_rows(metrics)]
    assert catalog_rows[0] == "Score (mean reward × 100)"
    assert [label for label, _ in report_html.summary_rows(metrics | {"env": "shop"})] == catalog_rows
    assert report_html.summary_rows(metrics | {"env": "textcraft"})[0][0].startswith("Success rate (")


@pytest.fixture
def service(monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], list[list[str] | None]]:
    """The service at :data:`URL` as the probes see it (``/<env>/v1/info`` -> its answer; filled by the test), and
    the environments each cluster of our own was started to serve."""
    answers: dict[str, Any] = {}
    started: list[list[str] | None] = []

    def start(catalog_dir: Path, run_dir: Path, replicas: int = 2, served: list[str] | None = None) -> Any:
        started.append(served)
        return cluster.Cluster(url="http://own", reused=False)

    monkeypatch.setattr(cluster, "get_json", lambda url, timeout=2.0: answers.get(url))
    monkeypatch.setattr(cluster, "start_cluster", start)
    return answers, started


def test_a_service_is_reused_when_it_serves_every_environment_of_the_run(
    service: tuple[dict[str, Any], list[list[str] | None]], tmp_path: Path
) -> None:
    """Reusing a service needs each of the run's environments to answer, and the info of those that play the
    catalog (their spec ``needs_catalog``) to name this catalog. A cluster of the run's own also serves the
    environments that play the catalog."""
    answers, started = service
    answers |= {f"{URL}/webshop/v1/info": {"fingerprint": "abc"}, f"{URL}/textcraft/v1/info": {"tasks": 544}}
    reuse = cluster.start_or_reuse_env_cluster
    assert reuse(tmp_path, "abc", ["textcraft"], tmp_path, URL + "/").reused and started == []
    assert reuse(tmp_path, "abc", ["textcraft", "webshop"], tmp_path, URL).reused and started == []
    assert not reuse(tmp_path, "another", ["webshop"], tmp_path, URL).reused  # another catalog
    assert not reuse(tmp_path, "abc", ["babyai"], tmp_path, URL).reused  # an environment it does not serve
    assert not reuse(tmp_path, "abc", ["textcraft"], tmp_path, None).reused  # no service named
    assert started == [["webshop"], ["webshop", "babyai"], ["webshop", "textcraft"]]


def test_a_service_without_the_catalogs_environments_is_reused_for_a_run_without_them(
    service: tuple[dict[str, Any], list[list[str] | None]], tmp_path: Path
) -> None:
    """``make train-test ENV=babyai`` serves BabyAI alone: its preflight reuses that service (a run started its own
    cluster in the trainer container, which has no environment extras, when WebShop was not served too)."""
    answers, started = service
    answers[f"{URL}/babyai/v1/info"] = {"tasks": 1000}
    assert cluster.start_or_reuse_env_cluster(tmp_path, "abc", ["babyai"], tmp_path, URL).reused
    assert not cluster.start_or_reuse_env_cluster(
        tmp_path, "abc", ["babyai", "webshop"], tmp_path, URL
    ).reused
    assert started == [["webshop", "babyai"]]


def test_an_environment_that_needs_the_catalog_is_served_and_checked_like_webshop(
    service: tuple[dict[str, Any], list[list[str] | None]], tmp_path: Path, shop: envs.EnvSpec
) -> None:
    answers, started = service
    answers |= {f"{URL}/webshop/v1/info": {"fingerprint": "abc"}, f"{URL}/textcraft/v1/info": {"tasks": 544}}
    answers[f"{URL}/shop/v1/info"] = {"fingerprint": "old"}
    assert not cluster.start_or_reuse_env_cluster(
        tmp_path, "abc", ["shop", "textcraft"], tmp_path, URL
    ).reused
    assert cluster.start_or_reuse_env_cluster(tmp_path, "abc", ["textcraft"], tmp_path, URL).reused
    assert started == [["webshop", "shop", "textcraft"]]
    answers[f"{URL}/shop/v1/info"] = {"fingerprint": "abc"}
    assert cluster.start_or_reuse_env_cluster(tmp_path, "abc", ["shop", "textcraft"], tmp_path, URL).reused


def test_webshops_episode_replays_through_its_spec_as_the_rehearsal_replays_it(
    generated_catalog: Any, expert_plans_generated: dict[int, list[str]]
) -> None:
    """``envs.replay.replay_score`` plays WebShop as any environment (its contract core, ``WebShopTextEnv``: what
    the rehearsal replays with), with the reward the simulator itself gives the plan, a reply without an action
    included."""
    from agent_envs.envs.webshop.core.env import WebShopEnv
    from agent_envs.envs.webshop.textenv import WebShopTextEnv
    from agent_trainer.envs.replay import replay_score

    goal, plan = next(iter(expert_plans_generated.items()))
    replies = [f"Action: {plan[0]}", "I would rather not say.", *(f"Action: {action}" for action in plan[1:])]
    core = WebShopTextEnv(generated_catalog)
    replayed = replay_score("webshop", goal, replies, penalty=0.25, core=core)
    simulator = WebShopEnv(generated_catalog)
    state, reward = simulator.reset(goal, goal_set="synthetic").state, 0.0
    for action in plan:
        step = simulator.step(state, action)
        state, reward = step.state, float(step.reward)
    assert replayed["env_reward"] == reward == 1.0
    assert replayed["success"] == 1.0 and replayed["score"] == pytest.approx(0.75)
    assert replayed["steps"] == len(replies)
    assert replay_score("webshop", goal, replies[:2], core=core) == {
        "score": 0.0,
        "env_reward": 0.0,
        "success": 0.0,
        "steps": 2.0,
    }


def test_the_report_names_an_environments_groups_as_its_spec_says(shop: envs.EnvSpec) -> None:
    """BabyAI's ``by_category`` groups are levels (its spec's ``category_label``); the others' are categories."""
    metrics = {"reward_histogram": {"labels": ["0", "1"], "counts": [1, 1]}, "steps_histogram": {"labels": ["1"],
               "counts": [2]}, "by_category": {"a": {"success_rate": 0.5, "episodes": 2}}}  # fmt: skip
    charts = {e: "".join(report_html._charts({**metrics, "env": e})) for e in ("babyai", "textcraft", "shop")}
    assert "Success rate by level" in charts["babyai"]
    assert "Success rate by category" in charts["textcraft"] and "Success rate by category" in charts["shop"]


def test_an_environments_splits_order_and_data_core_come_from_its_spec(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The dataset builder reads a spec's ``task_count``, ``split_of`` and ``task_order`` (no table of its own), and
    builds rows on the spec's ``data_core`` where it has one: one it cannot run here says so and names
    ``--env-url``, or, given a service, takes its resets."""
    from agent_trainer import env_data

    def missing(workers: int) -> Any:
        raise envs.CoreUnavailable("no simulator here: install it")

    spec = dataclasses.replace(envs.get("textcraft"), env_id="grid", task_count=10,
                               split_of=lambda t: "test" if t < 4 else "train",
                               task_order=lambda tasks: sorted(tasks, reverse=True), data_core=missing)  # fmt: skip
    installed = envs.plugins()
    monkeypatch.setattr(envs, "plugins", lambda: {**installed, "grid": spec})
    assert env_data.split_tasks("grid", "test") == [3, 2, 1, 0]
    assert env_data.split_tasks("grid", "train") == [9, 8, 7, 6, 5, 4]
    with pytest.raises(env_data.DataError, match="grid: no simulator here: install it; or give --env-url"):
        env_data.RowBuilder("grid")
    monkeypatch.setenv("GRID_DATA_WORKERS", "3")
    builder = env_data.RowBuilder("grid", env_url="http://service/")
    assert (builder.env_url, builder.workers, builder.core) == ("http://service", 3, None)
    monkeypatch.setenv("GRID_DATA_WORKERS", "x")
    with pytest.raises(env_data.DataError, match="GRID_DATA_WORKERS must be a whole number"):
        env_data.RowBuilder("grid", env_url="http://service/")


def test_webshops_messages_read_the_instruction_and_actions_where_its_contract_env_answers_them(
    generated_catalog: Any, expert_plans_generated: dict[int, list[str]]
) -> None:
    """In process (the rehearsal's warm start and replays, ``make learn``) WebShop's contract env answers the
    instruction and the available actions in ``info``; its routes answer them at the top. The spec renders both the
    same, so the model is warm-started on the very turns the served episodes show it."""
    from agent_envs.envs.webshop.textenv import WebShopTextEnv
    from agent_trainer import envs
    from agent_trainer.rehearsal.warm_start import answer

    spec, core = envs.get("webshop"), WebShopTextEnv(generated_catalog)
    goal, plan = next(iter(expert_plans_generated.items()))
    first = answer(core.reset(goal))
    served = {**first, "instruction": first["info"]["instruction"],
              "available_actions": first["info"]["available_actions"]}  # fmt: skip
    assert first["info"]["instruction"] and spec.first_message(first) == spec.first_message(served)
    assert spec.first_message(first).startswith(f"Instruction: {first['info']['instruction']}\n")
    parsed = spec.parse(f"Action: {plan[0]}")
    step = answer(core.step(first["state"], plan[0]))
    served_step = {**step, "available_actions": step["info"]["available_actions"]}
    outcome = spec.outcome(step, parsed)
    assert spec.step_message(step, parsed, outcome, 0) == spec.step_message(served_step, parsed, outcome, 0)
