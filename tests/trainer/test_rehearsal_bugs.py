"""The rehearsal's checks see the bugs they exist for (docs/rehearsal.md), each bug put in through the rehearsal's
test seam (``agent_trainer.rehearsal.inject``, ``$AGENTRL_REHEARSAL_INJECT``):

- at the unit level, on verl 0.7.1's own data: verl's ``AgentLoopWorker`` plays real episodes (both WebShop agent
  loops, the env in-process) for a scripted policy whose rollouts earn different rewards; the trainer's batch is
  built as ``RayPPOTrainer.fit`` builds it (verl's ``compute_advantage``); the actor's update is simulated as one
  that follows the trainer's advantages; the step checks run as in the trainer. A flipped reward, a loss mask over
  the env pages, each must fail its check; without them every check passes;
- the weight-sync check, on a real tiny model: the rollout server's load and scoring against an actor moved by one
  optimizer step at the rehearsal's learning rate, through the real rollout adapter with each sync bug injected;
- verl 0.7.1's resume from a checkpoint saved at an epoch's end (``verl_main.install_epoch_resume``): its own
  ``_save_checkpoint``/``_load_checkpoint`` and dataloader, the next epoch's batches counted;
- end to end (slow): ``agent-train rehearse`` with a bug injected exits 1 and names the check
  (tests/trainer/verl09/test_rehearsal_bugs_verl09.py does the same on the 0.9 line). The full matrix, every bug on
  both lines: ``make rehearse-bugs``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip(
    "verl.interactions", reason="the verl 0.7.1 line (tests/trainer/verl09 has the 0.9 line's)"
)

from agent_trainer.harness import ScriptedServer

PENALTY = 0.1
REPO = Path(__file__).resolve().parents[2]


class MixedPolicy(ScriptedServer):
    """The oracle's plan in every other trajectory, replies without an action in the others (so a GRPO group's
    rewards differ); every generation recorded as the rehearsal's rollout server records it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.records: list[Any] = []
        self._sessions: dict[str, bool] = {}

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: Any, **kwargs: Any
    ) -> Any:
        from agent_trainer.rehearsal.checks import Generation, prompt_digest

        good = self._sessions.setdefault(request_id, len(self._sessions) % 2 == 0)
        if good:
            output = await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params,
                                            **kwargs)  # fmt: skip
        else:
            self.calls += 1
            tokens = [
                *self.tokenizer.encode("I am not sure.", add_special_tokens=False),
                self.tokenizer.eos_token_id,
            ]
            output = self._output(tokens, None)
        self.records.append(Generation(len(prompt_ids), prompt_digest(prompt_ids), tuple(output.token_ids)))
        return output


@pytest.fixture(scope="module")
def tiny_model(generated_catalog_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agent_trainer.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"), generated_catalog_dir)


def _roll(
    agent: str, catalog: Path, model: Path, plans: dict[int, list[str]], tmp: Path
) -> tuple[Any, Any, Any]:
    """verl's agent-loop worker over two goals x 4 rollouts; returns (trainer batch, policy, tokenizer)."""
    from omegaconf import OmegaConf
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.trainer.main_ppo import create_rl_dataset
    from verl.trainer.ppo import ray_trainer
    from verl.utils import hf_tokenizer

    from agent_trainer.config import AGENT_LOOP_CONFIG, INTERACTION_CONFIG, config_dir
    from agent_trainer.envs.webshop.data import build_dataset
    from agent_trainer.harness import LocalAgentLoopWorker, generation_batch
    from agent_trainer.interaction import close_shared_clients
    from agent_trainer.preflight import compose_training_config

    train_file = tmp / f"train_{agent}.parquet"
    build_dataset(catalog, "train", train_file, goal_set="synthetic", goal_ids=list(plans), progress=False,
                  agent_name=agent)  # fmt: skip
    overrides = [f"actor_rollout_ref.model.path={model}", f"data.train_files={train_file}",
                 f"data.val_files={train_file}", "data.train_max_samples=-1", "actor_rollout_ref.rollout.n=4",
                 "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=6", "data.max_response_length=4096",
                 f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={config_dir() / INTERACTION_CONFIG}",
                 f"actor_rollout_ref.rollout.agent.agent_loop_config_path={config_dir() / AGENT_LOOP_CONFIG}"]  # fmt: skip
    _, config = compose_training_config("webshop_grpo_test", overrides, config_dir())
    OmegaConf.resolve(config)
    tokenizer = hf_tokenizer(str(model))
    dataset = create_rl_dataset([str(train_file)], config.data, tokenizer, None, is_train=True)
    samples = [dataset[i] for i in range(len(dataset))]
    policy = MixedPolicy(tokenizer, {s["extra_info"]["instruction"]: plans[int(s["extra_info"]["goal"])]
                                     for s in samples})  # fmt: skip

    generated = generation_batch(samples, 4)  # the trainer's batch: the rows' reward keys and uids, repeated

    async def roll() -> Any:
        worker = LocalAgentLoopWorker(config, policy, RewardLoopWorker(config))
        try:
            return await worker.generate_sequences(generated)
        finally:
            await close_shared_clients()

    batch = asyncio.run(roll())
    for key in ("uid", "extra_info", "data_source"):  # what fit's batch.union(gen_batch_output) carries over
        batch.non_tensor_batch.setdefault(key, generated.non_tensor_batch[key])
    batch.batch["token_level_scores"] = batch.batch["rm_scores"]
    batch.batch["token_level_rewards"] = batch.batch["rm_scores"]
    if "response_mask" not in batch.batch.keys():  # noqa: SIM118 - TensorDict has no `in`
        batch.batch["response_mask"] = ray_trainer.compute_response_mask(batch)
    batch = ray_trainer.compute_advantage(batch, adv_estimator="grpo", num_repeat=4, norm_adv_by_std_in_grpo=True,
                                          config=config.algorithm)  # fmt: skip
    # the actor's log-probs before the update, and an update that follows the trainer's advantages on its loss mask
    before = -torch.rand(batch.batch["responses"].shape, generator=torch.Generator().manual_seed(0)) - 0.5
    batch.batch["old_log_probs"] = before
    after = before + 0.01 * batch.batch["advantages"] * batch.batch["response_mask"]
    return batch, (policy, after), tokenizer


@pytest.mark.slow
@pytest.mark.parametrize("agent", ["tool_agent", "webshop_agent"])
def test_the_step_checks_see_a_flipped_reward_and_a_mask_over_env_pages(
    agent: str, in_process_env: Any, generated_catalog_dir: Path, tiny_model: Path,
    expert_plans_generated: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from agent_trainer.rehearsal import checks, inject
    from agent_trainer.rehearsal.direction import trajectories_verl07

    monkeypatch.setenv("AGENTRL_URL", "http://webshop.invalid")  # the in-process env answers whatever the URL
    monkeypatch.setenv("AGENTRL_INVALID_ACTION_PENALTY", str(PENALTY))
    plans = dict(list(expert_plans_generated.items())[:2])
    env = checks.make_core("webshop", generated_catalog_dir)

    def judged(bug: str | None) -> dict[str, Any]:
        with monkeypatch.context() as patch, inject.restored():
            if bug:
                patch.setenv(inject.ENV, bug)
                assert inject.apply() == [bug]
            batch, (policy, after), tokenizer = _roll(
                agent, generated_catalog_dir, tiny_model, plans, tmp_path
            )
        trajectories = trajectories_verl07(batch)
        for i, trajectory in enumerate(trajectories):
            trajectory.after = after[i, : len(trajectory.before)].double().numpy()
        return checks.step_record(1, trajectories, checks.GenerationIndex(policy.records), env,
                                  lambda ids: tokenizer.decode(ids, skip_special_tokens=True), PENALTY, agent)  # fmt: skip

    clean = judged(None)
    assert clean["mask"]["ok"] and clean["mask"]["model_tokens"] > 0, clean["mask"]
    assert clean["reward"]["ok"] and clean["reward"]["purchases_with_reward"] == 4, clean["reward"]
    assert clean["direction"]["informative"] and clean["direction"]["right_way"], clean["direction"]

    flipped = judged("reward_sign")
    assert not flipped["reward"]["ok"] and flipped["reward"]["mismatched"] == 8, flipped["reward"]
    assert flipped["direction"]["informative"] and not flipped["direction"]["right_way"], flipped["direction"]
    assert flipped["mask"]["ok"]

    masked = judged("mask_env_pages")
    assert not masked["mask"]["ok"] and masked["mask"]["env_tokens_in_loss"] > masked["mask"]["model_tokens"]
    assert masked["reward"]["ok"]


def _server(model: Any) -> Any:
    """The rehearsal's rollout server around ``model`` (its real methods; no Ray actor, no verl config)."""
    from agent_trainer.rehearsal.cpu_rollout import CpuLLMServer

    server = CpuLLMServer.__new__(CpuLLMServer)
    server.model, server.replica_rank, server.weight_version, server.global_steps = model, 0, 0, None
    server._lock, server._generations = threading.Lock(), []
    server._sync = {"version": 0, "global_steps": None, "tensors": 0, "missing": [], "unknown": []}
    return server


def _adapter(server: Any) -> Any:
    """The rehearsal's rollout adapter (inside an FSDP worker in a run) pushing to ``server``."""
    from agent_trainer.harness import LocalRemote
    from agent_trainer.rehearsal.cpu_rollout import CpuServerAdapter

    adapter = CpuServerAdapter.__new__(CpuServerAdapter)
    adapter.device_mesh, adapter.rollout_rank, adapter.replica_rank = None, 0, 0
    adapter._server = SimpleNamespace(update_weights=LocalRemote(server.update_weights))
    return adapter


@pytest.mark.parametrize("bug", [None, "sync_skip", "sync_partial", "sync_stale", "renamed"])
def test_the_sync_check_sees_a_skipped_partial_stale_or_misnamed_sync(
    bug: str | None, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM

    from agent_trainer.rehearsal import checks, cpu_rollout, inject
    from agent_trainer.rehearsal.generation import score_tokens

    monkeypatch.setattr(
        cpu_rollout.CpuServerAdapter, "update_weights", cpu_rollout.CpuServerAdapter.update_weights
    )
    if bug and bug != "renamed":
        monkeypatch.setenv(inject.ENV, bug)
        inject.apply()
    torch.manual_seed(0)
    actor = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    server = _server(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval())
    adapter = _adapter(server)
    sequence = torch.randint(0, actor.config.vocab_size, (96,)).tolist()
    prompt, response = sequence[:32], sequence[32:]
    optimizer = torch.optim.AdamW(actor.parameters(), lr=1e-4)  # the rehearsal's learning rate
    versions: dict[int, int] = {}
    records = []
    for step in range(3):
        if step:  # one optimizer step of the actor, then the sync
            loss = actor(input_ids=torch.tensor([sequence]), labels=torch.tensor([sequence])).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        weights = ((name, tensor.detach()) for name, tensor in actor.state_dict().items())
        if bug == "renamed":  # a name-mapping regression: the actor's names with the wrapper's prefix left on
            weights = ((f"_fsdp_wrapped_module.{name}", tensor) for name, tensor in weights)
        asyncio.run(adapter.update_weights(weights, global_steps=step))
        with torch.no_grad():
            expected = np.asarray(score_tokens(actor, prompt, response, 1.5))
        served = np.asarray(server.score(prompt, response, 1.5))
        report = server.sync_report()
        replica = {"replica": 0, "version": report["version"], "tensors": report["tensors"],
                   "missing": report["missing"], "unknown": report["unknown"],
                   "max_abs_diff": float(np.abs(served - expected).max())}  # fmt: skip
        records.append(checks.sync_record(step + 1, step, [replica], versions))
        versions[0] = report["version"]
    ok = [r["ok"] for r in records]
    if bug is None:
        assert ok == [True, True, True], records
        assert max(r["replicas"][0]["max_abs_diff"] for r in records) < checks.SYNC_TOLERANCE / 10
    elif bug == "sync_skip":  # the first sync goes through, the later ones never reach the rollout
        assert ok == [True, False, False] and not records[1]["replicas"][0]["loaded"], records
    elif bug == "sync_partial":
        assert ok == [False] * 3 and all(n.startswith("model.layers.") and ".mlp." in n
                                         for n in records[0]["replicas"][0]["missing"]), records  # fmt: skip
    elif bug == "sync_stale":  # a new version each time, every name, but the first sync's values
        replica = records[1]["replicas"][0]
        assert ok == [True, False, False] and replica["loaded"] and not replica["missing"], records
        assert replica["max_abs_diff"] > 10 * checks.SYNC_TOLERANCE
    else:
        assert ok == [False] * 3 and records[0]["replicas"][0]["unknown"], records


def _epoch_trainer(directory: Path, dataset: list[int]) -> Any:
    """A ``RayPPOTrainer`` with its own checkpoint methods and a dataloader made as verl makes it (torchdata's
    ``StatefulDataLoader`` over verl's ``create_rl_sampler``); the workers are stubs (the model is not the point)."""
    from omegaconf import OmegaConf
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.trainer.main_ppo import create_rl_sampler
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    config = OmegaConf.create({
        "data": {"shuffle": True, "seed": 1, "sampler": None, "dataloader_num_workers": 0},
        "trainer": {"default_local_dir": str(directory), "default_hdfs_dir": None, "resume_mode": "auto",
                    "del_local_ckpt_after_load": False, "total_epochs": 2},
        "actor_rollout_ref": {"actor": {"checkpoint": {"async_save": False}}},
    })  # fmt: skip
    trainer = RayPPOTrainer.__new__(RayPPOTrainer)
    trainer.config, trainer.use_critic, trainer.global_steps = config, False, 0
    trainer.actor_rollout_wg = SimpleNamespace(save_checkpoint=lambda *a, **k: None,
                                               load_checkpoint=lambda *a, **k: None)  # fmt: skip
    trainer.train_dataloader = StatefulDataLoader(dataset, batch_size=4, drop_last=True, num_workers=0,
                                                  sampler=create_rl_sampler(config.data, dataset))  # fmt: skip
    return trainer


def _fit_epochs(trainer: Any, stop_at: int | None = None) -> list[list[int]]:
    """``RayPPOTrainer.fit``'s loop over epochs and batches (the step itself left out), saving as fit saves."""
    trainer._load_checkpoint()
    current_epoch = trainer.global_steps // len(trainer.train_dataloader)
    trained = []
    for _ in range(current_epoch, trainer.config.trainer.total_epochs):
        for batch in trainer.train_dataloader:
            trainer.global_steps += 1
            trained.append(batch.tolist())
            if trainer.global_steps == stop_at:
                trainer._save_checkpoint()
                return trained
    return trained


@pytest.mark.parametrize("with_fix", [True, False])
def test_a_resume_from_an_epoch_end_trains_the_next_epoch(
    with_fix: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from agent_trainer.verl_main import install_epoch_resume

    released = getattr(RayPPOTrainer._load_checkpoint, "__wrapped__", RayPPOTrainer._load_checkpoint)
    monkeypatch.setattr(RayPPOTrainer, "_load_checkpoint", released)  # verl 0.7.1 as released, restored after
    if with_fix:
        install_epoch_resume()  # what the launcher's task runner does (verl_main.WebshopTaskRunner)
    dataset = list(range(12))  # 3 batches of 4 per epoch
    uninterrupted = _fit_epochs(_epoch_trainer(tmp_path / "once", dataset))
    assert len(uninterrupted) == 6
    first = _fit_epochs(_epoch_trainer(tmp_path / "ckpt", dataset), stop_at=3)  # saved at the epoch's end
    assert (tmp_path / "ckpt" / "global_step_3" / "data.pt").exists() and first == uninterrupted[:3]
    resumed = _fit_epochs(
        _epoch_trainer(tmp_path / "ckpt", dataset)
    )  # "train it further: raise total_epochs"
    if with_fix:
        assert resumed == uninterrupted[3:]  # the next epoch, in the order the uninterrupted run had
    else:
        assert resumed == []  # verl 0.7.1 as released: the epoch is lost, and the run would exit 0
    # a resume inside the epoch is left as it was: the epoch's remaining batches, nothing skipped
    _fit_epochs(_epoch_trainer(tmp_path / "mid", dataset), stop_at=2)
    assert _fit_epochs(_epoch_trainer(tmp_path / "mid", dataset)) == uninterrupted[2:]


@pytest.mark.slow
def test_make_rehearse_fails_on_a_stale_weight_sync_on_the_07_line(tmp_path: Path) -> None:
    from agent_trainer.rehearsal.matrix import run_one

    catalog = Path(os.environ.get("CATALOG_DIR", REPO / "data" / "catalog"))
    if not (catalog / "manifest.json").exists():
        pytest.skip(f"no prepared catalog at {catalog}: make data")
    row = run_one(Path(sys.executable).parent.parent, "0.7", "sync_stale", tmp_path, catalog,
                  extra=["--outage-s", "0", "--model-dir", str(REPO / "outputs" / "rehearsal" / "tiny_model-webshop")])  # fmt: skip
    assert row["exit"] == 1 and row["failed_checks"] == ["weight_sync"], row
    summary = json.loads(Path(row["summary"]).read_text())
    assert summary["injected"] == ["sync_stale"] and not summary["ok"]
    stale = [s for s in summary["syncs"] if not s["ok"]]
    assert stale and stale[0]["loaded"] and not stale[0]["missing"] and stale[0]["max_abs_diff"] > 1e-3, (
        summary
    )
