"""`agent-train data --env sciworld` (alone and in a mix): ScienceWorld's own train/dev/test variation splits, and
rows whose first user turn is the core's reset text for the task (each reset in a fresh JVM, as the service's).

The split tests need no JVM. The table test starts one JVM (about 10 s); the builds start one per row and are
``slow`` (30-80 s each at load average 4-8 on the shared 2-core machine, 3-8 minutes at 20-26). Without Java or
the scienceworld package they are skipped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from agent_envs.envs.sciworld import GAME_COUNT, JvmPool, SciWorldEnv, game
from agent_envs.envs.sciworld.games import TASKS
from agent_trainer import env_data, envs
from agent_trainer.cli import main
from agent_trainer.env_data import SCHEMA, SPLITS, split_tasks
from agent_trainer.envs import sciworld as sciworld_spec
from agent_trainer.envs.sciworld import VARIATION_SPLITS as SCIWORLD_VARIATION_SPLITS

HAVE_JVM = shutil.which("java") is not None and importlib.util.find_spec("scienceworld") is not None
needs_jvm = pytest.mark.skipif(not HAVE_JVM, reason="needs java (17) and the scienceworld package")
SIZES = {"train": 2312, "val": 1156, "test": 1171}  # as the module docstring and the user docs say


def rows(path: Path) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist()


def java_children() -> set[int]:
    """This process's child JVMs (py4j starts scienceworld's as children)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and b"scienceworld" in cmdline:
                found.add(int(entry.name))
    return found


@pytest.fixture(scope="module")
def core() -> Iterator[SciWorldEnv]:
    """A core of its own, as the service's: the reference for every row's first user turn."""
    if not HAVE_JVM:
        pytest.skip("needs java (17) and the scienceworld package")
    reference = SciWorldEnv(JvmPool(spares=1, max_live=2, wait_s=300))
    reference.prewarm()
    yield reference
    reference.shutdown()


def opening_of(core: SciWorldEnv, task: int) -> str:
    first = core.reset(task)
    core.close(first.state)
    return envs.get("sciworld").first_message({"observation": first.observation, "info": dict(first.info)})


# ---- the splits (no JVM) ----------------------------------------------------------------------------------
def test_the_splits_are_scienceworlds_variation_splits_and_never_share_a_task() -> None:
    splits = {s: split_tasks("sciworld", s) for s in SPLITS}
    assert {s: len(t) for s, t in splits.items()} == SIZES
    every = [t for s in SPLITS for t in splits[s]]
    assert len(every) == len(set(every)) == GAME_COUNT  # disjoint, and together the whole pool
    for split, tasks in splits.items():
        by_type: dict[str, list[int]] = {}
        for task in tasks:
            name, variation = game(task)
            by_type.setdefault(name, []).append(variation)
        assert list(by_type) == [name for _, name, _ in TASKS]  # every task type in every split
        for _, name, count in TASKS:  # ScienceWorld's ranges: train [0, a), dev [a, b), test [b, count)
            train_end, dev_end = SCIWORLD_VARIATION_SPLITS[name]
            low, high = {"train": (0, train_end), "val": (train_end, dev_end), "test": (dev_end, count)}[
                split
            ]
            assert by_type[name] == list(range(low, high)), (split, name)
        # round-robin over the types: any prefix covers every type (val_max_samples, eval's MAX_SAMPLES)
        assert len({game(t)[0] for t in tasks[: len(TASKS)]}) == len(TASKS)
    # AgentGym's own check: half, a quarter and a quarter of every type (ScienceWorld rounds per type)
    for _, name, count in TASKS:
        train_end, dev_end = SCIWORLD_VARIATION_SPLITS[name]
        assert abs(train_end - count / 2) <= 1 and 0 < dev_end - train_end < count - train_end


def test_without_java_or_scienceworld_the_build_says_what_to_install(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENTRL_URL", raising=False)  # else the build would take that service's resets
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(sciworld_spec.importlib.util, "find_spec",
                        lambda name, *a: None if name == "scienceworld" else real_find_spec(name, *a))  # fmt: skip
    assert main(["data", "--env", "sciworld", "--out-dir", str(tmp_path), "--train-rows", "1"]) == 2
    assert "pip install -e 'services/env[sciworld]'" in capsys.readouterr().err
    monkeypatch.setattr(sciworld_spec.importlib.util, "find_spec", real_find_spec)
    real_which = shutil.which
    monkeypatch.setattr(
        sciworld_spec.shutil, "which", lambda cmd, *a, **k: None if cmd == "java" else real_which(cmd)
    )
    assert main(["data", "--env", "textcraft,sciworld", "--out-dir", str(tmp_path), "--train-rows", "2"]) == 2
    err = capsys.readouterr().err
    assert "openjdk-17-jre-headless" in err and "--env-url" in err
    assert not list(tmp_path.glob("*.parquet"))  # nothing half-written


# ---- against the simulator --------------------------------------------------------------------------------
@needs_jvm
def test_the_split_table_is_the_simulators() -> None:
    """``SCIWORLD_VARIATION_SPLITS`` = what scienceworld's JVM answers (``get_variations_train/dev/test``)."""
    from scienceworld import ScienceWorldEnv

    sim = ScienceWorldEnv("", envStepLimit=100)
    try:
        for _, name, count in TASKS:
            sim.load(name, 0, "")
            train, dev, test = sim.get_variations_train(), sim.get_variations_dev(), sim.get_variations_test()
            train_end, dev_end = SCIWORLD_VARIATION_SPLITS[name]
            assert (sorted(train), sorted(dev), sorted(test)) == (
                list(range(train_end)),
                list(range(train_end, dev_end)),
                list(range(dev_end, count)),
            ), name
    finally:
        sim.close()


@needs_jvm
@pytest.mark.slow
def test_a_small_build_has_the_services_reset_text_as_each_first_turn(
    core: SciWorldEnv, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    core.pool.wait_for_spares()  # the reference's own JVMs all started: any other one is the build's
    before = java_children()
    assert main(["data", "--env", "sciworld", "--agent-loop", "--out-dir", str(tmp_path), "--train-rows", "3",
                 "--val-rows", "2", "--test-rows", "2", "--quiet"]) == 0  # fmt: skip
    captured = capsys.readouterr()
    assert "sciworld           3       2       2   2312/1156/1171" in captured.err  # the split sizes, printed
    assert java_children() == before  # the build's JVMs are all gone
    spec = envs.get("sciworld")
    expected = {"train": env_data._spread(split_tasks("sciworld", "train"), 3),
                "val": split_tasks("sciworld", "val")[:2], "test": split_tasks("sciworld", "test")[:2]}  # fmt: skip
    for split in SPLITS:
        path = tmp_path / f"{split}.parquet"
        assert pq.read_schema(path).remove_metadata().equals(SCHEMA.remove_metadata())
        table = rows(path)
        assert [r["extra_info"]["task"] for r in table] == expected[split]
        for index, row in enumerate(table):
            extra, task = row["extra_info"], row["extra_info"]["task"]
            assert (row["data_source"], row["agent_name"], extra["env"], extra["index"], extra["split"]) == (
                "sciworld", "sciworld_agent", "sciworld", index, split)  # fmt: skip
            assert task in split_tasks("sciworld", split)
            assert row["prompt"][0] == {"role": "system", "content": spec.system_prompt}
            assert row["prompt"][1]["content"] == opening_of(core, task)  # what the service shows at reset
            assert extra["instruction"].startswith("Your task is to ")
            assert extra["interaction_kwargs"] == {"name": "sciworld", "task": task, "goal": task,
                                                   "goal_set": None, "split": split}  # fmt: skip
    tasks = [r["extra_info"]["task"] for split in SPLITS for r in rows(tmp_path / f"{split}.parquet")]
    assert len(tasks) == len(set(tasks)) == 7


@needs_jvm
@pytest.mark.slow
def test_a_mix_with_sciworld_keeps_the_weights_and_each_environments_first_turns(
    core: SciWorldEnv, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    pytest.importorskip("minigrid", reason="BabyAI: pip install -e 'services/env[babyai]'")
    from agent_envs.envs import registry

    assert main(["data", "--env", "textcraft,babyai,sciworld", "--weights", "1,1,2", "--interaction",
                 "--out-dir", str(tmp_path), "--train-rows", "8", "--val-rows", "1", "--test-rows", "1"]) == 0  # fmt: skip
    summary = json.loads(
        capsys.readouterr().out.splitlines()[-1]
    )  # after pygame's banner (minigrid imports it)
    assert summary["sizes"]["train"] == {"textcraft": 2, "babyai": 2, "sciworld": 4}
    assert summary["tasks"]["sciworld"] == SIZES
    train = rows(tmp_path / "train.parquet")
    assert Counter(r["data_source"] for r in train[:4]) == {"sciworld": 2, "textcraft": 1, "babyai": 1}
    for split in SPLITS:
        for row in rows(tmp_path / f"{split}.parquet"):
            env_id, task = row["data_source"], row["extra_info"]["task"]
            assert (
                row["agent_name"] == "tool_agent"
                and row["extra_info"]["interaction_kwargs"]["name"] == env_id
            )
            assert task in split_tasks(env_id, split)
            if env_id == "sciworld":
                expected = opening_of(core, task)
            else:
                first = registry.make(env_id).reset(task)
                expected = envs.get(env_id).first_message(
                    {"observation": first.observation, "info": first.info}
                )
            assert row["prompt"][1]["content"] == expected, (env_id, task)


@needs_jvm
@pytest.mark.slow
def test_without_a_simulator_here_the_rows_come_from_the_services_resets(
    core: SciWorldEnv,
    env_clients_in_process: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The trainer image has no Java: ``--env-url`` (or ``$AGENTRL_URL``) makes the rows from the served
    environment's resets (the real app, native routes and signed tokens, in process), and frees each episode."""
    from agent_envs.envs import registry

    env_clients_in_process("webshop,sciworld")
    real_which = shutil.which
    monkeypatch.setattr(
        sciworld_spec.shutil, "which", lambda cmd, *a, **k: None if cmd == "java" else real_which(cmd)
    )
    monkeypatch.setenv("AGENTRL_URL", "http://env.test")
    served = registry.make("sciworld")
    try:
        assert main(["data", "--env", "sciworld", "--out-dir", str(tmp_path), "--train-rows", "2",
                     "--val-rows", "1", "--test-rows", "1"]) == 0  # fmt: skip
        assert json.loads(capsys.readouterr().out)["sources"] == {"sciworld": "http://env.test"}
        assert served.pool.stats()["idle"] == 0  # every episode closed at once
    finally:
        registry.shut_down(served)  # later tests get a core whose pool runs
    for split in SPLITS:
        for row in rows(tmp_path / f"{split}.parquet"):
            assert row["prompt"][1]["content"] == opening_of(core, row["extra_info"]["task"])
