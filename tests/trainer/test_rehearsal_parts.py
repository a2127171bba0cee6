"""The rehearsal's own parts that run outside verl's trainer: the update-direction arithmetic, and eval's
checkpoint policy served by the CPU chat server (the tiny model, a real HTTP server process, eval's client).
The rehearsal as a whole runs with `make rehearse VERL_LINE=0.7|0.9` (CI runs both)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl")


def test_the_direction_record_tells_right_from_wrong_on_the_loss_tokens_only() -> None:
    import numpy as np

    from agent_trainer.rehearsal.checks import Trajectory, direction_ok, direction_record, grpo_advantages

    def trajectory(before: list[float], after: list[float], mask: list[int]) -> Trajectory:
        return Trajectory(ids=[0] * (1 + len(mask)), prompt_len=1, mask=mask, score=0.0, uid="g",
                          before=np.array(before), after=np.array(after))  # fmt: skip

    advantages = [1.0, -1.0, 0.0]
    right = direction_record(1, [trajectory([-1, -2], [-0.5, -1.5], [1, 1]), trajectory([-1], [-1.25], [1]),
                                 trajectory([-3, -3], [-3, -3], [1, 1])], advantages)  # fmt: skip
    assert (right["positive"], right["negative"]) == (1, 1) and right["right_way"] and right["informative"]
    assert right["positive_mean_change"] == pytest.approx(0.5) and right[
        "negative_mean_change"
    ] == pytest.approx(-0.25)
    assert right["weighted_change"] == pytest.approx((1.0 * 1.0 + 0.25) / 5)  # sum_i A_i sum_t dlogp / T
    wrong = direction_record(1, [trajectory([-1, -2], [-1.5, -2.5], [1, 1]), trajectory([-1], [-0.75], [1]),
                                 trajectory([-3, -3], [-3, -3], [1, 1])], advantages)  # fmt: skip
    assert not wrong["right_way"] and not direction_ok([right, wrong]) and direction_ok([right])
    # an env page (mask 0) moved the wrong way does not count: only the loss tokens do
    paged = direction_record(1, [trajectory([-1, -2], [-0.5, -9.0], [1, 0]), trajectory([-1, -1], [-1.25, 5.0], [1, 0]),
                                 trajectory([-3], [-3], [1])], advantages)  # fmt: skip
    assert paged["right_way"] and paged["loss_tokens"] == 3
    # no advantage: nothing shown, and a run without an informative step is not judged right
    flat = direction_record(1, [trajectory([-1], [-1], [1])], [0.0])
    assert not flat["informative"] and not direction_ok([flat])
    # GRPO's advantage from its definition: per group, (r - mean) / (std + eps); a group of one is 0
    assert grpo_advantages([1.0, 0.0, 5.0], ["a", "a", "b"]) == pytest.approx(
        [0.7071, -0.7071, 0.0], abs=1e-3
    )


def test_sampling_is_greedy_at_zero_and_respects_top_k() -> None:
    from agent_trainer.rehearsal.generation import sample_token

    logits = torch.tensor([0.0, 3.0, 1.0, 2.0])
    generator = torch.Generator().manual_seed(0)
    assert sample_token(logits, 0.0, -1, 1.0, generator) == 1
    assert {sample_token(logits, 1.0, 2, 1.0, generator) for _ in range(200)} == {1, 3}
    assert {sample_token(logits, 5.0, -1, 0.01, generator) for _ in range(50)} == {1}  # nucleus of one


@pytest.mark.slow
def test_eval_serves_a_checkpoint_on_cpu_through_the_checkpoint_policy(generated_catalog_dir: Path,
                                                                        tmp_path: Path) -> None:  # fmt: skip
    from agent_trainer.evaluation.policies import CheckpointPolicy
    from agent_trainer.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", generated_catalog_dir)
    policy = CheckpointPolicy(model, server="cpu", log_path=tmp_path / "server.log", startup_timeout=120,
                              max_tokens=8, temperature=0.0)  # fmt: skip
    assert policy.command()[1:3] == ["-m", "agent_trainer.rehearsal.chat_server"]

    async def chat() -> tuple[str, dict[str, int]]:
        await policy.start()
        try:
            return await policy.complete([{"role": "user", "content": "Instruction: find a desk"}])
        finally:
            await policy.close()

    reply, usage = asyncio.run(chat())
    assert isinstance(reply, str) and 0 < usage["completion_tokens"] <= 8 and usage["prompt_tokens"] > 0
    with pytest.raises(Exception, match="sglang or cpu"):
        CheckpointPolicy(model, server="vllm")


def test_the_rollout_reports_the_log_probs_of_the_distribution_it_sampled_from() -> None:
    """At temperature T the rollout server samples from softmax(logits / T) and must report those log-probs (what
    verl's actor computes for old_log_probs), not the T = 1 ones; teacher-forced scoring gives the same numbers."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agent_trainer.rehearsal.generation import generate_tokens, score_tokens

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    model = Qwen2ForCausalLM(config).eval()
    prompt = [1, 5, 9, 3]
    tokens, reported, _ = generate_tokens(model, prompt, 6, temperature=1.7, top_k=-1, top_p=1.0,
                                          generator=torch.Generator().manual_seed(0), eos_ids=set())  # fmt: skip
    assert len(tokens) == 6
    assert score_tokens(model, prompt, tokens, 1.7) == pytest.approx(reported, abs=1e-5)
    assert score_tokens(model, prompt, tokens, 1.0) != pytest.approx(reported, abs=1e-3)


def test_webshop_is_rehearsed_on_its_contract_core_like_any_environment(
    generated_catalog_dir: Path, expert_plans_generated: dict[int, list[str]]
) -> None:
    """WebShop's in-process core is its contract env (``WebShopTextEnv``, as a replica makes it): the expert's
    episode is rendered through the spec with the goal's instruction, the replay pays the purchase less the penalty
    of a reply without an action, and a trajectory of another goal set than the core plays is refused."""
    from agent_trainer.rehearsal.checks import Trajectory, make_core, replay_episode
    from agent_trainer.rehearsal.warm_start import expert_episode, expert_plan

    core = make_core("webshop", generated_catalog_dir)
    goal = next(iter(expert_plans_generated))
    plan = expert_plan("webshop", goal, core=core)
    assert plan == expert_plans_generated[goal]
    examples, outcome = expert_episode("webshop", goal, plan, core=core, max_observation_chars=200)
    assert outcome == {"success": True, "env_reward": 1.0, "steps": len(plan)}
    assert core.reset(goal).info["instruction"] in examples[0][0][1]["content"]
    replies = [f"Action: {plan[0]}", "I would rather not say.", *(f"Action: {a}" for a in plan[1:])]

    def trajectory(goal_set: str) -> Trajectory:
        return Trajectory(ids=[0], prompt_len=1, mask=[], score=0.0, uid="u", goal=goal, goal_set=goal_set,
                          env_id="webshop")  # fmt: skip

    replayed = replay_episode(trajectory("synthetic"), replies, 0.25, core)
    assert replayed == {
        "score": pytest.approx(0.75),
        "env_reward": 1.0,
        "success": 1.0,
        "steps": len(replies),
    }
    with pytest.raises(ValueError, match="goal set 'human'"):
        replay_episode(trajectory("human"), replies, 0.25, core)


def test_every_run_is_laid_out_by_its_environments() -> None:
    """WebShop alone is a run like any other: its folders, config and eval name its environment."""
    from agent_trainer.rehearsal.run import RehearsalOptions, training_config

    assert RehearsalOptions().label == "-webshop"
    assert RehearsalOptions(envs=("textcraft", "webshop")).label == "-textcraft+webshop"
    for line in ("0.7", "0.9"):
        assert training_config(line, ("webshop",)) == "webshop_grpo_test"
        assert training_config(line, ("textcraft", "webshop")) == "mixed_grpo_test"
