#!/usr/bin/env bash
# train_vs_torch.sh: training throughput and peak memory of `colossal train` against PyTorch peers written in
# Python (scripts/bench/gpt_ref.py: eager with naive attention, eager with SDPA, torch.compile) on the same GPT
# shape, dataset, sequence length and batch, with the same torch wheel, measured in one run. The four commands
# alternate in rounds (A B C D, A B C D, ...) so drift on a shared machine hits them alike; each row shows
# medians over the rounds and colossal's ratio against each peer (tokens/s colossal/peer, memory colossal/peer).
# Peak memory is the whole process's max RSS as /usr/bin/time sees it, for all four alike; with --device cuda it
# is the GPU's peak allocated bytes as each process's caching allocator counts them (torch's own counters both).
# Both sides keep what they tuned between processes, as a user's second run would: torch.compile its inductor
# cache (below), colossal its kernel choices (src/engine/kernel_cache.h, the user's cache unless
# COLOSSAL_KERNEL_CACHE says otherwise). A first run of a new colossal binary times its kernels in its first
# step, which is untimed here but raises that round's peak memory (about 90 MB at the 124m shape).
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMAND="scripts/bench/train_vs_torch.sh"
(($# == 0)) || COMMAND+="$(printf ' %q' "$@")"

usage() {
  cat <<EOF
usage: scripts/bench/train_vs_torch.sh [--shape tiny|124m|124m-1k|all] [--repeat N] [--steps N] [--timeout S]
                                      [--device cpu|cuda] [--python PY] [--colossal BIN]
  --shape    tiny (recipes/gpt-tiny.toml, T=128 B=16), 124m (recipes/gpt2-124m.toml, T=256 B=4),
             124m-1k (the same model at T=1024 B=8, a GPU-sized step) or all (tiny and 124m); default tiny
  --repeat   alternating rounds, medians taken over them; default 3
  --steps    steps each command runs, the first $WARMUP untimed; default 40 for tiny, 8 for 124m
  --timeout  seconds one command may run before it counts as failed; default 900
  --device   where both sides train; default cpu
  --python   Python with torch and h5py for the peers; default .venv/bin/python
  --colossal the binary; default build/colossal
EOF
}

WARMUP=3
shape=tiny repeat=3 steps="" timeout_s=900 device=cpu
COLOSSAL=build/colossal
PY=.venv/bin/python
while (($#)); do
  case "$1" in
    --shape) shape="${2:?--shape needs tiny, 124m or all}"; shift 2 ;;
    --repeat) repeat="${2:?--repeat needs a number}"; shift 2 ;;
    --steps) steps="${2:?--steps needs a number}"; shift 2 ;;
    --timeout) timeout_s="${2:?--timeout needs seconds}"; shift 2 ;;
    --device) device="${2:?--device needs cpu or cuda}"; shift 2 ;;
    --python) PY="${2:?--python needs a path}"; shift 2 ;;
    --colossal) COLOSSAL="${2:?--colossal needs a path}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "train_vs_torch: error: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
case "$shape" in
  tiny|124m|124m-1k) shapes=("$shape") ;;
  all) shapes=(tiny 124m) ;;
  *) echo "train_vs_torch: error: --shape '$shape' is not one of tiny, 124m, 124m-1k, all" >&2; exit 2 ;;
esac
case "$device" in
  cpu|cuda) ;;
  *) echo "train_vs_torch: error: --device '$device' is not one of cpu, cuda" >&2; exit 2 ;;
esac
[[ "$repeat" =~ ^[1-9][0-9]*$ ]] || { echo "train_vs_torch: error: --repeat '$repeat' is not a positive integer" >&2; exit 2; }
[[ "$timeout_s" =~ ^[1-9][0-9]*$ ]] || { echo "train_vs_torch: error: --timeout '$timeout_s' is not a positive integer" >&2; exit 2; }
if [ -n "$steps" ] && { ! [[ "$steps" =~ ^[0-9]+$ ]] || ((steps <= WARMUP)); }; then
  echo "train_vs_torch: error: --steps '$steps' must be an integer above the $WARMUP untimed warmup steps" >&2; exit 2
fi

[ -x "$COLOSSAL" ] || { echo "train_vs_torch: error: $COLOSSAL not found; build it with scripts/build.sh" >&2; exit 1; }
[ -x "$PY" ] || { echo "train_vs_torch: error: $PY not found; create it with scripts/setup.sh" >&2; exit 1; }
"$PY" -c 'import torch, h5py' 2>/dev/null ||
  { echo "train_vs_torch: error: $PY lacks torch or h5py; run scripts/setup.sh (or $PY -m pip install h5py)" >&2; exit 1; }
[ "$device" = cuda ] || [ -x /usr/bin/time ] ||
  { echo "train_vs_torch: error: /usr/bin/time not found (apt-get install time)" >&2; exit 1; }
# torch.compile's on-disk cache (/tmp/torchinductor_$USER unless set) is not keyed by LibTorch's ISA caps:
# the 124M compile peer, run uncapped on a cache filled under ATEN_CPU_CAPABILITY=avx2, corrupted its heap
# and died (free(): invalid pointer), reproducibly. So each set of caps gets its own cache.
if [ -z "${TORCHINDUCTOR_CACHE_DIR:-}" ]; then
  caps="${ATEN_CPU_CAPABILITY:-default}-${MKL_ENABLE_INSTRUCTIONS:-default}-${ONEDNN_MAX_CPU_ISA:-default}"
  export TORCHINDUCTOR_CACHE_DIR="${TMPDIR:-/tmp}/colossal-bench-inductor-$(id -un)-$caps"
fi

TMP="$(mktemp -d "${TMPDIR:-/tmp}/train_vs_torch.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

# Shape table: recipe, seq_len, batch, default steps, then the model fallbacks used where the recipe's [model]
# does not name them: n_layer n_head n_embd vocab_size block_size.
shape_config() {
  case "$1" in
    tiny) echo "recipes/gpt-tiny.toml 128 16 40 2 4 128 1024 128" ;;
    124m) echo "recipes/gpt2-124m.toml 256 4 8 12 12 768 50304 1024" ;;
    124m-1k) echo "recipes/gpt2-124m.toml 1024 8 20 12 12 768 50304 1024" ;;
  esac
}

# Prints "DATASET N_LAYER N_HEAD N_EMBD VOCAB_SIZE BLOCK_SIZE" from the recipe ([data] dataset, [model] sizes),
# so the peers train the shape and read the file colossal does.
recipe_info() {
  "$PY" - "$@" <<'EOF'
import sys, tomllib
path, *fallback = sys.argv[1:]
try:
    with open(path, "rb") as f:
        recipe = tomllib.load(f)
except (OSError, tomllib.TOMLDecodeError) as e:
    sys.exit(f"train_vs_torch: error: cannot read recipe {path}: {e}")
dataset = recipe.get("data", {}).get("dataset")
if not isinstance(dataset, str) or not dataset:
    sys.exit(f'train_vs_torch: error: {path}: [data] has no dataset = "..." (the HDF5 file both sides read)')
model = recipe.get("model", {})
keys = ["n_layer", "n_head", "n_embd", "vocab_size", "block_size"]
print(dataset, *(int(model.get(k, v)) for k, v in zip(keys, fallback)))
EOF
}

# run_one SHAPE_DIR PEER ROUND CMD...: runs CMD under /usr/bin/time and a timeout, leaving OUT.{rc,rss,out,err,reason}.
run_one() {
  local dir="$1" peer="$2" round="$3"; shift 3
  local out="$dir/$peer-$round" rc=0
  if [ "$device" = cuda ]; then   # memory comes from each side's JSON (GPU peak), not from the process
    timeout --kill-after=30 "$timeout_s" "$@" >"$out.out" 2>"$out.err" || rc=$?
  else
    /usr/bin/time -f '%M' -o "$out.rss" timeout --kill-after=30 "$timeout_s" "$@" >"$out.out" 2>"$out.err" || rc=$?
  fi
  echo "$rc" >"$out.rc"
  if ((rc == 124 || rc == 137)); then
    echo "timed out after $timeout_s s" >"$out.reason"
  elif ((rc != 0)); then
    { grep -v '^[[:space:]]*$' "$out.err" | tail -n 1 | sed -E 's/^gpt_ref: (failed|error): //' | cut -c1-200; } \
      >"$out.reason" || true
    [ -s "$out.reason" ] || echo "exit status $rc" >"$out.reason"
  fi
  return "$rc"
}

k=0
declare -A failed
for s in "${shapes[@]}"; do
  read -r recipe T B default_steps fallback <<<"$(shape_config "$s")"
  S="${steps:-$default_steps}"
  name="$(basename "$recipe" .toml)"
  [ -f "$recipe" ] || { echo "train_vs_torch: error: $recipe not found (the $s shape trains it)" >&2; exit 1; }
  # shellcheck disable=SC2086  # fallback is five words on purpose
  read -r dataset n_layer n_head n_embd vocab block <<<"$(recipe_info "$recipe" $fallback)"
  [ -n "$block" ] || exit 1   # recipe_info printed the reason
  if [ ! -f "$dataset" ]; then
    echo "train_vs_torch: $dataset missing; running $COLOSSAL data prepare-recipe $recipe" >&2
    "$COLOSSAL" data prepare-recipe "$recipe"
    [ -f "$dataset" ] || { echo "train_vs_torch: error: '$COLOSSAL data prepare-recipe $recipe' did not create $dataset" >&2; exit 1; }
  fi

  dir="$TMP/$s"; mkdir -p "$dir"
  peer_cmd=("$PY" scripts/bench/gpt_ref.py --n-layer "$n_layer" --n-head "$n_head" --n-embd "$n_embd"
            --vocab-size "$vocab" --block-size "$block" --seq-len "$T" --batch "$B" --steps "$S"
            --warmup-steps "$WARMUP" --dataset "$dataset" --device "$device")
  failed=()
  for ((r = 1; r <= repeat; r++)); do
    echo "train_vs_torch: $name round $r/$repeat" >&2
    k=$((k + 1))
    run_dir="$TMP/colossal-run-$k"
    if ! run_one "$dir" colossal "$r" "$COLOSSAL" train "$recipe" --set "train.max_steps=$S" --set "train.seq_len=$T" \
        --set "train.batch_size=$B" --set train.grad_accum=1 --set model.dropout=0 --set train.eval_every=0 \
        --set train.eval_batches=1 --set checkpoint.every=0 --set "train.device=$device" --set optim.warmup_steps=1 \
        --set "output.dir=$run_dir" --quiet; then
      echo "train_vs_torch: error: colossal train $recipe failed ($(cat "$dir/colossal-$r.reason")); its stderr ends:" >&2
      tail -n 20 "$dir/colossal-$r.err" >&2
      exit 1
    fi
    [ -f "$run_dir/summary.json" ] ||
      { echo "train_vs_torch: error: colossal train finished but wrote no $run_dir/summary.json" >&2; exit 1; }
    cp "$run_dir/summary.json" "$dir/colossal-$r.json"

    for peer in eager-naive eager-sdpa compile; do
      [ -z "${failed[$peer]:-}" ] || continue   # a peer that failed once is not run again
      case "$peer" in
        eager-naive) extra=(--attn naive) ;;
        eager-sdpa) extra=(--attn sdpa) ;;
        compile) extra=(--attn sdpa --compile) ;;
      esac
      if run_one "$dir" "$peer" "$r" "${peer_cmd[@]}" "${extra[@]}"; then
        grep '^{' "$dir/$peer-$r.out" | tail -n 1 >"$dir/$peer-$r.json" || true
      else
        failed[$peer]=1
        echo "train_vs_torch: $peer failed: $(cat "$dir/$peer-$r.reason")" >&2
      fi
    done
  done

  # This machine's fp32 matmul rate at this model's GEMM shapes, measured now (same threads and caps).
  rate=""
  if [ "$device" = cpu ]; then
    rate="$("$PY" scripts/bench/matmul_rate.py --tokens $((B * T)) --n-embd "$n_embd" --vocab-size "$vocab")" ||
      { echo "train_vs_torch: error: scripts/bench/matmul_rate.py failed" >&2; exit 1; }
  fi
  row="$("$PY" - "$dir" "$name" "$T" "$B" "$repeat" "$device" "$n_layer" "$n_embd" "$block" "${rate:-0}" <<'EOF'
import json, math, statistics, sys
from pathlib import Path
d, name, T, B, repeat, device = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6]
n_layer, n_embd, block, matmul_gflops = int(sys.argv[7]), int(sys.argv[8]), int(sys.argv[9]), float(sys.argv[10])

def medians(peer):
    """(tokens/s, peak RSS in bytes, params, final losses) over the rounds, or the reason it failed."""
    tps, rss, params, losses = [], [], set(), []
    for r in range(1, repeat + 1):
        reason = d / f"{peer}-{r}.reason"
        if reason.exists():
            return reason.read_text().strip() or "failed"
        if not (d / f"{peer}-{r}.rc").exists():
            continue
        try:
            res = json.loads((d / f"{peer}-{r}.json").read_text())
            tps.append(float(res["tokens_per_s"]))
        except (OSError, ValueError, KeyError, TypeError) as e:
            return f"no result JSON with tokens_per_s ({type(e).__name__}: {e})"
        if device == "cuda":
            rss.append(float(res.get("peak_device_mb", "nan")) * 1048576)
        else:
            rss.append(int((d / f"{peer}-{r}.rss").read_text().split()[-1]) * 1024)  # /usr/bin/time %M is KB
        if "params" in res:
            params.add(int(res["params"]))
        losses.append(float(res.get("final_loss", "nan")))
    return statistics.median(tps), statistics.median(rss), params, losses

def cell(v, rss):
    where = " GPU" if device == "cuda" else ""
    return f"{v:.0f} tok/s {rss / 1e9:.2f} GB{where}" if v >= 100 else f"{v:.1f} tok/s {rss / 1e9:.2f} GB{where}"

ours = medians("colossal")
if isinstance(ours, str):
    sys.exit(f"train_vs_torch: error: colossal's summary.json: {ours}")
tps, rss, params, losses = ours
# Training FLOPs per token: 6N (forward and backward through every weight but the position table) plus
# 12 L T d for attention's scores and values (nanoGPT's and PaLM's estimate).
flops_per_token = 6 * (max(params) - block * n_embd) + 12 * n_layer * int(T) * n_embd if params else 0
def achieved(v):
    return f", {v * flops_per_token / 1e9:.0f} GFLOP/s" if flops_per_token else ""
parts = [f"{name:<10} T={T} B={B}  colossal {cell(tps, rss)}{achieved(tps)}"]
for peer in ("eager-naive", "eager-sdpa", "compile"):
    m = medians(peer)
    if isinstance(m, str):
        parts.append(f"{peer}: failed ({m})")
        continue
    ptps, prss, pparams, _ = m
    parts.append(f"{peer} {cell(ptps, prss)}{achieved(ptps)} ({tps / ptps:.2f}x, mem {rss / prss:.2f}x)")
    if params and pparams and params != pparams:
        print(f"train_vs_torch: warning: {name}: colossal has {sorted(params)} parameters, {peer} "
              f"{sorted(pparams)}; the shapes differ", file=sys.stderr)
if not all(math.isfinite(x) for x in losses):
    print(f"train_vs_torch: warning: {name}: colossal final_loss {losses} is not finite", file=sys.stderr)
if matmul_gflops > 0 and flops_per_token:
    parts.append(f"matmul {matmul_gflops:.0f} GFLOP/s: colossal at {tps * flops_per_token / 1e9 / matmul_gflops:.2f} of it")
print(" | ".join(parts))
EOF
)"
  echo "$row"
done

torch_version="$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))')"
gpu=""
[ "$device" != cuda ] || gpu=", $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || echo GPU)"
echo "machine: $(bash scripts/bench/cpu_line.sh), $(nproc) cores$gpu, torch $torch_version, $(date +%F), $COMMAND, median of $repeat alternating rounds"
