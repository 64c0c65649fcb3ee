#!/usr/bin/env bash
# pipeline.sh: pipeline parallelism of `colossal train` at 2 stages against PyTorch's own pipelining
# (torch.distributed.pipelining: ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B with 2 chunks a rank, and
# for zero_bubble ScheduleInterleavedZeroBubble, torch's zero-bubble schedule, which needs 2 chunks a rank where
# ours runs one; under torchrun on Gloo; scripts/bench/pipeline_ref.py) on the same GPT shape, dataset, sequence length, global
# batch and micro-batches, one thread per rank, in alternating rounds. Per schedule it prints medians of tokens/s,
# the largest rank's peak RSS, colossal's activation peak per step on its first stage (tensor_peak_mb: ATen's
# bytes above the step's start) and its bubble (idle fraction in pass units, the slowest rank's clock) beside
# theory ((P - 1) / (v M + P - 1); zero-bubble's bound (P - 1) / (3 M + P - 1)), and colossal's tokens/s ratio
# against the PyTorch peer.
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMAND="scripts/bench/pipeline.sh"
(($# == 0)) || COMMAND+="$(printf ' %q' "$@")"

usage() {
  cat <<USAGE
usage: scripts/bench/pipeline.sh [--shape tiny|124m] [--micro N] [--repeat N] [--steps N] [--python PY] [--colossal BIN]
  --shape    tiny (recipes/gpt-tiny.toml at 4 blocks, T=128, 16 rows a step) or 124m (recipes/gpt2-124m.toml,
             T=256, 8 rows a step)
  --micro    micro-batches a step; default 8 (tiny), 4 (124m)
  --repeat   alternating rounds, medians over them; default 3
  --steps    steps each command runs, the first 3 untimed; default 20 (tiny), 6 (124m)
USAGE
}
shape=tiny repeat=3 steps="" micro=""
COLOSSAL=build/colossal
PY=.venv/bin/python
while (($#)); do
  case "$1" in
    --shape) shape="${2:?}"; shift 2 ;;
    --micro) micro="${2:?}"; shift 2 ;;
    --repeat) repeat="${2:?}"; shift 2 ;;
    --steps) steps="${2:?}"; shift 2 ;;
    --python) PY="${2:?}"; shift 2 ;;
    --colossal) COLOSSAL="${2:?}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "pipeline: error: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
case "$shape" in
  tiny) recipe=recipes/gpt-tiny.toml T=128 B=16 S="${steps:-20}" M="${micro:-8}" layers=4 ;;
  124m) recipe=recipes/gpt2-124m.toml T=256 B=8 S="${steps:-6}" M="${micro:-4}" layers=12 ;;
  *) echo "pipeline: error: --shape '$shape' is not tiny or 124m" >&2; exit 2 ;;
esac
{ [[ "$M" =~ ^[0-9]+$ ]] && ((M >= 2 && B % M == 0 && M % 2 == 0)); } ||
  { echo "pipeline: error: --micro '$M' must be even, at least 2, and divide the $B rows of a step" >&2; exit 2; }
NAME=pipeline
source scripts/bench/dp_common.sh
n_layer=$layers
colossal_args=(train "$recipe" --quiet --nproc-per-node 2 --set parallel.pipeline=2 --set "parallel.micro_batches=$M"
               --set "model.n_layer=$layers" --set "train.max_steps=$S" --set "train.seq_len=$T" --set "train.batch_size=$((B / M))"
               --set train.grad_accum=1 --set model.dropout=0 --set train.eval_every=0 --set train.eval_batches=1
               --set checkpoint.every=0 --set checkpoint.at_end=false --set optim.warmup_steps=1 --set train.grad_clip=1)
ref_args=(scripts/bench/pipeline_ref.py --n-layer "$layers" --n-head "$n_head" --n-embd "$n_embd" --vocab-size "$vocab"
          --block-size "$block" --seq-len "$T" --batch "$B" --steps "$S" --warmup-steps 3 --micro-batches "$M" --dataset "$dataset")
schedules=(gpipe 1f1b interleaved zero_bubble)
for ((r = 1; r <= repeat; r++)); do
  echo "pipeline: round $r/$repeat" >&2
  for s in "${schedules[@]}"; do
    out="$TMP/colossal-$s-$r"
    extra=(--set "parallel.schedule=$s")
    [ "$s" != interleaved ] || extra+=(--set parallel.virtual_stages=2)
    "$COLOSSAL" "${colossal_args[@]}" "${extra[@]}" --set "output.dir=$out" >"$out.log" 2>&1 || fail "colossal $s failed" "$out.log"
    "$PY" - "$out" >"$out.json" <<'PYEOF'
import json, statistics, sys
d = sys.argv[1]
rows = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if '"tensor_peak_mb"' in l][3:]   # steady steps
s = json.load(open(f"{d}/summary.json"))
print(json.dumps({"tokens_per_s": s["tokens_per_s"], "peak_rss_mb": max(s["rss_mb"]["peak"]),
                  "tensor_peak_mb": statistics.median(r["tensor_peak_mb"] for r in rows),
                  "idle": statistics.median(r["pipeline_idle"] for r in rows)}))
PYEOF
    log="$TMP/torch-$s-$r.log"
    # torch's zero-bubble schedule aborted once in three rounds here (SIGABRT in a Gloo rank): one retry
    "$TORCHRUN" --standalone --nproc-per-node 2 "${ref_args[@]}" --schedule "$s" >"$log" 2>&1 ||
      { echo "pipeline: torch pipelining ($s) failed once; retrying" >&2;
        "$TORCHRUN" --standalone --nproc-per-node 2 "${ref_args[@]}" --schedule "$s" >"$log" 2>&1; } || fail "torch pipelining ($s) failed" "$log"
    grep '^{' "$log" | tail -n 1 >"$TMP/torch-$s-$r.json"
  done
done

"$PY" - "$TMP" "$repeat" "$shape" "$T" "$B" "$M" "${schedules[@]}" <<'PYEOF'
import json, statistics, sys
from pathlib import Path
d, repeat, shape, T, B, M = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
def med(name, key):
    return statistics.median(float(json.loads((d / f"{name}-{r}.json").read_text())[key]) for r in range(1, repeat + 1))
print(f"gpt-{shape} at 2 stages, T={T}, {B} rows a step in {M} micro-batches, 1 thread/rank, Gloo")
print(f"{'schedule':<12} {'colossal tok/s':>14} {'torch tok/s':>12} {'ratio':>6} {'colossal act MB':>15} "
      f"{'RSS MB c/t':>13} {'bubble':>7} {'theory':>7}")
for s in sys.argv[7:]:
    v = 2 if s == "interleaved" else 1
    c, t = med(f"colossal-{s}", "tokens_per_s"), med(f"torch-{s}", "tokens_per_s")
    theory = 1 / (3 * M + 1) if s == "zero_bubble" else 1 / (v * M + 1)
    print(f"{s:<12} {c:>14.0f} {t:>12.0f} {c / t:>5.2f}x {med(f'colossal-{s}', 'tensor_peak_mb'):>15.1f} "
          f"{med(f'colossal-{s}', 'peak_rss_mb'):>6.0f}/{med(f'torch-{s}', 'peak_rss_mb'):<6.0f} "
          f"{med(f'colossal-{s}', 'idle'):>7.3f} {theory:>7.3f}")
PYEOF
echo "machine: $(bash scripts/bench/cpu_line.sh), $(OMP_NUM_THREADS= nproc) cores, torch $("$PY" -c 'import torch; print(torch.__version__)'), $(date +%F), $COMMAND, median of $repeat alternating rounds"
