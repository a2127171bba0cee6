#!/usr/bin/env bash
# Rehearsal prototype, verl 0.7.1: the project's launcher (webshop_trainer.verl_main = verl main_ppo + TaskRunner
# subclass) on CPU, 2 FSDP ranks (fake Ray GPUs), CPU rollout stand-in, WebShop agent loop vs local env cluster.
# Usage: run071b.sh STEPS [extra hydra overrides]
set -euo pipefail
S=/work/scratch-rehearse
STEPS=${1:-2}; shift || true
export PYTHONPATH=$S:${PYTHONPATH:-}
export WEBSHOP_URL=${WEBSHOP_URL:-http://127.0.0.1:36113}
export WEBSHOP_INTERACTION_CONFIG=/work/main/configs/webshop_interaction.yaml
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false RAY_DEDUP_LOGS=0 HYDRA_FULL_ERROR=1
export TORCHINDUCTOR_CACHE_DIR=$S/inductor
cd $S/run071b
exec /work/main/.venv/bin/python -m verl.trainer.main_ppo \
  --config-path /work/main/configs --config-name webshop_grpo_test \
  hydra.run.dir=$S/run071b/hydra \
  data.train_files=$S/data/train.parquet data.val_files=$S/data/eval.parquet \
  data.train_batch_size=2 data.train_max_samples=8 data.val_max_samples=2 \
  data.max_prompt_length=1024 data.max_response_length=256 data.dataloader_num_workers=0 \
  actor_rollout_ref.model.path=$S/tiny \
  actor_rollout_ref.model.enable_gradient_checkpointing=false \
  actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 \
  actor_rollout_ref.actor.strategy=fsdp2 +actor_rollout_ref.actor.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap=[Qwen2DecoderLayer] +actor_rollout_ref.ref.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap=[Qwen2DecoderLayer] actor_rollout_ref.actor.optim.lr=1e-4 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1 \
  actor_rollout_ref.rollout.name=cpu actor_rollout_ref.rollout.n=2 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1 \
  actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3 actor_rollout_ref.rollout.multi_turn.max_user_turns=3 \
  actor_rollout_ref.rollout.agent.num_workers=2 \
  actor_rollout_ref.rollout.agent.default_agent_loop=webshop_agent \
  actor_rollout_ref.rollout.agent.agent_loop_config_path=/work/main/configs/webshop_agent_loop.yaml \
  reward.num_workers=1 \
  trainer.n_gpus_per_node=1 trainer.total_training_steps=$STEPS trainer.save_freq=2 trainer.test_freq=2 \
  trainer.logger='[console,file]' trainer.experiment_name=rehearse071 \
  trainer.default_local_dir=$S/run071b/ckpt trainer.validation_data_dir=$S/run071b/validation \
  ray_kwargs.ray_init.num_cpus=16 +ray_kwargs.ray_init.num_gpus=1 +ray_kwargs.ray_init.include_dashboard=false \
  +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=rehearse.cpu_patch.setup \
  +ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH=$PYTHONPATH \
  +ray_kwargs.ray_init.runtime_env.env_vars.WEBSHOP_URL=$WEBSHOP_URL \
  +ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS="'1'" \
  "$@"
