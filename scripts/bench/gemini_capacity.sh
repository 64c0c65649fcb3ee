#!/usr/bin/env bash
# gemini_capacity.sh: the largest GPT that plain eager PyTorch trains on this machine (fp32 + AdamW,
# scripts/bench/gpt_ref.py) against `colossal train` on a model --ratio times its parameters with the
# parameters and optimizer states on NVMe (ZeRO-3, bf16 compute with fp32 master weights and fp32 AdamW
# moments in the offload file: 12 bytes per parameter on disk, the gradients' 2 in memory).
#
# PyTorch's largest: blocks of width --width are added until a run of 2 steps fails inside a memory
# cgroup of --budget-gb (default: the machine's memory), then the depth is bisected. colossal then runs
# the depth whose parameters first reach --ratio times that, in the same cgroup, for --steps steps, and
# its metrics give tokens/s, the disk's bytes per step and their rates, and the peak RSS. The final
# checkpoint is off (checkpoint.at_end = false): at 4x, a checkpoint of weights and moments (12 bytes per
# parameter) does not fit on this disk beside the offload file (12 more); saving and resuming are
# covered by the tests at small sizes. Not a test: tens of minutes, and a result that depends on the
# machine and its disk.
#
# --device cuda asks the same of one GPU: PyTorch's largest on the GPU (fp32 + AdamW, the GPU's memory the
# limit, no cgroup unless --budget-gb is given), and colossal's model of --ratio times its parameters under
# ZeRO-3 with placement "auto" (the chunks in host memory, as many on the GPU as 90% of it holds beside the
# measured activations) in bf16; the table gives the GPU's peak beside the host's. The host's memory bounds
# that model: about 16 bytes a parameter (fp32 master weights, AdamW's moments, gradients).
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMAND="scripts/bench/gemini_capacity.sh"
(($# == 0)) || COMMAND+="$(printf ' %q' "$@")"

usage() {
  cat <<EOF
usage: scripts/bench/gemini_capacity.sh [--ratio R] [--width C] [--seq-len T] [--steps N] [--nvme DIR]
                                        [--budget-gb N] [--torch-layers L] [--device cpu|cuda] [--colossal BIN] [--python PY]
  --ratio         colossal's model against PyTorch's largest, in parameters; default 4
  --width         n_embd of every model (n_head = width / 128); default 2048
  --seq-len       tokens per sequence, batch 1; default 128
  --steps         colossal's optimizer steps; default 2
  --nvme          the offload directory; default runs/nvme (on this disk)
  --budget-gb     the memory cgroup both run in; default: the machine's memory
  --torch-layers  skip PyTorch's search and take this depth as its largest (from an earlier run)
  --device        cpu (NVMe offload, the machine's memory the limit) or cuda (placement auto, the GPU's); default cpu
EOF
}
ratio=4 C=2048 T=128 steps=2 nvme=runs/nvme budget= torch_layers= device=cpu
COLOSSAL=build/colossal
PY=.venv/bin/python
while (($#)); do
  case "$1" in
    --ratio) ratio="${2:?}"; shift 2 ;;
    --width) C="${2:?}"; shift 2 ;;
    --seq-len) T="${2:?}"; shift 2 ;;
    --steps) steps="${2:?}"; shift 2 ;;
    --nvme) nvme="${2:?}"; shift 2 ;;
    --budget-gb) budget="${2:?}"; shift 2 ;;
    --torch-layers) torch_layers="${2:?}"; shift 2 ;;
    --device) device="${2:?}"; shift 2 ;;
    --colossal) COLOSSAL="${2:?}"; shift 2 ;;
    --python) PY="${2:?}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gemini_capacity: error: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
for v in "C:$C" "T:$T" "steps:$steps"; do
  [[ "${v#*:}" =~ ^[1-9][0-9]*$ ]] || { echo "gemini_capacity: error: ${v%%:*} '${v#*:}' is not a positive whole number" >&2; exit 2; }
done
[[ "$ratio" =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "gemini_capacity: error: --ratio '$ratio' is not a number" >&2; exit 2; }
((C % 128 == 0)) || { echo "gemini_capacity: error: --width $C is not a multiple of 128 (the head size)" >&2; exit 2; }
[ -z "$torch_layers" ] || [[ "$torch_layers" =~ ^[1-9][0-9]*$ ]] || { echo "gemini_capacity: error: --torch-layers '$torch_layers' is not a positive whole number" >&2; exit 2; }
[[ "$device" =~ ^(cpu|cuda)$ ]] || { echo "gemini_capacity: error: --device '$device' is not cpu or cuda" >&2; exit 2; }
[ -x "$COLOSSAL" ] || { echo "gemini_capacity: error: $COLOSSAL not found; build it with scripts/build.sh" >&2; exit 1; }
# On a GPU the GPU's memory is the limit: a host cgroup only where a budget is asked for.
use_cgroup=1
[ "$device" = cuda ] && [ -z "$budget" ] && use_cgroup=0
((use_cgroup == 0)) || [ "$(id -u)" = 0 ] || { echo "gemini_capacity: error: the memory cgroup needs root" >&2; exit 1; }
mem_kb=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
bytes=$((${budget:-0} > 0 ? budget * 1024 * 1024 * 1024 : mem_kb * 1024))
H=$((C / 128)) V=50304 P=1024

recipe=recipes/gpt2-350m.toml
dataset=runs/data/kjv-bpe-8192.h5
[ -f "$dataset" ] || "$COLOSSAL" data prepare-recipe "$recipe" >&2
mkdir -p "$nvme"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/gemini_capacity.XXXXXX")"
. scripts/bench/memory_cgroup.sh
CG=""
((use_cgroup == 0)) || memory_cgroup colossal_gemini_capacity "$bytes"
cleanup() {
  rm -rf "$TMP"
  [ -z "$CG" ] || memory_cgroup_remove
}
enter_cgroup() { [ -z "$CG" ] || echo $BASHPID >"$CG/cgroup.procs"; }
trap cleanup EXIT

params_of() {   # GPT-2's parameters at depth $1: blocks, token and position tables, final norm (the head is tied)
  echo $(($1 * (12 * C * C + 13 * C) + (V + P) * C + 2 * C))
}

# PyTorch at depth $1: 0 when its 2 steps complete; one line either way.
torch_attempt() {
  local layers=$1 out="$TMP/torch-$1" status=0
  (
    enter_cgroup
    exec "$PY" scripts/bench/gpt_ref.py --n-layer "$layers" --n-head "$H" --n-embd "$C" --vocab-size "$V" --block-size "$P" \
      --seq-len "$T" --batch 1 --steps 2 --warmup-steps 1 --dataset "$dataset" --threads "$(nproc)" --device "$device"
  ) >"$out.json" 2>"$out.log" || status=$?
  local params
  params=$(params_of "$layers")
  if ((status == 0)); then
    "$PY" - "$out.json" "$layers" <<'PYEOF' >&2
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
gpu = f", peak GPU {r['peak_device_mb']:.0f} MiB" if r.get("peak_device_mb") else ""
print(f"  PyTorch n_layer={sys.argv[2]:>3} {r['params'] / 1e6:7.1f}M params: trains, peak RSS {r['peak_rss_mb']:.0f} MiB{gpu}, {r['tokens_per_s']:.1f} tok/s")
PYEOF
  else
    echo "  PyTorch n_layer=$(printf '%3d' "$layers") $(awk "BEGIN{printf \"%7.1f\", $params/1e6}")M params: fails (exit $status$( ((status == 137)) && echo ': killed at the memory limit'))" >&2
  fi
  return $status
}

echo "gemini_capacity: width $C ($H heads), vocabulary $V, T=$T, batch 1, memory $(awk "BEGIN{printf \"%.1f\", $bytes/2^30}") GiB, $([ "$device" = cuda ] && echo "on the GPU" || echo "nvme $nvme")" >&2
if [ -z "$torch_layers" ]; then
  echo "plain eager PyTorch (fp32, AdamW) on the $device, 2 steps:" >&2
  good=0 bad=0 layers=8
  while ((bad == 0)); do
    if torch_attempt "$layers"; then good=$layers; layers=$((layers * 2)); else bad=$layers; fi
    ((layers <= 1024)) || break
  done
  while ((bad > 0 && bad - good > 1)); do
    mid=$(((good + bad) / 2))
    if torch_attempt "$mid"; then good=$mid; else bad=$mid; fi
  done
  torch_layers=$good
  ((torch_layers > 0)) || { echo "gemini_capacity: error: PyTorch trains not even 8 layers of width $C here" >&2; exit 1; }
fi
p_torch=$(params_of "$torch_layers")

# colossal: the first depth whose parameters reach ratio x PyTorch's.
layers=$(awk -v r="$ratio" -v p="$p_torch" -v c="$C" -v v="$V" -v n="$P" 'BEGIN {
  outer = (v + n) * c + 2 * c; block = 12 * c * c + 13 * c; l = (r * p - outer) / block; print (l == int(l)) ? l : int(l) + 1 }')
p_ours=$(params_of "$layers")
if [ "$device" = cuda ]; then
  where=(--set train.device=cuda --set memory.placement=auto)
  echo "colossal on the GPU, ZeRO-3 with placement auto, bf16 (n_layer $layers, $(awk "BEGIN{printf \"%.2f\", $p_ours/1e9}")B params):" >&2
else
  where=(--set memory.offload_optimizer=nvme --set memory.offload_params=nvme --set "memory.nvme_path=$nvme")
  need=$((p_ours * 12))
  free=$(df -B1 --output=avail "$nvme" | tail -n 1)
  echo "colossal, ZeRO-3 with parameters and optimizer states on NVMe, bf16 (n_layer $layers, $(awk "BEGIN{printf \"%.2f\", $p_ours/1e9}")B params, $(awk "BEGIN{printf \"%.1f\", $need/1e9}") GB on disk of $(awk "BEGIN{printf \"%.1f\", $free/1e9}") GB free):" >&2
fi
out="$TMP/colossal"
status=0
start=$(date +%s)
(
  enter_cgroup
  exec env OMP_NUM_THREADS="$(nproc)" "$COLOSSAL" train "$recipe" --quiet --set "model.n_layer=$layers" --set "model.n_embd=$C" \
    --set "model.n_head=$H" --set "train.max_steps=$steps" --set "train.seq_len=$T" --set train.batch_size=1 --set train.grad_accum=1 \
    --set train.eval_every=0 --set train.eval_batches=1 --set checkpoint.every=0 --set checkpoint.at_end=false \
    --set memory.zero=3 --set precision.dtype=bf16 "${where[@]}" --set "output.dir=$out"
) >"$out.log" 2>&1 || status=$?
wall=$(($(date +%s) - start))
if ((status != 0)); then
  echo "  fails (exit $status): $(tail -n 1 "$out.log" | cut -c1-200)" >&2
  exit 1
fi
"$PY" - "$out" "$p_torch" "$p_ours" "$torch_layers" "$layers" "$wall" "$COMMAND" <<'PYEOF'
import json, subprocess, sys
out, p_torch, p_ours, lt, lo, wall, command = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6]), sys.argv[7]
steps = [json.loads(l) for l in open(f"{out}/metrics.jsonl") if '"loss"' in l]
s = json.load(open(f"{out}/summary.json"))
last = steps[-1]
step_s = last["step_ms"] / 1e3
print(f"  trains: {len(steps)} steps in {wall} s with setup, loss {steps[0]['loss']:.3f} -> {last['loss']:.3f}")
print()
if "nvme_read_mb" in last:   # the CPU's run: parameters and states on NVMe
    read, write = last["nvme_read_mb"], last["nvme_write_mb"]
    print("| | n_layer | parameters | vs PyTorch | peak RSS | step | tokens/s | disk per step |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print(f"| plain eager PyTorch (fp32, AdamW), largest that trains | {lt} | {p_torch / 1e9:.2f}B | 1.00x | | | | |")
    print(f"| colossal, parameters and AdamW on NVMe (bf16) | {lo} | {p_ours / 1e9:.2f}B | {p_ours / p_torch:.2f}x | "
          f"{s['peak_rss_mb']:.0f} MiB | {step_s:.0f} s | "
          f"{last['tokens_per_s']:.2f} | read {read / 1024:.1f} GiB ({read / step_s:.0f} MiB/s), written {write / 1024:.1f} GiB "
          f"({write / step_s:.0f} MiB/s); the update {last['update_ms'] / 1e3:.0f} s |")
else:   # the GPU's run: placement auto, the chunks in host memory
    gpu = max([s.get("peak_device_mb", 0)] + [x.get("device_peak_mb", 0) for x in steps])
    print("| | n_layer | parameters | vs PyTorch | peak GPU | peak RSS | step | tokens/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print(f"| plain eager PyTorch (fp32, AdamW) on the GPU, largest that trains | {lt} | {p_torch / 1e9:.2f}B | 1.00x | | | | |")
    print(f"| colossal, placement auto (bf16) | {lo} | {p_ours / 1e9:.2f}B | {p_ours / p_torch:.2f}x | {gpu:.0f} MiB | "
          f"{s['peak_rss_mb']:.0f} MiB | {step_s:.1f} s | {last['tokens_per_s']:.1f} |")
cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True, text=True).stdout.strip()
date = subprocess.run(["date", "+%F"], capture_output=True, text=True).stdout.strip()
print()
gpu_name = subprocess.run(["sh", "-c", "nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1"],
                          capture_output=True, text=True).stdout.strip()
print(f"machine: {cpu}, {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores, "
      f"{'GPU ' + gpu_name + ', ' if gpu_name and 'nvme_read_mb' not in last else ''}{date}, {command}")
PYEOF
