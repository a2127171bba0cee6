"""The rehearsal's own parts that run outside verl's trainer: the update-direction arithmetic, and eval's
checkpoint policy served by the CPU chat server (the tiny model, a real HTTP server process, eval's client).
The rehearsal as a whole runs with `make rehearse VERL_LINE=0.7|0.9` (CI runs both)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl")


def test_the_direction_record_tells_right_from_wrong() -> None:
    from webshop_trainer.rehearsal.direction import right_way, strict_way, summarize

    before = [torch.tensor([-1.0, -2.0]), torch.tensor([-1.0]), torch.tensor([-3.0, -3.0])]
    advantages = [1.0, -1.0, 0.0]
    right = summarize(before, [before[0] + 0.5, before[1] - 0.25, before[2]], advantages, step=1)
    assert (right["positive"], right["negative"]) == (1, 1)
    assert right["positive_mean_change"] == pytest.approx(0.5) and right[
        "negative_mean_change"
    ] == pytest.approx(-0.25)
    assert right_way(right) and right["advantage_weighted_change"] == pytest.approx(0.75)
    wrong = summarize(before, [before[0] - 0.5, before[1] + 0.25, before[2]], advantages, step=1)
    assert not right_way(wrong)
    # every response a little less likely, the positive one least so: the right way, not in absolute terms
    shifted = summarize(before, [before[0] - 0.01, before[1] - 0.3, before[2] - 0.1], advantages, step=1)
    assert right_way(shifted) and not strict_way(shifted) and strict_way(right)
    assert not right_way(summarize(before, before, [0.0, 0.0, 0.0], step=1))  # no advantage: nothing shown


def test_sampling_is_greedy_at_zero_and_respects_top_k() -> None:
    from webshop_trainer.rehearsal.generation import sample_token

    logits = torch.tensor([0.0, 3.0, 1.0, 2.0])
    generator = torch.Generator().manual_seed(0)
    assert sample_token(logits, 0.0, -1, 1.0, generator) == 1
    assert {sample_token(logits, 1.0, 2, 1.0, generator) for _ in range(200)} == {1, 3}
    assert {sample_token(logits, 5.0, -1, 0.01, generator) for _ in range(50)} == {1}  # nucleus of one


@pytest.mark.slow
def test_eval_serves_a_checkpoint_on_cpu_through_the_checkpoint_policy(generated_catalog_dir: Path,
                                                                        tmp_path: Path) -> None:  # fmt: skip
    from webshop_trainer.evaluation.policies import CheckpointPolicy
    from webshop_trainer.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", generated_catalog_dir)
    policy = CheckpointPolicy(model, server="cpu", log_path=tmp_path / "server.log", startup_timeout=120,
                              max_tokens=8, temperature=0.0)  # fmt: skip
    assert policy.command()[1:3] == ["-m", "webshop_trainer.rehearsal.chat_server"]

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
