"""``agent-train train`` on a running Ray cluster: the run's secrets reach verl's workers and no file the run
writes holds them; the datasets are found where the caller named them.

The real launcher, verl's real ``main_ppo`` (Hydra, ``ray.init`` joining a real Ray head, the ``TaskRunner``
actor, its tokenizer and datasets), up to the point where a CPU machine stops: verl's check for GPUs, which comes
after the datasets are opened. The Ray head is started without the secrets (a ``ray start`` node's workers
inherit that node's environment), so they can reach the ``TaskRunner`` only through the launcher.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="the trainer package needs verl")

from agent_trainer import worker_secrets
from agent_trainer.config import is_secret, worker_env
from agent_trainer.config import worker_secrets as secrets_of

#: Fake secrets: the tests grep every file the run writes for them.
WANDB_KEY = "wandb-fake-7f3a9c0d1e2b4a5f"
HF_KEY = "hf_fakeTokenQ9w8e7r6t5y4"

PROBE = '''
import hashlib, json, os
from pathlib import Path


def setup() -> None:
    """Chained after the launcher's hook: what this worker sees, as digests (never the values)."""
    seen = {k: hashlib.sha256(os.environ[k].encode()).hexdigest() for k in ("WANDB_API_KEY", "HF_TOKEN")
            if k in os.environ}
    out = Path(os.environ["PROBE_DIR"]) / f"worker-{os.getpid()}.json"
    out.write_text(json.dumps({"pid": os.getpid(), "seen": seen}))
'''


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def test_secret_names() -> None:
    for name in ("WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AGENTRL_STATE_SECRET", "X_PASSWORD"):
        assert is_secret(name), name
    for name in (
        "AGENTRL_TURN_TOKENS",
        "WANDB_PROJECT",
        "HF_HOME",
        "AGENTRL_WORKER_SECRETS_FILE",
        "HF_HUB_OFFLINE",
    ):
        assert not is_secret(name), name
    env = {"WANDB_API_KEY": WANDB_KEY, "HF_TOKEN": HF_KEY, "WANDB_PROJECT": "p", "HF_HOME": "/h",
           "AGENTRL_STATE_SECRET": "s", "AGENTRL_TURN_TOKENS": "64", "HOME": "/root"}  # fmt: skip
    assert worker_env(env) == {"HF_HOME": "/h", "WANDB_PROJECT": "p", "AGENTRL_TURN_TOKENS": "64"}
    assert secrets_of(env) == {"HF_TOKEN": HF_KEY, "WANDB_API_KEY": WANDB_KEY}  # the state secret: never


def test_secrets_file_is_private_and_loaded_by_the_hook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = worker_secrets.secrets_path(tmp_path / "run")
    path.parent.mkdir(parents=True)
    path.write_text("{}")
    path.chmod(0o644)  # a file left behind by a killed run: rewritten private
    worker_secrets.write_secrets(path, {"WANDB_API_KEY": WANDB_KEY})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv(worker_secrets.SECRETS_FILE_ENV, str(path))
    monkeypatch.delenv(worker_secrets.CHAINED_HOOK_ENV, raising=False)
    worker_secrets.setup()
    assert os.environ["WANDB_API_KEY"] == WANDB_KEY
    worker_secrets.remove_secrets(path)
    assert not path.parent.exists()


def test_hook_overrides_chain_the_runs_own_hook() -> None:
    given = [
        "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=pkg.mod.setup",
        "trainer.total_epochs=2",
    ]
    out = worker_secrets.hook_overrides(given, Path("/runs/x/.secrets/worker-env.json"))
    assert f"++ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={worker_secrets.HOOK}" in out
    assert (
        f"++ray_kwargs.ray_init.runtime_env.env_vars.{worker_secrets.CHAINED_HOOK_ENV}=pkg.mod.setup" in out
    )
    assert "trainer.total_epochs=2" in out and given[0] not in out


def test_only_environment_secrets_count_as_secret_overrides() -> None:
    given = ["+trainer.no_such_key=1", "actor_rollout_ref.model.path=m",
             "++ray_kwargs.ray_init.runtime_env.env_vars.HF_TOKEN=x", "++ray_kwargs.ray_init.runtime_env.env_vars.HF_HOME=h"]  # fmt: skip
    assert worker_secrets.given_secret_overrides(given) == [
        "ray_kwargs.ray_init.runtime_env.env_vars.HF_TOKEN"
    ]


def test_a_secret_given_as_an_override_is_refused_without_echoing_it(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "agent_trainer.cli", "train", "--config", "test", "--dry-run", "--output-dir",
         str(tmp_path), f"++ray_kwargs.ray_init.runtime_env.env_vars.WANDB_API_KEY={WANDB_KEY}"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2
    assert "WANDB_API_KEY" in result.stderr and WANDB_KEY not in result.stdout + result.stderr


@pytest.mark.slow  # two launcher dry runs (composition with verl: 20-70 s each on 2 cores)
def test_dataset_paths_mean_the_callers_directory(tmp_path: Path) -> None:
    """Config defaults (``data/verl/...``), ``AGENTRL_VAL_FILE`` and a ``data.train_files=`` list, all relative:
    the command verl gets names them under the caller's directory, whatever the run directory is."""
    from agent_trainer.cli import composed_config
    from agent_trainer.config import training_config_dir

    caller = tmp_path / "caller"
    caller.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTRL_", "WEBSHOP_", "RAY_"))}

    def dry_run(*overrides: str, **extra: str) -> list[str]:
        result = subprocess.run(
            [sys.executable, "-m", "agent_trainer.cli", "train", "--config", "test", "--dry-run", "--output-dir",
             str(tmp_path / "out"), *overrides], capture_output=True, text=True, timeout=300, cwd=caller,
            env={**env, **extra},
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        line = next(x for x in result.stderr.splitlines() if x.startswith("+ "))
        import shlex

        return [o for o in shlex.split(line[2:]) if "=" in o and not o.startswith("hydra.")]

    def files(overrides: list[str]) -> tuple[object, object]:
        config = composed_config("test", overrides, training_config_dir(), {})
        return config.data.train_files, config.data.val_files

    train, val = files(dry_run())
    assert (train, val) == (str(caller / "data/verl/webshop/train.parquet"),
                            str(caller / "data/verl/webshop/val.parquet"))  # fmt: skip
    train, val = files(
        dry_run("data.train_files=[a.parquet,hdfs://cluster/b.parquet]", AGENTRL_VAL_FILE="v/val.parquet")
    )
    assert list(train) == [str(caller / "a.parquet"), "hdfs://cluster/b.parquet"]  # a URL is left as it is
    assert val == str(caller / "v/val.parquet")


def _written_files(*roots: Path) -> list[Path]:
    return [
        p for root in roots if root.exists() for p in root.rglob("*") if p.is_file() and not p.is_symlink()
    ]


@pytest.mark.slow
def test_secrets_reach_the_workers_and_no_file_of_the_run_holds_them(generated_catalog_dir: Path,
                                                                      tmp_path: Path) -> None:  # fmt: skip
    from agent_envs.ray_serve.local import LocalRayHead
    from agent_trainer.envs.webshop.data import build_dataset
    from agent_trainer.tiny_model import build_tiny_model

    caller = tmp_path / "caller"  # where the user stands: the config's default data/verl/*.parquet are here
    for split, name in (("train", "train"), ("eval", "val")):  # agent-train data --env webshop's files
        build_dataset(generated_catalog_dir, split, caller / "data" / "verl" / "webshop" / f"{name}.parquet",
                      limit=8, progress=False)  # fmt: skip
    model = build_tiny_model(tmp_path / "tiny", generated_catalog_dir)
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "probe_hook.py").write_text(PROBE)
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("RAY_", "AGENTRL_", "WEBSHOP_", "WANDB_", "HF_")) and not is_secret(k)}  # fmt: skip
    ray_env = {**clean, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
               "RAY_memory_monitor_refresh_ms": "0", "PROBE_DIR": str(probe),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(probe), os.environ.get("PYTHONPATH")]))}  # fmt: skip
    ray_temp = Path(tempfile.mkdtemp(prefix="wssec-", dir="/tmp"))  # short: Ray's unix sockets
    head = LocalRayHead(ray_temp / "ray", cpus=4, env=ray_env)
    out = tmp_path / "runs"
    try:
        head.start()
        env = {**ray_env, "RAY_ADDRESS": head.address, "WANDB_API_KEY": WANDB_KEY, "HF_TOKEN": HF_KEY,
               "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "AGENTRL_MODEL_PATH": str(model)}  # fmt: skip
        result = subprocess.run(
            [sys.executable, "-m", "agent_trainer.cli", "train", "--config", "test", "--output-dir", str(out),
             "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=probe_hook.setup",
             "ray_kwargs.ray_init.num_cpus=null"],
            capture_output=True, text=True, timeout=600, cwd=caller, env=env,
        )  # fmt: skip
    finally:
        head.stop()
    output = result.stdout + result.stderr
    # verl got past its tokenizer and both datasets (opened from the caller's directory) to its GPU check
    assert "Total available GPUs 0 is less than total desired GPUs" in output, output[-5000:]
    assert "agent_trainer.worker_secrets: cannot read" not in output
    seen = [json.loads(p.read_text())["seen"] for p in probe.glob("worker-*.json")]
    assert seen, "no Ray worker ran the chained setup hook"
    assert all(s == {"WANDB_API_KEY": _digest(WANDB_KEY), "HF_TOKEN": _digest(HF_KEY)} for s in seen), seen
    assert not (out / "webshop_grpo_test" / ".secrets").exists()  # removed when verl exited
    written = _written_files(out, caller, ray_temp)
    assert any(p.name == "train.log" for p in written) and any(p.name == "overrides.yaml" for p in written)
    assert any(p.name == "runtime_env_agent.log" for p in written)  # Ray's own logs are searched too
    leaks = [str(p) for p in written for value in (WANDB_KEY, HF_KEY) if value.encode() in p.read_bytes()]
    assert not leaks, f"a secret was written to {leaks}"
    assert WANDB_KEY not in output and HF_KEY not in output


def _config(name: str, *overrides: str) -> object:
    from agent_trainer.cli import composed_config
    from agent_trainer.config import training_config_dir

    return composed_config(name, list(overrides), training_config_dir(), {})


def test_batch_sizes_are_checked_against_all_nodes_gpus() -> None:
    """What a 2 x 8 GPU job runs: the full config fits (512 sequences, 32 per GPU, mini-batches of 8 per GPU);
    the test config does not (1 sequence per GPU's mini-batch, micro-batches of 2)."""
    from agent_trainer.cli import batch_problems

    assert batch_problems(_config("full", "trainer.nnodes=2", "trainer.n_gpus_per_node=8")) == []
    problems = batch_problems(_config("test", "trainer.nnodes=2", "trainer.n_gpus_per_node=8"))
    assert problems == ["each GPU's mini-batch (ppo_mini_batch_size x rollout.n / GPUs = 1) is not a multiple of "
                        "ppo_micro_batch_size_per_gpu (2)"]  # fmt: skip
    problems = batch_problems(_config("full", "trainer.nnodes=3", "trainer.n_gpus_per_node=8"))
    assert any("512 sequences per step do not divide among 24 GPUs" in p for p in problems), problems
    assert batch_problems(_config("test", "trainer.nnodes=2", "trainer.n_gpus_per_node=8",
                                  "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1")) == []  # fmt: skip


@pytest.mark.slow  # two launcher dry runs (composition with verl: 20-70 s each on 2 cores)
def test_slurm_node_count_reaches_verl_and_a_misfit_is_refused(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTRL_", "WEBSHOP_", "RAY_"))}

    def dry_run(**extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "agent_trainer.cli", "train", "--config", "full", "--dry-run", "--output-dir",
             str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**env, **extra},
        )  # fmt: skip

    fits = dry_run(AGENTRL_NNODES="2", AGENTRL_N_GPUS="8")
    assert fits.returncode == 0, fits.stderr[-3000:]
    assert " trainer.nnodes=2" in fits.stderr
    misfit = dry_run(AGENTRL_NNODES="3", AGENTRL_N_GPUS="8")
    assert misfit.returncode == 2 and "do not fit 3 node(s) x 8 GPU(s)" in misfit.stderr, misfit.stderr[
        -2000:
    ]


def _checkpoint(
    root: Path, step: int, ranks: int = 2, data: bool = True, missing_rank: int | None = None
) -> None:
    actor = root / f"global_step_{step}" / "actor"
    actor.mkdir(parents=True)
    for rank in range(ranks):
        if rank != missing_rank:
            (actor / f"model_world_size_{ranks}_rank_{rank}.pt").write_bytes(b"x")
    if data:
        (root / f"global_step_{step}" / "data.pt").write_bytes(b"x")


def _verl_resume_dir(root: Path) -> str | None:
    """What verl's resume_mode=auto picks (its own find_latest_ckpt_path)."""
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    return find_latest_ckpt_path(str(root))


@pytest.mark.parametrize(
    "case, expected",
    [
        ("sound", 4),  # the tracker names a complete checkpoint: left alone
        ("killed_while_saving", 2),  # step 4 half written (no data.pt); the tracker names step 2: whole
        ("tracker_ahead", 2),  # the tracker says 4, whose rank 1 never arrived
        ("rotated", 4),  # max_actor_ckpt_to_keep=1 removed step 2's actor before step 4's data.pt
        ("empty_tracker", 4),
        ("nothing_complete", None),
    ],
)
def test_resume_never_picks_a_half_written_checkpoint(
    tmp_path: Path, case: str, expected: int | None
) -> None:
    from agent_trainer.cli import TRACKER, repair_resume_point

    root = tmp_path / "checkpoints"
    tracker = root / TRACKER
    if case == "sound":
        _checkpoint(root, 2)
        _checkpoint(root, 4)
        tracker.write_text("4")
    elif case == "killed_while_saving":
        _checkpoint(root, 2)
        _checkpoint(root, 4, data=False, missing_rank=1)
        tracker.write_text("2")
    elif case == "tracker_ahead":
        _checkpoint(root, 2)
        _checkpoint(root, 4, missing_rank=1)
        tracker.write_text("4")
    elif case == "rotated":
        _checkpoint(root, 4, data=False)
        (root / "global_step_2").mkdir(parents=True)
        (root / "global_step_2" / "data.pt").write_bytes(b"x")  # its actor/ rotated away
        tracker.write_text("2")
    elif case == "empty_tracker":
        _checkpoint(root, 4)
        tracker.write_text("")
    else:
        _checkpoint(root, 2, missing_rank=0)
        tracker.write_text("2")
    message = repair_resume_point(root)
    assert (message is None) == (case in ("sound", "killed_while_saving"))
    picked = _verl_resume_dir(root)
    assert picked == (None if expected is None else str(root / f"global_step_{expected}")), (message, picked)


def test_a_dead_head_is_named_before_verl_waits_on_it() -> None:
    """The launcher checks the head of the cluster it joins (RAY_ADDRESS) before verl's ray.init, which would retry
    for minutes without a word: a refused port is named at once, a listening one passes."""
    import socket

    from agent_trainer.cli import head_unreachable

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    problem = head_unreachable({"RAY_ADDRESS": f"127.0.0.1:{port}"})
    assert (
        problem is not None and f":{port} refuses connections" in problem
    )  # (Ray names 127.0.0.1 by its IP)
    with socket.socket() as listening:
        listening.bind(("0.0.0.0", 0))  # every address: Ray checks the machine's own IP for 127.0.0.1
        listening.listen()
        assert head_unreachable({"RAY_ADDRESS": f"127.0.0.1:{listening.getsockname()[1]}"}) is None


def test_the_secrets_file_goes_when_the_run_is_told_to_stop(tmp_path: Path) -> None:
    """A preempted Slurm job gets SIGTERM, then SIGKILL after KillWait: the launcher removes the secrets file at
    the SIGTERM (the workers read it when they started), not in a `finally` that a SIGKILL would skip."""
    import signal
    import threading

    from agent_trainer.cli import _run_logged

    path = worker_secrets.write_secrets(
        worker_secrets.secrets_path(tmp_path / "run"), {"WANDB_API_KEY": WANDB_KEY}
    )
    seen: list[bool] = []
    command = [sys.executable, "-c", "import time, signal, sys\n"
               "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\nprint('ready', flush=True)\ntime.sleep(60)"]  # fmt: skip
    timer = threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.start()
    code = _run_logged(command, dict(os.environ), tmp_path, tmp_path / "train.log", "catalog: test",
                       on_stop=lambda: (seen.append(path.exists()), worker_secrets.remove_secrets(path)))  # fmt: skip
    timer.cancel()
    assert code == 0 and seen == [True]
    assert not path.exists() and not path.parent.exists()
