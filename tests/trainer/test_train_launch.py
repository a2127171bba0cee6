"""``agent-train train`` as the trainer container runs it: any uid, an unwritable working directory, and
per-step WebShop metrics in verl's own metric pipeline."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip(
    "verl", reason="the trainer package needs verl: pip install -c constraints.txt -e services/trainer"
)

from agent_trainer.verl_main import install_step_metrics, step_metrics

REPO = Path(__file__).resolve().parents[2]
IMAGE_UID = 10001  # the trainer image's own user, owner of its home directory
NOBODY = 65534


def _can_run_as(uid: int) -> bool:
    """Whether ``uid`` can start this interpreter (it may live under a directory only root can enter)."""
    again = "import subprocess, sys; sys.exit(subprocess.run([sys.executable, '-c', '0']).returncode)"
    probe = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", sys.executable, "-c", again]
    return subprocess.run(probe, capture_output=True).returncode == 0


@pytest.fixture
def foreign_home() -> Iterator[Path]:
    """The image's situation: a working directory owned by uid 10001, mode 755, not writable by the run's user."""
    home = Path(tempfile.mkdtemp(prefix="verl-home-", dir="/tmp"))
    os.chown(home, IMAGE_UID, IMAGE_UID)
    home.chmod(0o755)
    yield home
    shutil.rmtree(home, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
@pytest.mark.timeout(1200)  # launches verl's main_ppo: minutes on a loaded 2-core machine
def test_training_starts_as_a_uid_that_cannot_write_the_working_directory(foreign_home: Path) -> None:
    """Hydra creates its output directory before main_ppo runs; it must not be the (foreign) working directory.

    Runs the real launcher and main_ppo up to ``ray.init``, which an extra key makes fail at once: getting
    there means Hydra's directory was created. As ``nobody`` when it can start this interpreter, else as root
    with every capability dropped (a uid other than 10001 that cannot write a 10001-owned directory either).
    """
    runs = Path(tempfile.mkdtemp(prefix="verl-runs-", dir="/tmp"))
    runs.chmod(0o777)
    try:
        if _can_run_as(NOBODY):
            as_user = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        else:
            as_user = ["setpriv", "--bounding-set=-all", "--inh-caps=-all"]
        probe = subprocess.run([*as_user, "touch", str(foreign_home / "x")], capture_output=True)
        assert probe.returncode != 0, (
            "the working directory must be unwritable for this test to mean anything"
        )
        env = {**os.environ, "HOME": str(runs), "AGENTRL_CONFIG_DIR": str(REPO / "configs")}
        env.pop("AGENTRL_OUTPUT_DIR", None)
        result = subprocess.run(
            [*as_user, sys.executable, "-m", "agent_trainer.cli", "train", "--config", "test",
             "--output-dir", str(runs), "+ray_kwargs.ray_init.webshop_stop_here=1"],
            cwd=foreign_home, env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        output = result.stdout + result.stderr
        assert "Permission denied" not in output, output[-3000:]
        assert "Unknown keyword argument(s): webshop_stop_here" in output, output[-3000:]
        hydra_runs = list((runs / "webshop_grpo_test" / "logs" / "hydra").glob("*/.hydra/config.yaml"))
        assert len(hydra_runs) == 1
        train_log = (runs / "webshop_grpo_test" / "logs" / "train.log").read_text()
        assert train_log.startswith("agent-train: catalog of ")  # the data's reward definition (none here)
        assert not (foreign_home / "outputs").exists()
    finally:
        shutil.rmtree(runs, ignore_errors=True)


def _batch(
    success: list[float], steps: list[float], invalid_rate: list[float], sources: list[str] | None = None
):
    """A training batch as verl's trainer loop holds it when it computes the step's data metrics (its rows'
    ``data_source``: WebShop's unless ``sources`` says otherwise)."""
    import torch
    from verl import DataProto

    n, prompt, response = len(success), 4, 6
    scores = torch.zeros(n, response)
    scores[:, -1] = torch.tensor(success)
    tensors = {
        "token_level_scores": scores,
        "token_level_rewards": scores.clone(),
        "advantages": torch.zeros(n, response),
        "returns": torch.zeros(n, response),
        "responses": torch.ones(n, response, dtype=torch.long),
        "attention_mask": torch.ones(n, prompt + response, dtype=torch.long),
        "response_mask": torch.ones(n, response, dtype=torch.long),
    }
    non_tensors = {
        "success": np.array(success),
        "env_reward": np.array(success),
        "steps": np.array(steps),
        "invalid_rate": np.array(invalid_rate),
        "__num_turns__": np.array([2 * s + 1 for s in steps]),
        "data_source": np.array(sources or ["webshop"] * n, dtype=object),
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


def test_every_training_step_logs_success_env_steps_and_invalid_rate() -> None:
    from verl.trainer.ppo import ray_trainer

    original = ray_trainer.compute_data_metrics
    try:
        install_step_metrics()
        install_step_metrics()  # idempotent: Ray may reuse the actor process
        metrics = ray_trainer.compute_data_metrics(
            batch=_batch([1.0, 0.0, 0.0, 1.0], [4, 7, 24, 5], [0.0, 0.5, 1.0, 0.25]), use_critic=False
        )
    finally:
        ray_trainer.compute_data_metrics = original
    assert metrics["webshop/success/mean"] == pytest.approx(0.5)
    assert metrics["webshop/steps/mean"] == pytest.approx(10.0)
    assert metrics["webshop/invalid_rate/mean"] == pytest.approx(0.4375)
    assert metrics["critic/score/mean"] == pytest.approx(0.5)  # verl's own metrics are still there
    assert "webshop/purchased/mean" not in metrics  # only keys the batch has


def test_step_metrics_skip_absent_and_empty_keys() -> None:
    assert step_metrics({"success": np.array([]), "other": np.array([1.0])}) == {}


def test_each_environment_of_a_step_gets_its_own_names() -> None:
    """``<env>/<key>/mean`` from the rows' ``data_source``, as verl names validation's: a BabyAI run's success is
    ``babyai/success/mean`` (it was ``webshop/success/mean`` for every environment, and a mix's one mean of all)."""
    from verl.trainer.ppo import ray_trainer

    original = ray_trainer.compute_data_metrics
    try:
        install_step_metrics()
        metrics = ray_trainer.compute_data_metrics(
            batch=_batch([1.0, 0.0, 0.0, 0.0], [4, 7, 24, 5], [0.0, 0.5, 1.0, 0.25],
                         ["babyai", "textcraft", "babyai", "textcraft"]), use_critic=False,
        )  # fmt: skip
    finally:
        ray_trainer.compute_data_metrics = original
    assert metrics["babyai/success/mean"] == pytest.approx(0.5)
    assert metrics["babyai/steps/mean"] == pytest.approx(14.0)
    assert metrics["textcraft/success/mean"] == 0.0
    assert metrics["textcraft/invalid_rate/mean"] == pytest.approx(0.375)
    assert not any(key.startswith("webshop/") for key in metrics)
    # rows without a data_source (verl's word for them at validation), and a value that is not a number
    assert step_metrics({"success": np.array([1.0, None], dtype=object)}) == {"unknown/success/mean": 1.0}


def test_later_verl_lines_run_verls_main_ppo_with_the_v1_task_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher module is shared by both verl lines: 0.7.x gets the TaskRunner subclass, 0.9 verl's v1
    main with the task runner that adds the per-environment step metrics."""
    from agent_trainer import config, verl_main

    called: list[str] = []
    monkeypatch.setattr(verl_main, "main_v1", lambda: called.append("verl"))
    monkeypatch.setattr(verl_main, "main", lambda: called.append("webshop"))
    monkeypatch.setattr(config, "installed_verl_line", lambda: "0.9")
    verl_main.run()
    monkeypatch.setattr(config, "installed_verl_line", lambda: "0.7")
    verl_main.run()
    assert called == ["verl", "webshop"]


def _rows_file(path: Path, rows: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"goal": list(range(rows))}), path)
    return path


@pytest.mark.timeout(1200)  # launching verl's main_ppo took over 300 s at a load of 25 on 2 cores
@pytest.mark.parametrize("saved, finished", [(8, True), (9, True), (7, False)])
def test_a_finished_run_says_so_instead_of_training_nothing(
    tmp_path: Path, saved: int, finished: bool
) -> None:
    """verl resumes a run from its last checkpoint (resume_mode auto); one that saved its last step would then
    train nothing. 64 rows (train_max_samples 64 of 100) / batch 8 x 1 epoch = 8 steps."""
    train = _rows_file(tmp_path / "train.parquet", 100)
    checkpoints = tmp_path / "out" / "webshop_grpo_test" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "latest_checkpointed_iteration.txt").write_text(str(saved))
    step = checkpoints / f"global_step_{saved}"  # a whole checkpoint (the launcher checks before resuming)
    (step / "actor").mkdir(parents=True)
    (step / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"x")
    (step / "data.pt").write_bytes(b"x")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTRL_", "WEBSHOP_"))}
    env.update(AGENTRL_TRAIN_FILE=str(train), AGENTRL_VAL_FILE=str(train))
    # an unknown key makes main_ppo fail at once if it is launched: the finished run must not get there
    result = subprocess.run([sys.executable, "-m", "agent_trainer.cli", "train", "--config", "test", "--output-dir",
                             str(tmp_path / "out"), "+trainer.no_such_key=1"],
                            capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path)  # fmt: skip
    if finished:
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"already finished: its checkpoint of step {saved} (of 8)" in result.stderr
        assert (
            "AGENTRL_EXPERIMENT=webshop_grpo_test_2" in result.stderr
            and "make eval MODEL_PATH=" in result.stderr
        )
        assert "main_ppo" not in result.stdout + result.stderr.split("already finished")[1]
    else:
        assert "already finished" not in result.stderr
        assert result.returncode != 0  # launched: verl refuses the unknown key


def test_a_run_finished_by_its_epochs_is_finished_whatever_total_training_steps_says(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch
                                                                                  ) -> None:  # fmt: skip
    """verl's loop also ends with the last epoch: 64 rows / batch 8 x 1 epoch = 8 steps, even with 20 asked for."""
    from agent_trainer.cli import finished_run
    from agent_trainer.config import training_config_dir

    train = _rows_file(tmp_path / "train.parquet", 100)
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("8")
    env = {"AGENTRL_TRAIN_FILE": str(train), "AGENTRL_VAL_FILE": str(train)}
    overrides = [f"trainer.default_local_dir={checkpoints}", "trainer.total_training_steps=20"]
    assert finished_run("test", overrides, training_config_dir(), env) == (8, 8, checkpoints)
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("7")
    assert finished_run("test", overrides, training_config_dir(), env) is None


def test_earlier_metrics_are_kept_when_a_run_resumes(tmp_path: Path) -> None:
    """verl's file logger truncates its file at start: the launcher moves an earlier log aside first."""
    from agent_trainer.cli import keep_earlier_metrics

    log = tmp_path / "metrics.jsonl"
    assert keep_earlier_metrics(log) is None  # nothing yet
    log.write_text("")
    assert keep_earlier_metrics(log) is None and log.exists()  # empty: nothing to keep
    log.write_text('{"step": 1, "data": {}}\n')
    first = keep_earlier_metrics(log)
    assert first is not None and first.read_text() == '{"step": 1, "data": {}}\n' and not log.exists()
    log.write_text('{"step": 2, "data": {}}\n')
    os.utime(log, (first.stat().st_mtime, first.stat().st_mtime))  # the same second: a distinct name still
    second = keep_earlier_metrics(log)
    assert second is not None and second != first and second.read_text() == '{"step": 2, "data": {}}\n'
    assert {p.name for p in tmp_path.glob("metrics*.jsonl")} == {first.name, second.name}
