#!/usr/bin/env bash
# zero_vs_torch.sh: ZeRO stages 0 to 3 of `colossal train` at 2 (or --workers) workers against the peers on
# the same GPT shape, dataset, sequence length and per-worker batch, one thread per worker, in alternating
# rounds: PyTorch DDP and PyTorch FSDP2 (fully_shard per block, Gloo) under torchrun, and DeepSpeed's
# ZeRO-2 and ZeRO-3 where --ds-python has it (scripts/bench/gpt_ref.py). Prints medians of tokens/s over
# all workers and peak RSS of rank 0, each
# stage's bytes held per rank (params, grads, optimizer states, from the chunk store) against the ZeRO
# formula (ZeRO-3 keeps the embeddings, final norm and head whole, so it holds more than 4Ψ/N there),
# and the ratios the issue sets targets for: each stage against plain data parallelism (ZeRO-2 >= 0.95x,
# ZeRO-3 >= 0.85x), and against DDP, FSDP2 and DeepSpeed.
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMAND="scripts/bench/zero_vs_torch.sh"
(($# == 0)) || COMMAND+="$(printf ' %q' "$@")"

usage() {
  cat <<EOF
usage: scripts/bench/zero_vs_torch.sh [--shape tiny|124m|350m] [--workers N] [--repeat N] [--steps N] [--python PY] [--ds-python PY] [--colossal BIN]
  --shape    tiny (recipes/gpt-tiny.toml, T=128, B=16 per worker), 124m or 350m (gpt2 shapes, T=256, B=2)
  --workers  data-parallel workers, one thread each (more than the cores time-share them); default 2
  --repeat   alternating rounds, medians over them; default 3
  --steps    steps each command runs, the first 3 untimed; default 30 (tiny), 7 (124m, 350m)
  --ds-python  a Python with deepspeed, torch and h5py for the DeepSpeed peers (default: PY when it has deepspeed)
EOF
}
shape=tiny repeat=3 steps="" workers=2
COLOSSAL=build/colossal
PY=.venv/bin/python
DS_PY=
while (($#)); do
  case "$1" in
    --shape) shape="${2:?}"; shift 2 ;;
    --repeat) repeat="${2:?}"; shift 2 ;;
    --workers) workers="${2:?}"; shift 2 ;;
    --steps) steps="${2:?}"; shift 2 ;;
    --python) PY="${2:?}"; shift 2 ;;
    --ds-python) DS_PY="${2:?}"; shift 2 ;;
    --colossal) COLOSSAL="${2:?}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "zero_vs_torch: error: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
case "$shape" in
  tiny) recipe=recipes/gpt-tiny.toml T=128 B=16 S="${steps:-30}" ;;
  124m) recipe=recipes/gpt2-124m.toml T=256 B=2 S="${steps:-7}" ;;
  350m) recipe=recipes/gpt2-350m.toml T=256 B=2 S="${steps:-7}" ;;
  *) echo "zero_vs_torch: error: --shape '$shape' is not tiny, 124m or 350m" >&2; exit 2 ;;
esac
[[ "$workers" =~ ^[1-9][0-9]*$ ]] && ((workers >= 2)) || { echo "zero_vs_torch: error: --workers '$workers' is not a whole number of at least 2" >&2; exit 2; }
NAME=zero_vs_torch
source scripts/bench/dp_common.sh
[ -n "$DS_PY" ] || { "$PY" -c 'import deepspeed' 2>/dev/null && DS_PY="$PY"; } || true
if [ -n "$DS_PY" ]; then
  "$DS_PY" -c 'import deepspeed, h5py' 2>/dev/null || { echo "$NAME: error: $DS_PY cannot import deepspeed and h5py" >&2; exit 1; }
else
  echo "$NAME: no Python with deepspeed (see --ds-python): the DeepSpeed peers are left out" >&2
fi
colossal_args=(train "$recipe" --quiet --nproc-per-node "$workers" --set "train.max_steps=$S" --set "train.seq_len=$T"
               --set "train.batch_size=$B" --set train.grad_accum=1 --set model.dropout=0 --set train.eval_every=0
               --set train.eval_batches=1 --set checkpoint.every=0 --set optim.warmup_steps=1)
for ((r = 1; r <= repeat; r++)); do
  echo "zero_vs_torch: round $r/$repeat" >&2
  for z in 0 1 2 3; do
    out="$TMP/zero$z-$r"
    "$COLOSSAL" "${colossal_args[@]}" --set "memory.zero=$z" --set "output.dir=$out" >"$out.log" 2>&1 ||
      fail "colossal at ZeRO stage $z failed" "$out.log"
    cp "$out/summary.json" "$out.json"
  done
  for peer in ddp fsdp2; do
    flag=(); [ "$peer" = fsdp2 ] && flag=(--fsdp)
    "$TORCHRUN" --standalone --nproc-per-node "$workers" "${peer_args[@]}" "${flag[@]}" >"$TMP/$peer-$r.log" 2>&1 ||
      fail "PyTorch $peer under torchrun failed" "$TMP/$peer-$r.log"
    grep '^{' "$TMP/$peer-$r.log" | tail -n 1 >"$TMP/$peer-$r.json"
  done
  [ -n "$DS_PY" ] || continue
  for z in 2 3; do
    "$(dirname "$DS_PY")/torchrun" --standalone --nproc-per-node "$workers" "${peer_args[@]}" --deepspeed "$z" >"$TMP/ds$z-$r.log" 2>&1 ||
      fail "DeepSpeed ZeRO-$z under torchrun failed" "$TMP/ds$z-$r.log"
    grep '^{' "$TMP/ds$z-$r.log" | tail -n 1 >"$TMP/ds$z-$r.json"
  done
done

"$PY" - "$TMP" "$repeat" "$shape" "$T" "$B" "$workers" <<'PYEOF'
import json, statistics, sys
from pathlib import Path
d, repeat, shape, T, B, N = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])
def load(name, r):
    return json.loads((d / f"{name}-{r}.json").read_text())
def med(name, key):
    return statistics.median(float(load(name, r)[key]) for r in range(1, repeat + 1))
params = load("zero0", 1)["params"]
runs = ["zero0", "zero1", "zero2", "zero3", "ddp", "fsdp2"] + [n for n in ("ds2", "ds3") if (d / f"{n}-1.json").exists()]
tok = {n: med(n, "tokens_per_s") for n in runs}
rss = {n: med(n, "peak_rss_mb") for n in tok}
print(f"gpt-{shape}: {params / 1e6:.1f}M parameters, T={T}, B={B}/worker, {N} workers, 1 thread each")
ds = [n for n in ("ds2", "ds3") if n in tok]
print("| run | tokens/s | peak RSS/worker | held/worker: params + grads + AdamW | ZeRO formula | vs ZeRO-0 | vs DDP | vs FSDP2 (tok/s, RSS) |"
      + "".join(f" vs DeepSpeed ZeRO-{n[2]} |" for n in ds))
print("| --- " * (8 + len(ds)) + "|")
psi = 4 * params / 1048576   # MiB of one fp32 copy of the parameters
formula = {0: 4 * psi, 1: 2 * psi + 2 * psi / N, 2: psi + psi / N + 2 * psi / N, 3: psi / N + psi / N + 2 * psi / N}
for z in (0, 1, 2, 3):
    n = f"zero{z}"
    held = load(n, 1)["held_mb"]
    total = held["params"] + held["grads"] + held["optimizer"]
    print(f"| colossal ZeRO-{z} | {tok[n]:.0f} | {rss[n]:.0f} MB | {held['params']:.0f} + {held['grads']:.0f} + {held['optimizer']:.0f}"
          f" = {total:.0f} MB | {formula[z]:.0f} MB | {tok[n] / tok['zero0']:.2f}x | {tok[n] / tok['ddp']:.2f}x |"
          f" {tok[n] / tok['fsdp2']:.2f}x, {rss[n] / rss['fsdp2']:.2f}x |" + "".join(f" {tok[n] / tok[p]:.2f}x, {rss[n] / rss[p]:.2f}x |" for p in ds))
labels = {"ddp": "PyTorch DDP", "fsdp2": "PyTorch FSDP2 (fully_shard per block)", "ds2": "DeepSpeed ZeRO-2", "ds3": "DeepSpeed ZeRO-3"}
for n in ["ddp", "fsdp2"] + ds:
    print(f"| {labels[n]} | {tok[n]:.0f} | {rss[n]:.0f} MB |" + " |" * (5 + len(ds)))
PYEOF
echo "machine: $(bash scripts/bench/cpu_line.sh), $(OMP_NUM_THREADS= nproc) cores, torch $("$PY" -c 'import torch; print(torch.__version__)'), $(date +%F), $COMMAND, median of $repeat alternating rounds"
