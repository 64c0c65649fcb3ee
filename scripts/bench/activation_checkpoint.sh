#!/usr/bin/env bash
# activation_checkpoint.sh: what recomputing blocks saves and costs on one training step of GPT-2 124M's or
# 774M's shape (the embedded corpus's 8192-token vocabulary), T and B as given, one process:
# activation_checkpoint none, every_n (every other block), full, and auto with a target of half what keeping
# every block needs (its choice printed). Per setting: the step's tensor peak (metrics' tensor_peak_mb: ATen's
# exact tensor bytes at the step's peak above its start, the median of the steps after the first), the median
# step time, both against none, and the largest batch whose tensor peak fits --budget-gb (activations grow
# linearly with the batch: the per-sample slope from this run and a run at half the batch). The peer in the
# same run: scripts/bench/gpt_ref.py with torch.utils.checkpoint (non-reentrant) on none / every other / every
# block, its step time against its own none (its memory is the process's RSS, which holds glibc's free lists,
# so only colossal's tensor bytes are compared exactly). The gradients are the same to the bit in every
# colossal setting (tests/test_e2e.cpp); this measures the trade.
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMAND="scripts/bench/activation_checkpoint.sh"
(($# == 0)) || COMMAND+="$(printf ' %q' "$@")"
steps=4 seq=256 batch=4 shape=124m budget=1
COLOSSAL=build/colossal
PY=.venv/bin/python
while (($#)); do
  case "$1" in
    --shape) shape="${2:?}"; shift 2 ;;
    --steps) steps="${2:?}"; shift 2 ;;
    --seq) seq="${2:?}"; shift 2 ;;
    --batch) batch="${2:?}"; shift 2 ;;
    --budget-gb) budget="${2:?}"; shift 2 ;;
    --python) PY="${2:?}"; shift 2 ;;
    --colossal) COLOSSAL="${2:?}"; shift 2 ;;
    -h|--help) echo "usage: scripts/bench/activation_checkpoint.sh [--shape 124m|774m] [--steps N] [--seq T] [--batch B] [--budget-gb X] [--python PY] [--colossal BIN]"; exit 0 ;;
    *) echo "activation_checkpoint: error: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
for n in "$steps" "$seq" "$batch"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "activation_checkpoint: error: '$n' is not a positive integer" >&2; exit 2; }
done
((steps >= 2)) || { echo "activation_checkpoint: error: --steps must be at least 2 (the first step is not counted)" >&2; exit 2; }
((batch >= 2 && batch % 2 == 0)) || { echo "activation_checkpoint: error: --batch must be even (a run at half of it gives the slope)" >&2; exit 2; }
case "$shape" in
  124m) layers=12 width=768 heads=12 ;;
  774m) layers=36 width=1280 heads=20 ;;
  *) echo "activation_checkpoint: error: --shape '$shape' is not 124m or 774m" >&2; exit 2 ;;
esac
[ -x "$COLOSSAL" ] || { echo "activation_checkpoint: error: $COLOSSAL not found; build it with scripts/build.sh" >&2; exit 1; }
recipe=recipes/gpt2-124m.toml
dataset="$(sed -n 's/^dataset = "\(.*\)".*/\1/p' "$recipe")"
[ -f "$dataset" ] || "$COLOSSAL" data prepare-recipe "$recipe" >&2
TMP="$(mktemp -d "${TMPDIR:-/tmp}/activation_checkpoint.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

run() {   # name, batch, extra --set arguments...
  local name="$1" b="$2"
  shift 2
  "$COLOSSAL" train "$recipe" --quiet --set model.vocab_size=8192 --set "model.n_layer=$layers" --set "model.n_embd=$width" \
    --set "model.n_head=$heads" --set "train.seq_len=$seq" --set "train.batch_size=$b" --set train.grad_accum=1 \
    --set "train.max_steps=$steps" --set train.eval_every=0 --set train.eval_batches=1 --set checkpoint.every=0 \
    --set checkpoint.at_end=false --set optim.warmup_steps=1 --set memory.checkpoint_every=2 "$@" --set "output.dir=$TMP/$name" \
    >"$TMP/$name.log" 2>&1 || { echo "activation_checkpoint: error: $name failed; its output ends:" >&2; tail -n 5 "$TMP/$name.log" >&2; exit 1; }
}
peak() { "$PY" -c "import json,statistics,sys; r=[json.loads(l) for l in open(sys.argv[1]) if '\"tensor_peak_mb\"' in l]; print(statistics.median(x['tensor_peak_mb'] for x in r[1:]))" "$TMP/$1/metrics.jsonl"; }
for ac in none every_n full; do
  run "$ac" "$batch" --set "memory.activation_checkpoint=$ac"
  run "$ac-half" "$((batch / 2))" --set "memory.activation_checkpoint=$ac"
done
# auto: half of what keeping every block's activations needs at this batch (the none run's peak, less nothing
# outside the blocks: a target the planner can meet without recomputing everything)
target="$("$PY" -c "print(round($(peak none) / 2 / 1024, 4))")"
run auto "$batch" --set memory.activation_checkpoint=auto --set "memory.activation_memory_gb=$target"
for ck in none every2 full; do
  "$PY" scripts/bench/gpt_ref.py --n-layer "$layers" --n-head "$heads" --n-embd "$width" --vocab-size 8192 --block-size 1024 \
    --seq-len "$seq" --batch "$batch" --steps "$steps" --warmup-steps 1 --dataset "$dataset" --attn sdpa --checkpoint "$ck" \
    >"$TMP/torch-$ck.log" 2>&1 || { echo "activation_checkpoint: error: the torch peer ($ck) failed; its output ends:" >&2; tail -n 5 "$TMP/torch-$ck.log" >&2; exit 1; }
  grep '^{' "$TMP/torch-$ck.log" | tail -n 1 >"$TMP/torch-$ck.json"
done

"$PY" - "$TMP" "$shape" "$layers" "$width" "$seq" "$batch" "$budget" "$target" <<'PYEOF'
import json, math, statistics, sys
from pathlib import Path
d, shape, layers, width, seq, batch, budget, target = Path(sys.argv[1]), *sys.argv[2:]
batch, budget = int(batch), float(budget) * 1024
def med(name, key):
    rows = [json.loads(l) for l in (d / name / "metrics.jsonl").read_text().splitlines() if f'"{key}"' in l and '"event"' not in l]
    return statistics.median(r[key] for r in rows[1:])   # the first step warms up
def largest(name):   # peak = outside + slope * B, from B and B / 2
    hi, lo = med(name, "tensor_peak_mb"), med(name + "-half", "tensor_peak_mb")
    slope = (hi - lo) / (batch - batch // 2)
    return max(0, math.floor((budget - (hi - slope * batch)) / slope)) if slope > 0 else 0
torch = {k: json.loads((d / f"torch-{k}.json").read_text()) for k in ("none", "every2", "full")}
t_ms = {k: int(seq) * batch / v["tokens_per_s"] * 1e3 for k, v in torch.items()}
auto = [json.loads(l) for l in (d / "auto" / "metrics.jsonl").read_text().splitlines() if "recomputed_blocks" in l][0]
base_mem, base_ms = med("none", "tensor_peak_mb"), med("none", "step_ms")
print(f"GPT-2 {shape} shape ({layers} layers, width {width}, vocabulary 8192), T={seq}, B={batch}, one process")
print(f"checkpointing | tensor peak MB (vs none) | step ms (vs none) | torch.utils.checkpoint ms (vs its none) | largest B in {budget / 1024:g} GiB")
for name, label, peer in (("none", "none", "none"), ("every_n", "every 2nd", "every2"), ("full", "full", "full"), ("auto", "auto", None)):
    m, t = med(name, "tensor_peak_mb"), med(name, "step_ms")
    p = f"{t_ms[peer]:8.0f} ({t_ms[peer] / t_ms['none']:5.2f}x)" if peer else f"{'':>17s}"
    # auto's choice depends on the batch: at the largest batch any target allows, it recomputes every block (= full)
    big = f"{largest(name):6d}" if name != "auto" else "= full"
    print(f"{label:13s} | {m:9.1f} ({m / base_mem:5.2f}x)      | {t:8.0f} ({t / base_ms:5.2f}x) | {p}                  | {big}")
print(f"auto: target {float(target):g} GiB: recomputed {auto['recomputed_blocks']} of {layers} blocks, "
      f"predicted {auto['predicted_activation_mb']:.1f} MB of block activations (all kept: {auto['activation_mb_kept_whole']:.1f} MB)")
print(f"colossal none vs torch none: {t_ms['none'] / base_ms:.2f}x the step rate; full vs full: {t_ms['full'] / med('full', 'step_ms'):.2f}x")
PYEOF
echo "machine: $(bash scripts/bench/cpu_line.sh), $(nproc) cores, $(date +%F), $COMMAND"
