#!/usr/bin/env bash
# tp_vs_torch.sh: 1D tensor parallelism of `colossal train` at 2 ranks against PyTorch's own tensor parallelism
# (torch.distributed.tensor.parallel.parallelize_module with torchtitan's column/row plan for a GPT block, DTensor
# over Gloo, under torchrun; scripts/bench/gpt_ref.py --tp) on the same GPT shape, dataset, sequence length and
# batch, one thread per rank, in alternating rounds; and both sides in one process for scale. Both split every
# block the same way (qkv and MLP expansion by columns, projections by rows); colossal also splits the vocabulary
# (embedding, tied head and loss), which PyTorch's peer keeps whole. Prints medians: tokens/s (each step's batch
# once: the tensor-parallel ranks share it), rank 0's peak RSS, and colossal's ratios against the PyTorch peer.
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMAND="scripts/bench/tp_vs_torch.sh"
(($# == 0)) || COMMAND+="$(printf ' %q' "$@")"

usage() {
  cat <<USAGE
usage: scripts/bench/tp_vs_torch.sh [--shape tiny|124m] [--repeat N] [--steps N] [--python PY] [--colossal BIN]
  --shape    tiny (recipes/gpt-tiny.toml, T=128, B=16) or 124m (recipes/gpt2-124m.toml, T=256, B=4)
  --repeat   alternating rounds, medians over them; default 3
  --steps    steps each command runs, the first 3 untimed; default 40 (tiny), 8 (124m)
USAGE
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
    *) echo "tp_vs_torch: error: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
case "$shape" in
  tiny) recipe=recipes/gpt-tiny.toml T=128 B=16 S="${steps:-40}" ;;
  124m) recipe=recipes/gpt2-124m.toml T=256 B=4 S="${steps:-8}" ;;
  *) echo "tp_vs_torch: error: --shape '$shape' is not tiny or 124m" >&2; exit 2 ;;
esac
NAME=tp_vs_torch
source scripts/bench/dp_common.sh
colossal_args=(train "$recipe" --quiet --set "train.max_steps=$S" --set "train.seq_len=$T" --set "train.batch_size=$B"
               --set train.grad_accum=1 --set model.dropout=0 --set train.eval_every=0 --set train.eval_batches=1
               --set checkpoint.every=0 --set checkpoint.at_end=false --set optim.warmup_steps=1)
for ((r = 1; r <= repeat; r++)); do
  echo "tp_vs_torch: round $r/$repeat" >&2
  for n in 1 2; do
    out="$TMP/colossal$n-$r"
    split=(); ((n == 1)) || split=(--nproc-per-node 2 --set parallel.tensor=2)
    "$COLOSSAL" "${colossal_args[@]}" "${split[@]}" --set "output.dir=$out" >"$out.log" 2>&1 ||
      fail "colossal with $n rank(s) failed" "$out.log"
    cp "$out/summary.json" "$out.json"
  done
  "$PY" "${peer_args[@]}" >"$TMP/torch1-$r.log" 2>&1 || fail "the PyTorch single-process peer failed" "$TMP/torch1-$r.log"
  grep '^{' "$TMP/torch1-$r.log" | tail -n 1 >"$TMP/torch1-$r.json"
  "$TORCHRUN" --standalone --nproc-per-node 2 "${peer_args[@]}" --tp >"$TMP/torch2-$r.log" 2>&1 ||
    fail "PyTorch tensor parallelism under torchrun failed" "$TMP/torch2-$r.log"
  grep '^{' "$TMP/torch2-$r.log" | tail -n 1 >"$TMP/torch2-$r.json"
done

"$PY" - "$TMP" "$repeat" "$shape" "$T" "$B" <<'PYEOF'
import json, statistics, sys
from pathlib import Path
d, repeat, shape, T, B = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
def med(name, key):
    return statistics.median(float(json.loads((d / f"{name}-{r}.json").read_text())[key]) for r in range(1, repeat + 1))
c1, c2, t1, t2 = (med(n, "tokens_per_s") for n in ("colossal1", "colossal2", "torch1", "torch2"))
m1, m2, tm1, tm2 = (med(n, "peak_rss_mb") for n in ("colossal1", "colossal2", "torch1", "torch2"))
print(f"gpt-{shape} T={T} B={B}, 1 thread/rank | colossal 1 rank {c1:.0f} tok/s {m1:.0f} MB | colossal tensor=2 {c2:.0f} tok/s "
      f"{m2:.0f} MB/rank | torch 1 process {t1:.0f} tok/s {tm1:.0f} MB | torch TP 2 ranks (DTensor) {t2:.0f} tok/s {tm2:.0f} MB/rank"
      f" | colossal/torch at 2 ranks {c2 / t2:.2f}x tok/s, mem {m2 / tm2:.2f}x")
PYEOF
echo "machine: $(bash scripts/bench/cpu_line.sh), $(OMP_NUM_THREADS= nproc) cores, torch $("$PY" -c 'import torch; print(torch.__version__)'), $(date +%F), $COMMAND, median of $repeat alternating rounds"
