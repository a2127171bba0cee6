"""``agent-train report --run``: training curves from verl's metric log (file logger and console output)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from _eval_support import png_is_blank

pytest.importorskip("verl", reason="the metric names come from verl's own code")

from agent_trainer.eval_cli import EXIT_ERROR, EXIT_OK, main
from agent_trainer.evaluation.curves import read_metric_log, write_curves


def verl_step_metrics(step: int) -> dict:
    """One training step's metrics as a real run computes them: verl's compute_data_metrics on a batch that
    carries the reward function's keys, with agent_trainer.verl_main's per-step metrics installed."""
    import numpy as np
    import torch
    from verl import DataProto
    from verl.trainer.ppo import ray_trainer

    from agent_trainer.reward import episode_summary
    from agent_trainer.verl_main import install_step_metrics

    episodes = [episode_summary([0.0] * (3 + i % 3) + [1.0 if i < step % 4 else 0.0]) for i in range(4)]
    scores = torch.zeros(4, 6)
    scores[:, -1] = torch.tensor([e["score"] for e in episodes])
    tensors = {"token_level_scores": scores, "token_level_rewards": scores.clone(),
               "advantages": torch.zeros(4, 6), "returns": torch.zeros(4, 6),
               "responses": torch.ones(4, 6, dtype=torch.long), "attention_mask": torch.ones(4, 10, dtype=torch.long),
               "response_mask": torch.ones(4, 6, dtype=torch.long)}  # fmt: skip
    non_tensors = {key: np.array([e[key] for e in episodes]) for key in episodes[0]}
    non_tensors["__num_turns__"] = np.array([2 * e["steps"] + 2 for e in episodes])  # set by the agent loop
    non_tensors["data_source"] = np.array(["webshop"] * 4, dtype=object)  # the rows' (verl's RLHFDataset)
    original = ray_trainer.compute_data_metrics
    try:
        install_step_metrics()
        return ray_trainer.compute_data_metrics(
            batch=DataProto.from_dict(tensors=tensors, non_tensors=non_tensors), use_critic=False
        )
    finally:
        ray_trainer.compute_data_metrics = original


def fake_run(root: Path, steps: int = 12) -> Path:
    """A run directory as training leaves it: verl's file-logger JSONL (written by verl's FileLogger, metrics
    computed by verl's code) and a console log."""
    from verl.utils.tracking import FileLogger

    run = root / "outputs" / "webshop-test"
    (run / "metrics").mkdir(parents=True)
    (run / "logs").mkdir()
    (run / "checkpoints" / "global_step_5").mkdir(parents=True)
    os.environ["VERL_FILE_LOGGER_PATH"] = str(run / "metrics" / "metrics.jsonl")
    try:
        sink = FileLogger("webshop-grpo", "webshop-test")
    finally:
        del os.environ["VERL_FILE_LOGGER_PATH"]
    for step in range(1, steps + 1):
        data = {
            **verl_step_metrics(step),
            "critic/score/mean": 0.1 + 0.05 * step,
            "actor/pg_loss": -0.01 * math.sin(step),
            "actor/kl_loss": 0.001 * step,
            "actor/ppo_kl": 0.0005 * step,
            "timing_s/step": 30.0,
            "training/global_step": step,
        }
        sink.log(data, step)
    sink.finish()
    (run / "logs" / "train.log").write_text(
        "INFO starting\n"
        "(TaskRunner pid=1) step:1 - critic/score/mean:0.999 - val-core/webshop/reward/mean@1:0.250\n"
        "(TaskRunner pid=1) step:13 - val-core/webshop/reward/mean@1:0.500 - actor/pg_loss:0.010\n"
        "unrelated line with step:x\n"
    )
    (run / "checkpoints" / "global_step_5" / "junk.json").write_text('{"step": 99, "data": {"x": 1}}\n')
    (run / "logs" / "validation").mkdir()
    (run / "logs" / "validation" / "13.jsonl").write_text(
        json.dumps({"input": "q", "output": "a", "score": 1.0, "step": 13}) + "\n"
    )
    (run / "logs" / "flat.jsonl").write_text(
        json.dumps({"step": 2, "eval/score": 0.5})
        + "\n"
        + json.dumps({"step": 3, "note": "text", "v": 1})
        + "\n"
    )
    return run


def test_metric_log_reads_file_logger_and_console(tmp_path: Path) -> None:
    log = read_metric_log(fake_run(tmp_path))
    assert len(log.series["critic/score/mean"]) == 12
    assert log.series["critic/score/mean"][1] == pytest.approx(0.15)  # the file logger's value came first
    assert log.series["val-core/webshop/reward/mean@1"] == {1: 0.25, 13: 0.5}
    assert log.series["actor/pg_loss"][13] == pytest.approx(0.01)
    assert "x" not in log.series  # checkpoints are not read
    assert "score" not in log.series  # nor verl's validation generation dumps
    assert log.series["eval/score"] == {2: 0.5} and "v" not in log.series  # flat records: numbers only
    assert len(log.sources) == 3


def test_write_curves_png_and_html(tmp_path: Path) -> None:
    run = fake_run(tmp_path)
    result = write_curves(run)
    assert result.html == run / "report" / "curves.html"
    panels = result.panels
    assert panels["Reward"][:3] == [
        "critic/score/mean",
        "critic/rewards/mean",
        "val-core/webshop/reward/mean@1",
    ]
    assert panels["Success rate"] == [
        "webshop/success/mean",
        "env/webshop/success_rate",
    ]  # both of verl_main's
    assert panels["KL"] == ["actor/kl_loss", "actor/ppo_kl"]
    assert panels["Policy loss"] == ["actor/pg_loss"]
    assert panels["Response length"] == ["response_length/mean"]
    assert panels["Env steps per episode"] == ["webshop/steps/mean", "num_turns/mean"]
    assert panels["Invalid-action rate"] == ["webshop/invalid_rate/mean"]
    html = result.html.read_text()
    assert html.count("<svg") == 7 and "<polyline" in html and "critic/score/mean" in html
    assert "http" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    if result.png is None:
        pytest.skip(result.note)
    assert result.png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not png_is_blank(result.png)


def test_cli_report(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = fake_run(tmp_path)
    out = tmp_path / "plots"
    assert main(["report", "--run", str(run), "--out", str(out)]) == EXIT_OK
    printed = capsys.readouterr().out
    assert str(out / "curves.html") in printed and "Invalid-action rate" in printed
    assert (out / "curves.html").exists()

    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", "--run", str(empty)]) == EXIT_ERROR
    assert "trainer.logger=[console,file]" in capsys.readouterr().err
