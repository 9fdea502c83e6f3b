#!/usr/bin/env bash
# Mutation testing of the MOPD core with mutmut 3 (pip install -e '.[dev]'); not in CI: it is slow.
#
#   scripts/mutation.sh                  # every module below (hours on 2 cores)
#   scripts/mutation.sh router gate      # some of them
#   scripts/mutation.sh --survivors gate # after adding tests: rerun only the mutants that survived
#   scripts/mutation.sh --score          # only print the scores of what the last runs left in mutants/
#
# Modules: losses (with verl_loss.py, its verl adapter) router gate score quota sampler smoke (the smoke's check functions only); losses-core.
# Install: pip install "mutmut>=3.8,<4" (3.8.1 measured the scores in docs/reliability.md).
# The tests it runs are the fast ones listed under [tool.mutmut] in pyproject.toml; mutmut maps each
# mutated function to the tests that call it and runs only those, one mutant at a time, under
# `nice -n 19` with one worker. Results stay in mutants/ (git-ignored) and a rerun only tests what
# changed. Survivors: `mutmut results`, `mutmut show <name>`. Every survivor is killed by a test or
# listed as equivalent in docs/reliability.md ("Mutation testing").
set -euo pipefail
cd "$(dirname "$0")/.."

declare -A GLOBS=(
  [losses]="verl_mopd.losses.* verl_mopd.verl_loss.*"
  # the loss's pure core: K3, the reward gate, the thought window, kept weights, mopd_kl_loss
  [losses-core]="verl_mopd.losses.xǁ_K3ǁ* verl_mopd.losses.x_k3_kl__* verl_mopd.losses.x__group_index__*
                 verl_mopd.losses.x_reward_gate__* verl_mopd.losses.x_thought_end_index__*
                 verl_mopd.losses.x__thought_window_BT__* verl_mopd.losses.x_counted_tokens__*
                 verl_mopd.losses.x_kept_kl_mask__* verl_mopd.losses.x_mopd_kl_loss__*"
  [router]="verl_mopd.teachers.router.*"
  [gate]="verl_mopd.trainer.gate.*"
  [score]="verl_mopd.rewards.score.*"
  [quota]="verl_mopd.batching.quota.*"
  [sampler]="verl_mopd.batching.sampler.*"
  # the check functions of `verl-mopd smoke` that read a run's files (not the ones that load models)
  [smoke]="verl_mopd.testing.smoke.x__check_stage1__* verl_mopd.testing.smoke.x__check_tp__*
           verl_mopd.testing.smoke.x__k3_rows__* verl_mopd.testing.smoke.x__check_k3__*
           verl_mopd.testing.smoke.x__check_gate__* verl_mopd.testing.smoke.x__check_gate_value__*
           verl_mopd.testing.smoke.x__check_pg__*
           verl_mopd.testing.smoke.x__check_platform_metrics__* verl_mopd.testing.smoke.x__check_syncs__*
           verl_mopd.testing.smoke.x__check_resume__* verl_mopd.testing.smoke.x__same_state__*
           verl_mopd.testing.smoke.x_k3_reference__* verl_mopd.testing.smoke.x_read_metrics__*
           verl_mopd.testing.smoke.x_format_table__* verl_mopd.testing.smoke.xǁCheckǁas_dict__*"
)
ORDER=(losses router gate score quota sampler smoke)  # losses-core: a part of losses, named on its own

score_only=0
survivors=0
modules=()
for arg in "$@"; do
  case "$arg" in
    --score) score_only=1 ;;
    --survivors) survivors=1 ;;
    *) [[ -n "${GLOBS[$arg]+x}" ]] || { echo "scripts/mutation.sh: unknown module '$arg' (one of: ${ORDER[*]})" >&2; exit 2; }
       modules+=("$arg") ;;
  esac
done
[[ ${#modules[@]} -gt 0 ]] || modules=("${ORDER[@]}")

export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1  # one core per mutant; forked workers and OpenMP do not mix

if [[ $score_only -eq 0 ]]; then
  command -v mutmut >/dev/null || { echo "scripts/mutation.sh: mutmut not found: pip install 'mutmut>=3.8,<4'" >&2; exit 2; }
  globs=()
  if [[ $survivors -eq 1 ]]; then
    # the names of the survivors (and untested mutants) of these modules, from the last run's results
    mapfile -t globs < <(MUTATION_LIST_UNRUN=1 "$0" --score "${modules[@]}" |
                         awk '$1 == "survived" || $1 == "no" || $1 == "not" {print $NF}')
    [[ ${#globs[@]} -gt 0 ]] || { echo "scripts/mutation.sh: no survivors to rerun"; exit 0; }
  else
    for m in "${modules[@]}"; do
      # shellcheck disable=SC2206  # word splitting of the glob list is intended
      globs+=(${GLOBS[$m]})
    done
  fi
  # naming mutants makes mutmut test them again, whatever an earlier run found
  nice -n 19 mutmut run --max-children 1 "${globs[@]}" || true
fi

# The score per module: killed / (killed + survived + no tests + timeout + suspicious), from mutmut's files.
python - "${modules[@]}" <<'EOF'
import fnmatch, json, os, sys
from collections import Counter
from pathlib import Path

from mutmut.stats import status_by_exit_code

files = {"losses": "verl_mopd/losses.py", "losses-core": "verl_mopd/losses.py", "router": "verl_mopd/teachers/router.py",
         "gate": "verl_mopd/trainer/gate.py", "score": "verl_mopd/rewards/score.py",
         "quota": "verl_mopd/batching/quota.py", "sampler": "verl_mopd/batching/sampler.py",
         "smoke": "verl_mopd/testing/smoke.py"}
smoke_functions = ["x__check_stage1", "x__check_tp", "x__k3_rows", "x__check_k3", "x__check_gate",
                   "x__check_gate_value", "x__check_pg",
                   "x__check_platform_metrics", "x__check_syncs", "x__check_resume", "x__same_state",
                   "x_k3_reference", "x_read_metrics", "x_format_table", "xǁCheckǁas_dict"]
core_functions = ["xǁ_K3ǁforward", "xǁ_K3ǁbackward", "x_k3_kl", "x__group_index", "x_reward_gate",
                  "x_thought_end_index", "x__thought_window_BT", "x_counted_tokens", "x_kept_kl_mask", "x_mopd_kl_loss"]
print(f"{'module':<11} {'mutants':>7} {'killed':>6} {'survived':>8} {'no tests':>8} {'other':>5} {'unrun':>5}  score")
for module in sys.argv[1:]:
    meta = Path("mutants") / (files[module] + ".meta")
    if not meta.exists():
        print(f"{module:<11} (not run)")
        continue
    results = json.loads(meta.read_text())["exit_code_by_key"]
    scope = {"smoke": smoke_functions, "losses-core": core_functions}.get(module)
    if scope:
        results = {k: v for k, v in results.items()
                   if any(fnmatch.fnmatch(k.rsplit(".", 1)[1], f + "__mutmut_*") for f in scope)}
    counts = Counter(status_by_exit_code[v] for v in results.values())
    killed, survived, untested = counts["killed"] + counts["timeout"], counts["survived"], counts["no tests"]
    unrun = counts["not checked"] + counts["skipped"]
    other = sum(counts.values()) - killed - survived - untested - unrun
    tested = killed + survived + untested + other
    score = f"{100 * killed / tested:.1f}%" if tested else "-"
    print(f"{module:<11} {len(results):>7} {killed:>6} {survived:>8} {untested:>8} {other:>5} {unrun:>5}  {score}")
    shown = ("survived", "no tests", "suspicious", "segfault") + (
        ("not checked",) if os.environ.get("MUTATION_LIST_UNRUN") else ())
    for name, v in sorted(results.items()):
        if status_by_exit_code[v] in shown:
            print(f"    {status_by_exit_code[v]:<11} {name}")
EOF
