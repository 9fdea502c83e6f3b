#!/usr/bin/env bash
# Stage 1: per-platform teacher SFT with verl's SFT trainer (Ray, no torchrun).
#   bash recipes/ui_mopd/run_stage1.sh desktop|mobile [hydra overrides...]
# Needs: SFT parquet from `verl-mopd prepare` (SFT_TRAIN_FILES / SFT_VAL_FILES), TEACHER_BASE, CKPT_DIR
# (absolute, on shared storage: checkpoints go to $CKPT_DIR/UI-MOPD/stage1-<platform>-teacher-sft).
set -euo pipefail
platform=${1:?usage: run_stage1.sh desktop|mobile [overrides...]}; shift
here=$(cd "$(dirname "$0")" && pwd)
recipe=stage1_teacher_sft_${platform}
ckpt=${CKPT_DIR:?set CKPT_DIR to an absolute folder on storage every node mounts (checkpoints go there)}
[[ "$ckpt" = /* ]] || { echo "CKPT_DIR=$ckpt must be an absolute path" >&2; exit 2; }
verl-mopd validate-recipe --head "$here/$recipe.yaml" "$@"  # on the head node: every local path must exist
python -m verl.trainer.sft_trainer_ray --config-path="$here" --config-name="$recipe" "$@"
# Then convert the Megatron checkpoint to Hugging Face format for stage 2, with verl's merger:
#   python -m verl.model_merger merge --backend megatron \
#       --local_dir $CKPT_DIR/UI-MOPD/stage1-${platform}-teacher-sft/global_step_N \
#       --target_dir /path/to/stage1-${platform}-teacher/huggingface
