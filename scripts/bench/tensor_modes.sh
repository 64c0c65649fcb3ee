#!/usr/bin/env bash
# tensor_modes.sh: what each tensor-parallel mode holds and moves per rank, measured on one GPT (gpt-tiny's
# data, width 256, 8 heads, T=128, B=16, AdamW, one thread per rank) against the cost table in
# ARCHITECTURE.md: 1D at 4 and 8 ranks, 1D with Megatron's sequence split (tensor_sequence) at 4, 2D at
# 4 (a 2 x 2 grid: 8 is not a square), 2.5D at 8 (two 2 x 2 grids) and 3D at 8 (2 x 2 x 2), beside one
# process. Per rank (rank 0): parameter memory (the chunk store's, summary.json held_mb.params),
# activation memory (metrics' tensor_peak_mb: ATen's exact tensor bytes at the step's peak above its
# start, the median step), and bytes handed to the tensor-parallel collectives per step (metrics'
# tp_comm_mb, the median step). The formula columns: parameters 1/P (2.5D d/P) of one process's,
# activations 1 (1D) or 1/P of one process's (1D+S: the blocks' LayerNorms, dropouts and residuals
# split too), communication against 1D at the same P: 1/sqrt(P) (2D), 1/sqrt(dP) (2.5D), 1/P^(2/3) (3D).
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMAND="scripts/bench/tensor_modes.sh"
(($# == 0)) || COMMAND+="$(printf ' %q' "$@")"
steps=4
COLOSSAL=build/colossal
while (($#)); do
  case "$1" in
    --steps) steps="${2:?}"; shift 2 ;;
    --colossal) COLOSSAL="${2:?}"; shift 2 ;;
    -h|--help) echo "usage: scripts/bench/tensor_modes.sh [--steps N] [--colossal BIN]"; exit 0 ;;
    *) echo "tensor_modes: error: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "tensor_modes: error: --steps '$steps' is not a positive integer" >&2; exit 2; }
[ -x "$COLOSSAL" ] || { echo "tensor_modes: error: $COLOSSAL not found; build it with scripts/build.sh" >&2; exit 1; }
recipe=recipes/gpt-tiny.toml
dataset="$(sed -n 's/^dataset = "\(.*\)".*/\1/p' "$recipe")"
[ -f "$dataset" ] || "$COLOSSAL" data prepare-recipe "$recipe" >&2
TMP="$(mktemp -d "${TMPDIR:-/tmp}/tensor_modes.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=1

run() {   # name ranks mode [depth [extra --set ...]]
  local name="$1" n="$2" mode="$3" depth="${4:-1}" launch=()
  shift $(($# < 4 ? $# : 4))
  ((n == 1)) || launch=(--nproc-per-node "$n" --set "parallel.tensor=$n" --set "parallel.tensor_mode=$mode" --set "parallel.tensor_depth=$depth" "$@")
  "$COLOSSAL" train "$recipe" --quiet --set model.n_embd=256 --set model.n_head=8 --set train.batch_size=16 --set train.seq_len=128 \
    --set "train.max_steps=$steps" --set train.eval_every=0 --set train.eval_batches=1 --set checkpoint.every=0 \
    --set checkpoint.at_end=false --set optim.warmup_steps=1 "${launch[@]}" --set "output.dir=$TMP/$name" >"$TMP/$name.log" 2>&1 ||
    { echo "tensor_modes: error: $name failed; its output ends:" >&2; tail -n 5 "$TMP/$name.log" >&2; exit 1; }
}
run one 1 1d
run 1d-4 4 1d
run 1d-8 8 1d
run 1dseq-4 4 1d 1 --set parallel.tensor_sequence=true
run 2d-4 4 2d
run 2.5d-8 8 2.5d 2
run 3d-8 8 3d

python3 - "$TMP" <<'PYEOF'
import json, math, statistics, sys
from pathlib import Path
d = Path(sys.argv[1])
def summary(name): return json.loads((d / name / "summary.json").read_text())
def comm(name):
    vals = [json.loads(l)["tp_comm_mb"] for l in (d / name / "metrics.jsonl").read_text().splitlines()
            if '"tp_comm_mb"' in l]
    return statistics.median(vals) if vals else 0.0
def act(name):   # rank 0's exact tensor bytes at the step's peak above its start, the median step
    vals = [json.loads(l)["tensor_peak_mb"] for l in (d / name / "metrics.jsonl").read_text().splitlines()
            if '"tensor_peak_mb"' in l]
    return statistics.median(vals)
one = summary("one")
p1, a1 = one["held_mb"]["params"], act("one")
rows = [("1D", "1d-4", 4, 1), ("1D", "1d-8", 8, 1), ("1D+S", "1dseq-4", 4, 1), ("2D", "2d-4", 4, 1), ("2.5D", "2.5d-8", 8, 2),
        ("3D", "3d-8", 8, 1)]
print(f"one process: parameters {p1:.2f} MB, activations {a1:.1f} MB (GPT width 256, 8 heads, 2 layers, T=128, B=16)")
print("mode  P | params MB/rank (formula) | activations MB/rank (formula) | tp comm MB/step/rank (formula vs 1D at P)")
for mode, name, P, depth in rows:
    s = summary(name)
    params = s["held_mb"]["params"]
    pf = p1 * (depth / P)
    af = a1 * (1 if mode == "1D" else 1 / P)
    c, c1 = comm(name), comm(f"1d-{P}")
    bw = {"1D": 1, "1D+S": 1, "2D": 1 / math.sqrt(P), "2.5D": 1 / math.sqrt(depth * P), "3D": 1 / P ** (2 / 3)}[mode]
    print(f"{mode:4s} {P:2d} | {params:7.2f} ({pf:6.2f}) | {act(name):7.1f} ({af:6.1f}) | {c:8.2f} ({c1 * bw:8.2f}: {c / c1 if c1 else 0:.2f}x of 1D, formula {bw:.2f}x)")
PYEOF
echo "machine: $(bash scripts/bench/cpu_line.sh), $(OMP_NUM_THREADS= nproc) cores, $(date +%F), $COMMAND"
