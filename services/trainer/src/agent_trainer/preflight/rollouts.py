"""Steps 4 and 5 of every stage: the stage's samples through the worker verl itself runs on the installed line
(in this process: :mod:`agent_trainer.harness`), that line's per-step bookkeeping over the trajectories, and each
trajectory's token stream checked."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config import installed_verl_line


async def run_interaction_rollouts(
    config: Any, samples: list[dict[str, Any]], n: int, server: Any
) -> dict[str, Any]:
    """verl 0.7.1's AgentLoopWorker -> ToolAgentLoop -> each row's interaction -> reward function, then the
    trainer's per-step bookkeeping over the output (advantages, metrics)."""
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    from ..harness.verl_local import (
        LocalAgentLoopWorker,
        generation_batch,
        step_metrics_v07,
        summarize_output,
    )
    from ..interaction import close_shared_clients

    worker = LocalAgentLoopWorker(config, server, RewardLoopWorker(config))
    batch = generation_batch(samples, n)
    started = time.monotonic()
    try:
        output = await worker.generate_sequences(batch)
    finally:
        await close_shared_clients()
    summary = summarize_output(output)
    summary["agent_loop_worker"] = type(worker).__mro__[1].__name__
    record_step_metrics(summary, lambda: step_metrics_v07(config, batch, output, time.monotonic() - started))
    summary["responses"] = [
        worker.tokenizer.decode(row[row != worker.tokenizer.pad_token_id][:400], skip_special_tokens=False)
        for row in output.batch["responses"][:2]
    ]
    return summary


def record_step_metrics(summary: dict[str, Any], compute: Callable[[], dict[str, Any]]) -> None:
    """Run the trainer's per-step metric computation; record its metrics, or the error that would end a run."""
    try:
        summary["step_metrics"], summary["step_metrics_error"] = compute(), None
    except Exception as error:
        summary["step_metrics"], summary["step_metrics_error"] = {}, f"{type(error).__name__}: {error}"


async def run_agent_loop_rollouts(
    config: Any, samples: list[dict[str, Any]], n: int, server: Any
) -> dict[str, Any]:
    """The rows' agent loops (``<env>_agent``) through the worker verl itself runs on the installed line, then that line's
    per-step bookkeeping: 0.7.1's ``AgentLoopWorker`` (no reward worker: the loop returns ``reward_score``);
    0.9.1's ``AgentLoopWorkerTQ`` through a real TransferQueue and the v1 trainer's metric computation."""
    from ..agent_loop import record_trajectories
    from ..harness.verl_local import (
        LocalAgentLoopWorker,
        generation_batch,
        local_transfer_queue,
        run_tq_rollouts,
        step_metrics_v07,
        summarize_output,
    )
    from ..interaction import close_shared_clients

    with record_trajectories() as records:
        try:
            if installed_verl_line() == "0.7":
                worker = LocalAgentLoopWorker(config, server, None)
                batch = generation_batch(samples, n)
                started = time.monotonic()
                output = await worker.generate_sequences(batch)
                summary = summarize_output(output)
                summary["agent_loop_worker"] = type(worker).__mro__[1].__name__
                record_step_metrics(
                    summary, lambda: step_metrics_v07(config, batch, output, time.monotonic() - started)
                )
                mask = output.batch["response_mask"]
                summary["padded_mask_ok"] = bool(((mask == 0) | (mask == 1)).all())
            else:
                with local_transfer_queue(config):
                    summary = await run_tq_rollouts(config, samples, server)
                summary["padded_mask_ok"] = (
                    True  # no padded batch on this path: the records are checked below
                )
        finally:
            await close_shared_clients()
    summary["records"] = list(records)
    return summary


def token_stream_report(records: Sequence[Mapping[str, Any]], tokenizer: Any) -> dict[str, Any]:
    """Check each trajectory's token stream.

    - the mask-1 tokens are exactly the tokens the model generated, in order; everything else has mask 0;
    - every trajectory whose replies re-tokenize to the generated tokens (always the scripted oracle's; a
      random model's only sometimes) equals the chat template's full render of its conversation (up to the
      template's separator after the last turn).
    """
    problems: list[str] = []
    compared = 0
    for number, record in enumerate(records):
        ids, mask, start = list(record["ids"]), list(record["mask"]), int(record["prompt_length"])
        response = ids[start:]
        model_tokens = [t for t, m in zip(response, mask, strict=True) if m == 1]
        generated = [t for turn in record["generated"] for t in turn]
        if model_tokens != generated:
            problems.append(f"trajectory {number}: mask-1 tokens are not the model's tokens")
        if len(record["generated"]) > 1 and 0 not in mask:
            problems.append(f"trajectory {number}: several turns but no env tokens (mask 0)")
        canonical = all(
            turn == [*tokenizer.encode(message["content"], add_special_tokens=False), tokenizer.eos_token_id]
            for turn, message in zip(record["generated"],
                                     [m for m in record["messages"] if m["role"] == "assistant"], strict=True)
        )  # fmt: skip
        if not canonical:
            continue
        compared += 1
        render = tokenizer.apply_chat_template(record["messages"], tokenize=True, add_generation_prompt=False)
        render = list(render["input_ids"] if isinstance(render, Mapping) else render)
        rest = render[len(ids) :]
        if render[: len(ids)] != ids or tokenizer.decode(rest).strip():
            problems.append(
                f"trajectory {number} ({record['mode']}): the token stream differs from the chat template's render"
            )
    return {"ok": not problems and compared > 0, "trajectories": len(records), "compared_with_render": compared,
            "problems": problems[:10]}  # fmt: skip


def load_samples(
    config_name: str, overrides: Sequence[str], directory: Path, model_dir: Path, train_file: Path
) -> tuple[Any, Any, list[dict[str, Any]]]:
    """A stage's start, whichever route it plays: ``config_name`` composed with ``overrides`` (resolved), the tiny
    model's tokenizer, and ``train_file``'s rows as verl's own dataset class yields them; ``(config, tokenizer,
    samples)``."""
    from omegaconf import OmegaConf
    from verl.utils import hf_tokenizer

    try:
        from verl.trainer.ppo.utils import create_rl_dataset  # verl 0.9
    except ImportError:
        from verl.trainer.main_ppo import create_rl_dataset  # verl 0.7.1

    from .configs import compose_training_config

    _, config = compose_training_config(config_name, overrides, directory)
    OmegaConf.resolve(config)
    tokenizer = hf_tokenizer(str(model_dir))
    dataset = create_rl_dataset([str(train_file)], config.data, tokenizer, None, is_train=True)
    return config, tokenizer, [dataset[i] for i in range(len(dataset))]
