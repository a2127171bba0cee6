"""Dataset rows in verl's format, the AgentGym id reader, and the ``agent-train data`` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip(
    "agent_trainer", reason="install the trainer: pip install -c constraints.txt -e services/trainer"
)

import pyarrow.parquet as pq

from agent_trainer.cli import main
from agent_trainer.envs.webshop import prompts
from agent_trainer.envs.webshop.data import DataError, build_dataset, load_agentgym_ids


def read_rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def test_rows_have_everything_verl_and_the_interaction_read(
    generated_catalog_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "train.parquet"
    summary = build_dataset(generated_catalog_dir, "train", out, limit=3, progress=False)
    assert summary["rows"] == 3 and summary["goal_set"] == "synthetic"
    rows = read_rows(out)
    for index, row in enumerate(rows):
        goal = 1500 + index  # the train split starts at goal 1500
        assert row["data_source"] == "webshop" and row["agent_name"] == "tool_agent"
        assert row["ability"] == "agent/webshop"
        assert row["reward_model"]["style"] == "interaction" and row["reward_model"]["ground_truth"]
        extra = row["extra_info"]
        assert extra["index"] == index and extra["goal"] == goal and extra["split"] == "train"
        assert extra["interaction_kwargs"] == {"name": "webshop", "goal": goal, "goal_set": "synthetic",
                                               "split": "train"}  # fmt: skip
        system, user = row["prompt"]
        assert system == {"role": "system", "content": prompts.SYSTEM_PROMPT}
        assert user["role"] == "user" and user["content"].startswith(f"Instruction: {extra['instruction']}\n")
        assert "Available actions: search[<keywords>]" in user["content"]


def test_dataset_carries_the_catalogs_reward_definition_into_the_training_log(
    generated_catalog, generated_catalog_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Rewards on heuristic vs spaCy nouns (or seeded vs pinned prices) differ: the training log says which."""
    out = tmp_path / "train.parquet"
    summary = build_dataset(generated_catalog_dir, "train", out, limit=2, progress=False)
    manifest = generated_catalog.manifest
    assert summary["fidelity"]["noun_extractor"] == manifest["noun_extractor"]
    assert summary["fidelity"]["prices"] == manifest["prices"]
    assert summary["fidelity"]["price_ceilings"] == manifest["price_ceilings"]
    code = main(["train", "--config", "test", "--dry-run", "--output-dir", str(tmp_path / "runs"),
                 f"data.train_files={out}"])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().err
    line = next(line for line in printed.splitlines() if "catalog " in line and "title nouns" in line)
    assert summary["fingerprint"] in line and manifest["noun_extractor"] in line
    assert manifest["prices"] in line and "not pinned" in line
    main(["train", "--config", "test", "--dry-run", "--output-dir", str(tmp_path / "runs"),
          f"data.train_files={tmp_path / 'missing.parquet'}"])  # fmt: skip
    assert "missing.parquet: unknown" in capsys.readouterr().err


def test_eval_and_test_splits_use_their_index_ranges(generated_catalog_dir: Path, tmp_path: Path) -> None:
    build_dataset(generated_catalog_dir, "test", tmp_path / "t.parquet", limit=2, progress=False)
    build_dataset(generated_catalog_dir, "eval", tmp_path / "e.parquet", limit=2, progress=False)
    assert [r["extra_info"]["goal"] for r in read_rows(tmp_path / "t.parquet")] == [0, 1]
    assert [r["extra_info"]["goal"] for r in read_rows(tmp_path / "e.parquet")] == [500, 501]


def test_empty_split_is_a_clear_error(generated_catalog_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match="split of the human goals is empty"):
        build_dataset(
            generated_catalog_dir, "train", tmp_path / "x.parquet", goal_set="human", progress=False
        )
    with pytest.raises(DataError, match="no 'nope' goals"):
        build_dataset(generated_catalog_dir, "train", tmp_path / "x.parquet", goal_set="nope", progress=False)


def test_from_agentgym_reads_item_ids(generated_catalog_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "webshop_train.json"
    source.write_text(json.dumps([{"item_id": "webshop_7", "conversations": []}, {"item_id": "webshop_42"}]))
    out = tmp_path / "ag.parquet"
    summary = build_dataset(generated_catalog_dir, "train", out, agentgym_file=source, progress=False)
    rows = read_rows(out)
    assert summary["rows"] == 2 and [r["extra_info"]["goal"] for r in rows] == [7, 42]
    kwargs = rows[0]["extra_info"]["interaction_kwargs"]
    assert kwargs["goal_set"] == "synthetic" and kwargs["split"] is None  # AgentGym ids are not range splits


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "not valid JSON"),
        ('{"item_id": "webshop_1"}', "expected a JSON list"),
        ("[]", "the list is empty"),
        ('[{"id": 3}]', 'entry 0 has no string "item_id"'),
        ('[{"item_id": "alfworld_3"}]', 'expected "webshop_<N>"'),
        ('[{"item_id": "webshop_x"}]', 'expected "webshop_<N>"'),
    ],
)
def test_bad_agentgym_files_give_clear_errors(tmp_path: Path, content: str, message: str) -> None:
    source = tmp_path / "bad.json"
    source.write_text(content)
    with pytest.raises(DataError, match=message):
        load_agentgym_ids(source)


def test_missing_agentgym_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        load_agentgym_ids(tmp_path / "missing.json")


def test_agentgym_ids_outside_the_catalog(generated_catalog_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "big.json"
    source.write_text(json.dumps([{"item_id": "webshop_99999999"}]))
    with pytest.raises(DataError, match="outside the catalog"):
        build_dataset(
            generated_catalog_dir, "train", tmp_path / "x.parquet", agentgym_file=source, progress=False
        )


def test_cli_data_command(
    generated_catalog_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli.parquet"
    code = main(["data", "--catalog", str(generated_catalog_dir), "--split", "eval", "--out", str(out), "--limit",
                 "2", "--quiet"])  # fmt: skip
    assert code == 0 and json.loads(capsys.readouterr().out)["rows"] == 2 and out.exists()
    code = main(
        ["data", "--catalog", str(tmp_path / "nothing"), "--split", "eval", "--out", str(out), "--quiet"]
    )
    assert code == 2 and "not a prepared catalog" in capsys.readouterr().err


def test_output_must_be_parquet(generated_catalog_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match="must end with .parquet"):
        build_dataset(generated_catalog_dir, "train", tmp_path / "rows.json", limit=1, progress=False)
