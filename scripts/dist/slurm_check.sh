#!/usr/bin/env bash
# slurm_check.sh: `srun colossal train` and the 1-node sbatch example under a real (one-node) SLURM.
# Starts the cluster (scripts/dist/slurm_cluster.sh), runs `srun -n 2 -c 1 colossal train` on the tiny
# recipe with batch 4 per task and `sbatch --wait scripts/slurm/train-1node.sbatch` the same way, checks
# that each ends with the weights of one process with batch 8 on the same global batch, and stops the
# daemons it started. Exit 77 (skip, with the reason) where the machine cannot run SLURM.
#   scripts/dist/slurm_check.sh [--colossal BIN] [--python PY]
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=check_common.sh
source scripts/dist/check_common.sh "$@"
export COLOSSAL_SLURM_DIR="${TMPDIR:-/tmp}/colossal-slurm-$$"
rc=0
bash scripts/dist/slurm_cluster.sh start || rc=$?
((rc == 0)) || { bash scripts/dist/slurm_cluster.sh stop; rm -rf "$COLOSSAL_SLURM_DIR"; exit "$rc"; }
TMP="$(mktemp -d "${TMPDIR:-/tmp}/slurm_check.XXXXXX")"
chmod 755 "$TMP"
trap 'bash scripts/dist/slurm_cluster.sh stop; rm -rf "$TMP" "$COLOSSAL_SLURM_DIR"' EXIT
eval "$(bash scripts/dist/slurm_cluster.sh env)"

"$COLOSSAL" data prepare-recipe "$RECIPE" >/dev/null
echo "slurm_check: one process, batch 8"
OMP_NUM_THREADS=1 "$COLOSSAL" train "$RECIPE" "${DP_ARGS[@]}" --set train.batch_size=8 --set "output.dir=$TMP/one"

echo "slurm_check: srun -n 2 -c 1 colossal train, batch 4 per task"
timeout 300 srun -n 2 -c 1 --kill-on-bad-exit=1 "$COLOSSAL" train "$RECIPE" "${DP_ARGS[@]}" --set train.batch_size=4 \
  --set "output.dir=$TMP/srun" >"$TMP/srun.log" 2>&1 || { echo "slurm_check: error: srun failed:" >&2; tail -n 10 "$TMP/srun.log" >&2; exit 1; }
grep -h "done:" "$TMP/srun.log" || true
"$PY" scripts/dist/compare_weights.py "$TMP/srun" "$TMP/one" 1e-6

echo "slurm_check: sbatch --wait scripts/slurm/train-1node.sbatch, batch 4 per task"
RECIPE="$RECIPE" COLOSSAL="$COLOSSAL" timeout 300 sbatch --wait --export=ALL --output="$TMP/sbatch-%j.out" \
  scripts/slurm/train-1node.sbatch "${DP_ARGS[@]}" --set train.batch_size=4 --set "output.dir=$TMP/sbatch" >/dev/null ||
  { echo "slurm_check: error: the sbatch job failed:" >&2; tail -n 10 "$TMP"/sbatch-*.out >&2; exit 1; }
grep -h "done:" "$TMP"/sbatch-*.out || true
"$PY" scripts/dist/compare_weights.py "$TMP/sbatch" "$TMP/one" 1e-6
echo "slurm_check: passed"
