#!/usr/bin/env bash
# One-GPU smoke run of the real entry point: 3 steps of stage-2 MOPD with tiny random models
# (student on verl's FSDP engine + SGLang rollout, two hf teachers on CPU workers), printing the
# per-platform metrics. Needs a CUDA GPU and `pip install -e ".[sglang]"`. ~5-10 minutes.
#   bash scripts/gpu_smoke.sh [/tmp/verl_mopd_smoke]
set -euo pipefail
root=${1:-/tmp/verl_mopd_smoke}
here=$(cd "$(dirname "$0")/.." && pwd)
python "$here/scripts/gpu_smoke.py" "$root"
teacher() {  # platform -> override block of an hf teacher on CPU
  echo "+mopd.teachers.$1={model_path: $root/$1, backend: hf, device: cpu, dtype: float32, n_gpus_per_node: 1, nnodes: 1}"
}
python -m verl_mopd.trainer.main \
  model_engine=dp \
  data.train_files="$root/data/train.parquet" data.val_files="$root/data/val.parquet" \
  data.train_batch_size=4 data.max_prompt_length=1024 data.max_response_length=32 data.image_key=null \
  actor_rollout_ref.model.path="$root/student" \
  actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
  actor_rollout_ref.rollout.name=sglang actor_rollout_ref.rollout.n=4 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.gpu_memory_utilization=0.3 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 \
  mopd.tau_kl=0.5 "$(teacher desktop)" "$(teacher mobile)" \
  trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.total_training_steps=3 trainer.logger='[console]' \
  trainer.val_before_train=false trainer.save_freq=-1 trainer.test_freq=-1 \
  trainer.default_local_dir="$root/ckpt" 2>&1 | tee "$root/smoke.log"
grep -E "mopd/kl_mask_on_fraction|mopd_teacher/.*/samples" "$root/smoke.log" | tail -6
