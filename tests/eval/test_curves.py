"""``webshop-train report --run``: training curves from verl's metric log (file logger and console output)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from _eval_support import png_is_blank

from webshop_trainer.eval_cli import EXIT_ERROR, EXIT_OK, main
from webshop_trainer.evaluation.curves import read_metric_log, write_curves


def fake_run(root: Path, steps: int = 12) -> Path:
    """A run directory as training leaves it: verl's file-logger JSONL and a console log."""
    run = root / "outputs" / "webshop-test"
    (run / "metrics").mkdir(parents=True)
    (run / "logs").mkdir()
    (run / "checkpoints" / "global_step_5").mkdir(parents=True)
    with open(run / "metrics" / "metrics.jsonl", "w") as sink:
        for step in range(1, steps + 1):
            data = {
                "critic/score/mean": 0.1 + 0.05 * step,
                "actor/pg_loss": -0.01 * math.sin(step),
                "actor/kl_loss": 0.001 * step,
                "actor/ppo_kl": 0.0005 * step,
                "response_length/mean": 80 + step,
                "webshop/success_rate": 0.02 * step,
                "env/steps_per_s": 400 + 3 * step,
                "timing_s/step": 30.0,
                "training/global_step": step,
            }
            sink.write(json.dumps({"step": step, "data": data}) + "\n")
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
    assert panels["Reward"][:2] == ["critic/score/mean", "val-core/webshop/reward/mean@1"]
    assert panels["Success rate"] == ["webshop/success_rate"]
    assert panels["KL"] == ["actor/kl_loss", "actor/ppo_kl"]
    assert panels["Policy loss"] == ["actor/pg_loss"]
    assert panels["Response length"] == ["response_length/mean"]
    assert panels["Env steps/s"] == ["env/steps_per_s"]
    html = result.html.read_text()
    assert html.count("<svg") == 6 and "<polyline" in html and "critic/score/mean" in html
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
    assert str(out / "curves.html") in printed and "Env steps/s" in printed
    assert (out / "curves.html").exists()

    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", "--run", str(empty)]) == EXIT_ERROR
    assert "trainer.logger=[console,file]" in capsys.readouterr().err
