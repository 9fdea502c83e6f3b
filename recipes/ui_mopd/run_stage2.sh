#!/usr/bin/env bash
# Stage 2: MOPD of the shared student. Run on the head node of a Ray cluster (ray start --head on
# it, ray start --address=... on the others), or submit with `ray job submit -- bash run_stage2.sh`.
#   RECIPE=stage2_mopd_qwen3vl8b bash recipes/ui_mopd/run_stage2.sh [hydra overrides...]
# Needs: TRAIN_FILES / VAL_FILES (verl-mopd prepare), STUDENT_PATH, DESKTOP_TEACHER, MOBILE_TEACHER,
# CKPT_DIR (absolute, on shared storage: checkpoints go to $CKPT_DIR/UI-MOPD/<experiment_name>).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
recipe=${RECIPE:-stage2_mopd_qwen3vl8b}
ckpt=${CKPT_DIR:?set CKPT_DIR to an absolute folder on storage every node mounts (checkpoints go there)}
[[ "$ckpt" = /* ]] || { echo "CKPT_DIR=$ckpt must be an absolute path" >&2; exit 2; }
verl-mopd validate-recipe --head "$here/$recipe.yaml" "$@"  # on the head node: every local path must exist
python -m verl_mopd.trainer.main --config-path="$here" --config-name="$recipe" "$@"
