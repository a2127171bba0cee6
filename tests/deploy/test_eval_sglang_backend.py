"""Eval's sglang server (``--policy checkpoint``) uses the attention backend verl's rollout server uses: on the
0.9 image (sglang 0.5.12) flashinfer, as verl 0.9.1 sets it, not the FA3 that sglang picks on Hopper."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from agent_trainer.evaluation.policies import CheckpointPolicy
from agent_trainer.evaluation.sglang_defaults import sglang_default_args, verl_attention_backend

REPO = Path(__file__).resolve().parents[2]


def _fake_python(tmp_path: Path, sglang: str, hip: bool = False) -> str:
    """An interpreter stand-in that answers the probe as an environment with this sglang would."""
    script = tmp_path / f"python-{sglang}"
    script.write_text(
        f"#!{sys.executable}\nprint({json.dumps(json.dumps({'sglang': sglang, 'hip': hip}))})\n"
    )
    script.chmod(0o755)
    return str(script)


def test_the_rule_is_verl_0_9_1s() -> None:
    source = next((REPO / ".venv-verl09" / "lib").glob("python3*/site-packages/verl/workers/rollout/sglang_rollout/"
                                                      "async_sglang_server.py"), None)  # fmt: skip
    if source is None:
        pytest.skip("no .venv-verl09 (make setup)")
    text = source.read_text()
    assert 'version.parse(sglang.__version__) >= version.parse("0.5.12")' in text
    assert 'attention_backend = "flashinfer"' in text and 'attention_backend = "aiter"' in text
    assert verl_attention_backend("0.5.12", hip=False) == "flashinfer"
    assert verl_attention_backend("0.5.12.post1", hip=False) == "flashinfer"
    assert (
        verl_attention_backend("0.5.9", hip=False) is None
    )  # the 0.7 image: sglang's own choice, verl's fa3
    assert verl_attention_backend("0.5.12", hip=True) == "aiter"


def test_the_eval_server_command_names_the_backend(tmp_path: Path) -> None:
    new = _fake_python(tmp_path, "0.5.12")
    command = CheckpointPolicy("/models/m", port=1234, python=new).command()
    assert command[command.index("--attention-backend") + 1] == "flashinfer"
    old = CheckpointPolicy("/models/m", port=1234, python=_fake_python(tmp_path, "0.5.9")).command()
    assert "--attention-backend" not in old
    given = CheckpointPolicy(
        "/models/m", port=1234, python=new, server_args=["--attention-backend=fa3"]
    ).command()
    assert (
        given.count("--attention-backend=fa3") == 1 and "--attention-backend" not in given
    )  # the user's wins
    assert sglang_default_args([], python=str(tmp_path / "missing")) == []  # cannot ask: sglang decides
