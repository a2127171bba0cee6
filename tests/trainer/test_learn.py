"""``make learn``'s judgement and bookkeeping (agent_trainer.rehearsal.learn): the paired statistics that decide
``learned``, the compute match of the supervised control, the overrides of the test config, the curve and report,
and the ``reward_zero`` bug that must make a run report ``learned: false``."""

from __future__ import annotations

import asyncio
import json
import math
from types import SimpleNamespace

import pytest

from agent_trainer.rehearsal import learn


def _eval(successes: list[bool], rewards: list[float] | None = None) -> dict:
    rewards = rewards or [float(s) for s in successes]
    return {
        "per_task": {
            t: {"success": s, "reward": r} for t, (s, r) in enumerate(zip(successes, rewards, strict=True))
        }
    }


def test_mcnemar_exact_matches_the_binomial_tail():
    # 8 gained, 1 lost: two-sided p = 2 * P(X <= 1 | n=9, 1/2) = 2 * 10/512
    before = [False] * 8 + [True] + [True] * 5
    after = [True] * 8 + [False] + [True] * 5
    test = learn.mcnemar_exact(before, after)
    assert (test["gained"], test["lost"]) == (8, 1)
    assert test["p_value"] == pytest.approx(20 / 512)
    assert learn.mcnemar_exact([True, False], [True, False])["p_value"] == 1.0
    with pytest.raises(ValueError):
        learn.mcnemar_exact([True], [True, False])


def test_a_clear_rise_is_learned_and_no_change_is_not():
    before = _eval([False] * 30 + [True] * 10)
    rose = _eval([True] * 20 + [False] * 10 + [True] * 10)
    comparison = learn.compare(before, rose)
    assert comparison["success_diff"] == pytest.approx(0.5)
    assert comparison["success_diff_ci95"][0] > 0
    assert comparison["p_value"] < 0.001
    assert learn.learned(comparison)
    # the same outcomes (what a zeroed reward leaves: no update, the same greedy eval) never count as learned
    same = learn.compare(before, before)
    assert same["success_diff"] == 0 and same["success_diff_ci95"] == [0.0, 0.0] and same["p_value"] == 1.0
    assert not learn.learned(same)
    # a rise within the noise (one task) has an interval that reaches 0
    noisy = learn.compare(before, _eval([True] + [False] * 29 + [True] * 10))
    assert noisy["success_diff"] > 0 and not learn.learned(noisy)


def _sampled(rates: list[float], samples: int = 8) -> dict:
    return {
        "metrics": {"samples_per_task": samples},
        "per_task": {t: {"success": r, "reward": r} for t, r in enumerate(rates)},
    }


def test_sampled_evals_are_judged_per_task_with_a_permutation_test():
    """k episodes per task at the rollout temperature: per-task mean success, the bootstrap over tasks, and the
    sign-flip test instead of McNemar (which needs one 0/1 outcome per task)."""
    before = _sampled([0.0] * 20 + [0.25] * 20 + [0.5] * 20)
    rose = _sampled([0.125] * 20 + [0.375] * 20 + [0.5] * 20)
    comparison = learn.compare(before, rose)
    assert comparison["success_diff"] == pytest.approx(0.25 / 3)
    assert comparison["test"].startswith("paired sign-flip") and "mcnemar" not in comparison
    assert comparison["p_value"] < 0.001 and learn.learned(comparison)
    assert (comparison["tasks_better"], comparison["tasks_worse"]) == (40, 0)
    same = learn.compare(before, before)
    assert same["p_value"] == 1.0 and same["success_diff_ci95"] == [0.0, 0.0] and not learn.learned(same)
    # as many tasks worse as better by the same amount: no rise
    mixed = learn.compare(before, _sampled([0.125] * 20 + [0.125] * 20 + [0.5] * 20))
    assert mixed["success_diff"] == pytest.approx(0.0) and not learn.learned(mixed)
    # sampled evals whose every task happens to be 0 or 1 still get the permutation test, not McNemar
    assert learn.compare(_sampled([0.0, 1.0]), _sampled([1.0, 1.0]))["test"].startswith("paired sign-flip")


def test_sign_flip_test_is_exact_for_few_tasks():
    assert learn.sign_flip_test([0.5] * 5) == pytest.approx(2 / 32)
    assert learn.sign_flip_test([0.5, -0.5]) == 1.0
    assert learn.sign_flip_test([0.0, 0.0]) == 1.0
    many = [0.125] * 30 + [-0.125] * 2
    assert learn.sign_flip_test(many, seed=1) == learn.sign_flip_test(many, seed=1) < 0.001


def test_heldout_tasks_never_hold_a_training_task(tmp_path):
    from agent_trainer import env_data

    options = learn.LearnOptions(env="babyai", out_dir=tmp_path)
    tasks = learn.heldout_tasks(options, {**options.recipe(), "heldout": 5, "heldout_max_plan": 0})
    assert tasks == env_data.split_tasks("babyai", "test")[:5]
    assert not set(tasks) & set(env_data.split_tasks("babyai", "train"))
    val = learn.heldout_tasks(learn.LearnOptions(heldout_split="val", out_dir=tmp_path),
                              {**options.recipe(), "heldout": 3, "heldout_max_plan": 0})  # fmt: skip
    assert val == env_data.split_tasks("babyai", "val")[:3]


def test_eval_tasks_option_picks_tasks_of_the_split_only():
    from agent_trainer import env_data
    from agent_trainer.evaluation.env_runner import env_tasks
    from agent_trainer.evaluation.runner import EvalError

    test = env_data.split_tasks("babyai", "test")
    assert env_tasks("babyai", "test", None, [test[3], test[1]]) == [test[1], test[3]]
    with pytest.raises(EvalError, match="not in the test split"):
        env_tasks("babyai", "test", None, [env_data.split_tasks("babyai", "train")[0]])


def test_compare_pairs_by_task_not_by_position():
    before = {"per_task": {1: {"success": True, "reward": 1.0}, 2: {"success": False, "reward": 0.0}}}
    after = {"per_task": {2: {"success": False, "reward": 0.0}, 1: {"success": True, "reward": 1.0}, 9: {
        "success": True, "reward": 1.0}}}  # fmt: skip
    comparison = learn.compare(before, after)
    assert comparison["tasks"] == 2 and comparison["success_diff"] == 0
    with pytest.raises(ValueError):
        learn.compare(before, {"per_task": {5: {"success": True, "reward": 1.0}}})


def test_paired_bootstrap_is_seeded_and_brackets_the_mean():
    before = [0.0] * 20 + [1.0] * 20
    after = [1.0] * 30 + [0.0] * 10
    low, high = learn.paired_bootstrap(before, after, seed=3)
    assert (low, high) == learn.paired_bootstrap(before, after, seed=3)
    assert low <= (sum(after) - sum(before)) / 40 <= high


def test_control_steps_counts_forward_pass_equivalents():
    # GRPO: 1,000 trajectory tokens x (3 + 3 * 1 epoch) = 6,000; SFT: 3 x 500 tokens per step -> 4 steps
    assert learn.control_steps(1000, 1, 500) == 4
    assert learn.control_steps(1000, 2, 500) == 6
    assert learn.control_steps(1, 1, 10_000) == 1
    with pytest.raises(ValueError):
        learn.control_steps(1000, 1, 0)


def test_scale_replaces_the_rehearsals_overrides_and_adds_the_runs():
    options = learn.LearnOptions(env="babyai", seed=7, steps=16, prompts=4, rollouts=8, lr=3e-4)
    recipe = options.recipe()
    overrides = dict(o.split("=", 1) for o, _ in learn.scale(options, recipe, "0.9", 200, 512))
    assert overrides["data.train_batch_size"] == "4"
    assert overrides["actor_rollout_ref.rollout.n"] == "8"
    assert overrides["actor_rollout_ref.actor.optim.lr"] == "0.0003"
    assert overrides["data.max_prompt_length"] == "512"
    assert overrides["data.seed"] == "7"
    assert overrides["trainer.save_freq"] == "16"
    assert overrides["++environments.babyai.max_rounds"] == str(recipe["rounds"])
    assert overrides["actor_rollout_ref.rollout.multi_turn.max_assistant_turns"] == str(recipe["rounds"] + 1)
    assert overrides["actor_rollout_ref.rollout.name"] == "cpu"  # the rehearsal's stand-ins stay
    keys = [o.split("=", 1)[0].lstrip("+") for o, _ in learn.scale(options, recipe, "0.9", 200, 512)]
    assert len(keys) == len(set(keys)), "an override given twice"
    # 16 steps x 4 prompts over 200 tasks: one epoch
    assert overrides["trainer.total_epochs"] == "1"


def test_recipe_rejects_unknown_environments_and_keys():
    with pytest.raises(ValueError, match="no recipe"):
        learn.LearnOptions(env="sciworld").recipe()
    with pytest.raises(ValueError, match="unknown recipe key"):
        learn.LearnOptions(overrides={"nope": 1}).recipe()
    assert learn.LearnOptions(overrides={"sft_steps": 5}).recipe()["sft_steps"] == 5


def test_curve_reads_the_per_environment_metrics(tmp_path):
    metrics = [{"step": 0, "env/babyai/reward_mean": 9.0},
               {"step": 1, "env/babyai/reward_mean": 0.2, "env/babyai/success_rate": 0.25,
                "env/babyai/invalid_rate": 0.1, "response_length/mean": 80.0},
               {"step": 2, "critic/score/mean": 0.4}]  # fmt: skip
    curve = learn.curve(metrics, "babyai")
    assert curve["step"] == [1.0, 2.0]
    assert curve["reward"] == [0.2, 0.4]
    assert curve["success"][0] == 0.25 and math.isnan(curve["success"][1])
    summary = {"env": "babyai", "seed": 0, "steps": 2, "learned": True, "curve": curve,
               "before": {"success_rate": 0.2}, "after": {"success_rate": 0.3},
               "control": {"after": {"success_rate": 0.25}}}  # fmt: skip
    page = learn.write_report(summary, tmp_path / "report.html")
    text = page.read_text()
    assert text.count("<svg") == 2 and "held-out success" in text and "SFT control" in text
    assert (tmp_path / "report.svg").read_text().startswith("<svg")


def test_main_rejects_bad_arguments(capsys):
    with pytest.raises(SystemExit) as exit_:
        learn.main(["--rollouts", "1"])
    assert exit_.value.code == 2
    with pytest.raises(SystemExit) as exit_:
        learn.main(["--set", "sft_steps"])
    assert exit_.value.code == 2
    with pytest.raises(SystemExit) as exit_:
        learn.main(["--eval-samples", "0"])
    assert exit_.value.code == 2
    with pytest.raises(SystemExit):
        learn.main(["--help"])
    assert "learned" in capsys.readouterr().out


def test_reward_zero_zeroes_what_every_agent_loop_hands_to_verl(monkeypatch):
    """The bug ``make learn`` must not learn through: the agent loops' reward zeroed before the advantage."""
    from agent_trainer import agent_loop
    from agent_trainer.rehearsal import inject

    async def run(self, *args, **kwargs):
        return SimpleNamespace(reward_score=0.75)

    with inject.restored():  # the bug must not leak into the next test
        monkeypatch.setattr(agent_loop.EnvAgentLoop, "run", run)
        monkeypatch.setenv(inject.ENV, "reward_zero")
        assert inject.apply() == ["reward_zero"]
        for loop in (agent_loop.EnvAgentLoop, agent_loop.WebShopAgentLoop):
            output = asyncio.run(loop.run(object(), {}))
            assert output.reward_score == 0.0, loop.__name__
        inject.apply()  # idempotent: wrapped once
        assert agent_loop.EnvAgentLoop.run.agentrl_injected == frozenset({"reward_zero"})
    assert not hasattr(agent_loop.EnvAgentLoop.run, "agentrl_injected")
    monkeypatch.setenv(inject.ENV, "reward_zero,nonsense")
    with pytest.raises(ValueError, match="unknown bug"):
        inject.injected()


def test_summary_keys_are_the_documented_ones(tmp_path, monkeypatch):
    """A run that fails early still writes summary.json with every documented key."""
    monkeypatch.setattr(
        learn, "expert_plans", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no expert"))
    )
    summary = learn.run_learn(learn.LearnOptions(out_dir=tmp_path, control=False))
    written = json.loads((tmp_path / "summary.json").read_text())
    for key in ("learned", "env", "seed", "verl_version", "seconds", "errors"):
        assert key in written
    assert written["learned"] is False and "no expert" in written["errors"][0]
    assert summary["report"].endswith("report.html")


def test_a_run_with_a_bug_never_overwrites_a_clean_one(tmp_path, monkeypatch):
    options = learn.LearnOptions(out_dir=tmp_path, seed=3)
    monkeypatch.delenv("AGENTRL_REHEARSAL_INJECT", raising=False)
    assert learn.run_dir(options) == (tmp_path / "babyai" / "seed3").resolve()
    monkeypatch.setenv("AGENTRL_REHEARSAL_INJECT", "reward_zero")
    assert learn.run_dir(options) == (tmp_path / "babyai" / "seed3-reward_zero").resolve()
