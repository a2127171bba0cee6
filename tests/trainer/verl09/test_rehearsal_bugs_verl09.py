"""The rehearsal's checks see the bugs they exist for on the verl 0.9.1 line (its own environment, .venv-verl09),
end to end: ``agent-train rehearse --fail-fast`` with a flipped reward and a loss mask over the env pages put in
(``$AGENTRL_REHEARSAL_INJECT``) must exit 1, the first step's record failing the mask, reward and direction checks.
tests/trainer/test_rehearsal_bugs.py has the unit-level tests and the 0.7 line's run; ``make rehearse-bugs`` runs
every bug on both lines."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("transfer_queue", reason="verl 0.9.1's v1 trainer needs TransferQueue: make setup")

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_make_rehearse_fails_on_a_flipped_reward_and_a_mask_over_env_pages_on_the_09_line(
    tmp_path: Path,
) -> None:
    from agent_trainer.rehearsal.matrix import run_one

    catalog = Path(os.environ.get("CATALOG_DIR", REPO / "data" / "catalog"))
    if not (catalog / "manifest.json").exists():
        pytest.skip(f"no prepared catalog at {catalog}: make data")
    row = run_one(Path(sys.executable).parent.parent, "0.9", "reward_sign,mask_env_pages", tmp_path, catalog,
                  extra=["--outage-s", "0", "--model-dir", str(REPO / "outputs" / "rehearsal" / "tiny_model-webshop")])  # fmt: skip
    assert row["exit"] == 1, row
    assert {"reward_matches_env", "loss_mask_is_model_tokens", "update_direction"} <= set(
        row["failed_checks"]
    ), row
    assert "weight_sync" not in row["failed_checks"], row
