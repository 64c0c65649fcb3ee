#!/usr/bin/env bash
# activation_checkpoint.sh: what recomputing blocks saves and costs on one training step of a GPT-2 124M
# shape (12 layers, width 768, 12 heads; the embedded corpus's 8192-token vocabulary), T and B as given,
# one process: activation_checkpoint none, every_n (every other block) and full. Per setting: the step's
# tensor peak (metrics' tensor_peak_mb: ATen's exact tensor bytes at the step's peak above its start, the
# median of the steps after the first), the median step time, and both against none. The gradients are
# the same to the bit in every setting (tests/test_e2e.cpp); this measures the trade.
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMAND="scripts/bench/activation_checkpoint.sh"
(($# == 0)) || COMMAND+="$(printf ' %q' "$@")"
steps=4 seq=256 batch=4 layers=12
COLOSSAL=build/colossal
while (($#)); do
  case "$1" in
    --steps) steps="${2:?}"; shift 2 ;;
    --seq) seq="${2:?}"; shift 2 ;;
    --batch) batch="${2:?}"; shift 2 ;;
    --layers) layers="${2:?}"; shift 2 ;;
    --colossal) COLOSSAL="${2:?}"; shift 2 ;;
    -h|--help) echo "usage: scripts/bench/activation_checkpoint.sh [--steps N] [--seq T] [--batch B] [--layers L] [--colossal BIN]"; exit 0 ;;
    *) echo "activation_checkpoint: error: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
for n in "$steps" "$seq" "$batch" "$layers"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "activation_checkpoint: error: '$n' is not a positive integer" >&2; exit 2; }
done
((steps >= 2)) || { echo "activation_checkpoint: error: --steps must be at least 2 (the first step is not counted)" >&2; exit 2; }
[ -x "$COLOSSAL" ] || { echo "activation_checkpoint: error: $COLOSSAL not found; build it with scripts/build.sh" >&2; exit 1; }
recipe=recipes/gpt2-124m.toml
dataset="$(sed -n 's/^dataset = "\(.*\)".*/\1/p' "$recipe")"
[ -f "$dataset" ] || "$COLOSSAL" data prepare-recipe "$recipe" >&2
TMP="$(mktemp -d "${TMPDIR:-/tmp}/activation_checkpoint.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

for ac in none every_n full; do
  "$COLOSSAL" train "$recipe" --quiet --set model.vocab_size=8192 --set "model.n_layer=$layers" --set "train.seq_len=$seq" \
    --set "train.batch_size=$batch" --set train.grad_accum=1 --set "train.max_steps=$steps" --set train.eval_every=0 \
    --set train.eval_batches=1 --set checkpoint.every=0 --set checkpoint.at_end=false --set optim.warmup_steps=1 \
    --set "memory.activation_checkpoint=$ac" --set memory.checkpoint_every=2 --set "output.dir=$TMP/$ac" >"$TMP/$ac.log" 2>&1 ||
    { echo "activation_checkpoint: error: $ac failed; its output ends:" >&2; tail -n 5 "$TMP/$ac.log" >&2; exit 1; }
done

python3 - "$TMP" "$layers" "$seq" "$batch" <<'PYEOF'
import json, statistics, sys
from pathlib import Path
d, layers, seq, batch = Path(sys.argv[1]), *sys.argv[2:]
def med(name, key):
    rows = [json.loads(l) for l in (d / name / "metrics.jsonl").read_text().splitlines() if f'"{key}"' in l]
    return statistics.median(r[key] for r in rows[1:])   # the first step warms up
base_mem, base_ms = med("none", "tensor_peak_mb"), med("none", "step_ms")
print(f"GPT-2 124M shape ({layers} layers, width 768, vocabulary 8192), T={seq}, B={batch}, one process")
print("checkpointing | tensor peak MB (vs none) | step ms (vs none)")
for name, label in (("none", "none"), ("every_n", "every 2nd"), ("full", "full")):
    m, t = med(name, "tensor_peak_mb"), med(name, "step_ms")
    print(f"{label:13s} | {m:9.1f} ({m / base_mem:5.2f}x)      | {t:8.0f} ({t / base_ms:5.2f}x)")
PYEOF
echo "machine: $(bash scripts/bench/cpu_line.sh), $(nproc) cores, $(date +%F), $COMMAND"
