#!/usr/bin/env bash
# One-GPU smoke run of the real entry point: 3 steps of stage-2 MOPD with tiny random models. Student
# on verl's Megatron engine + SGLang rollout; the desktop teacher on the `hf` backend (CPU worker),
# the mobile teacher on the `megatron` backend (forward only, colocated on the actor's GPU). Then
# asserts K3 finite, the reward gate's on-fraction strictly in (0, 1) and both teachers' stored
# log-probs equal to a direct forward (scripts/gpu_smoke.py verify). Needs one CUDA GPU and
# `pip install -e ".[megatron,sglang]"`; the training command is cut off after 8 minutes.
#   bash scripts/gpu_smoke.sh [/tmp/verl_mopd_smoke] [extra hydra overrides...]
set -euo pipefail
root=${1:-/tmp/verl_mopd_smoke}; shift || true
here=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$root" && mkdir -p "$root"
verl-mopd check
python "$here/scripts/gpu_smoke.py" preflight "$root"
python "$here/scripts/gpu_smoke.py" build "$root"
mapfile -t overrides < <(python "$here/scripts/gpu_smoke.py" overrides "$root")
export VERL_FILE_LOGGER_PATH="$root/metrics.jsonl" VERL_MOPD_TEACHER_DUMP="$root/teacher_dumps"
timeout 480 python -m verl_mopd.trainer.main "${overrides[@]}" "$@" 2>&1 | tee "$root/smoke.log"
python "$here/scripts/gpu_smoke.py" verify "$root"
