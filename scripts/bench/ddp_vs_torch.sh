#!/usr/bin/env bash
# ddp_vs_torch.sh: data-parallel scaling of `colossal train` on this machine and against PyTorch DDP.
# In alternating rounds, on the same GPT shape, dataset, sequence length and per-worker batch, one thread per
# worker: colossal with 1 worker, colossal with 2 workers (--nproc-per-node 2, Gloo), PyTorch DDP under
# torchrun --nproc-per-node 2 (scripts/bench/gpt_ref.py, Gloo, eager with SDPA, 25 MB buckets as gradient
# views), and that same PyTorch model in 1 process. Prints medians: tokens/s over all workers, peak RSS of one
# worker (rank 0's own), colossal's 2-worker/1-worker scaling, the fraction of its gradient all-reduce time
# hidden behind backward (from the run's counters), and colossal's ratio against DDP.
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMAND="scripts/bench/ddp_vs_torch.sh"
(($# == 0)) || COMMAND+="$(printf ' %q' "$@")"

usage() {
  cat <<EOF
usage: scripts/bench/ddp_vs_torch.sh [--shape tiny|124m] [--repeat N] [--steps N] [--python PY] [--colossal BIN]
  --shape    tiny (recipes/gpt-tiny.toml, T=128, B=16 per worker) or 124m (recipes/gpt2-124m.toml, T=256, B=4)
  --repeat   alternating rounds, medians over them; default 3
  --steps    steps each command runs, the first 3 untimed; default 40 (tiny), 8 (124m)
EOF
}
shape=tiny repeat=3 steps=""
COLOSSAL=build/colossal
PY=.venv/bin/python
while (($#)); do
  case "$1" in
    --shape) shape="${2:?}"; shift 2 ;;
    --repeat) repeat="${2:?}"; shift 2 ;;
    --steps) steps="${2:?}"; shift 2 ;;
    --python) PY="${2:?}"; shift 2 ;;
    --colossal) COLOSSAL="${2:?}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "ddp_vs_torch: error: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
case "$shape" in
  tiny) recipe=recipes/gpt-tiny.toml T=128 B=16 S="${steps:-40}" ;;
  124m) recipe=recipes/gpt2-124m.toml T=256 B=4 S="${steps:-8}" ;;
  *) echo "ddp_vs_torch: error: --shape '$shape' is not tiny or 124m" >&2; exit 2 ;;
esac
NAME=ddp_vs_torch
source scripts/bench/dp_common.sh
colossal_args=(train "$recipe" --quiet --set "train.max_steps=$S" --set "train.seq_len=$T" --set "train.batch_size=$B"
               --set train.grad_accum=1 --set model.dropout=0 --set train.eval_every=0 --set train.eval_batches=1
               --set checkpoint.every=0 --set optim.warmup_steps=1)
for ((r = 1; r <= repeat; r++)); do
  echo "ddp_vs_torch: round $r/$repeat" >&2
  for n in 1 2; do
    out="$TMP/colossal$n-$r"
    launch=(); ((n == 1)) || launch=(--nproc-per-node 2)
    "$COLOSSAL" "${colossal_args[@]}" "${launch[@]}" --set "output.dir=$out" >"$out.log" 2>&1 ||
      fail "colossal with $n worker(s) failed" "$out.log"
    cp "$out/summary.json" "$out.json"
  done
  "$PY" "${peer_args[@]}" >"$TMP/torch1-$r.log" 2>&1 || fail "the PyTorch single-process peer failed" "$TMP/torch1-$r.log"
  grep '^{' "$TMP/torch1-$r.log" | tail -n 1 >"$TMP/torch1-$r.json"
  "$TORCHRUN" --standalone --nproc-per-node 2 "${peer_args[@]}" >"$TMP/ddp-$r.log" 2>&1 ||
    fail "PyTorch DDP under torchrun failed" "$TMP/ddp-$r.log"
  grep '^{' "$TMP/ddp-$r.log" | tail -n 1 >"$TMP/ddp-$r.json"
done

"$PY" - "$TMP" "$repeat" "$shape" "$T" "$B" <<'PYEOF'
import json, statistics, sys
from pathlib import Path
d, repeat, shape, T, B = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
def med(name, key):
    return statistics.median(float(json.loads((d / f"{name}-{r}.json").read_text())[key]) for r in range(1, repeat + 1))
c1, c2 = med("colossal1", "tokens_per_s"), med("colossal2", "tokens_per_s")
m1, m2 = med("colossal1", "peak_rss_mb"), med("colossal2", "peak_rss_mb")
hidden = med("colossal2", "dp_hidden_fraction")
t1, t2 = med("torch1", "tokens_per_s"), med("ddp", "tokens_per_s")
tm2 = med("ddp", "peak_rss_mb")
print(f"gpt-{shape} T={T} B={B}/worker, 1 thread/worker | colossal 1 worker {c1:.0f} tok/s {m1:.0f} MB"
      f" | colossal 2 workers {c2:.0f} tok/s {m2:.0f} MB/worker: scaling {c2 / c1:.2f}x, all-reduce {hidden * 100:.0f}% hidden"
      f" | torch 1 process {t1:.0f} tok/s | torch DDP 2 workers {t2:.0f} tok/s {tm2:.0f} MB/worker (DDP scaling {t2 / t1:.2f}x)"
      f" | colossal/DDP {c2 / t2:.2f}x tok/s, mem {m2 / tm2:.2f}x")
PYEOF
echo "machine: $(bash scripts/bench/cpu_line.sh), $(OMP_NUM_THREADS= nproc) cores, torch $("$PY" -c 'import torch; print(torch.__version__)'), $(date +%F), $COMMAND, median of $repeat alternating rounds"
