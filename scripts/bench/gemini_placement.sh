#!/usr/bin/env bash
# gemini_placement.sh: what each Gemini placement costs in training, against everything on the device.
# In alternating rounds on one GPT shape, `colossal train` under ZeRO-3 (one process) with
#   device       placement = "device": ZeRO-3 as such, the reference
#   cpu          placement = "cpu": every chunk's data in host memory, brought in block by block
#   auto         placement = "auto" within a device budget (--budget-gb, default 1.5x the least the model
#                needs, from the dry run): the first step measured, gathered chunks kept and evicted by
#                furthest next use
#   nvme-optim   offload_optimizer = "nvme": the optimizer states and master weights on disk
#   nvme-params  and offload_params = "nvme": the block parameters read from disk as each block runs
# tokens/s of each and its ratio to device, the peak resident memory, the budget's largest window and
# evictions (auto), and the disk's bytes per step (nvme). On a machine without a GPU the device and the
# host are one memory, so cpu and auto measure the placement's own work (copies, eviction, metering),
# not a bus; on a GPU (--device cuda) the same script measures the bus too, and the peak it reports is the
# GPU's (the allocator's, from summary.json and the steps' windows) beside the host's RSS. The budget's dry
# run is on the CPU either way: what it counts does not depend on the device.
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMAND="scripts/bench/gemini_placement.sh"
(($# == 0)) || COMMAND+="$(printf ' %q' "$@")"

usage() {
  cat <<EOF
usage: scripts/bench/gemini_placement.sh [--shape tiny|124m|350m|774m|3b] [--repeat N] [--steps N] [--budget-gb G]
                                         [--modes LIST] [--nvme DIR] [--device cpu|cuda] [--dtype fp32|bf16]
                                         [--seq-len T] [--batch B] [--colossal BIN]
  --shape      tiny (recipes/gpt-tiny.toml, T=128, B=16), or a GPT-2 shape (T=256, B=2); default 124m;
               3b is gpt2-774m's recipe at 36 layers of 2560 (20 heads), about 3.0B parameters
  --repeat     alternating rounds, medians over them; default 2
  --steps      steps each run makes, the first 3 untimed; default 8
  --budget-gb  auto's device budget; default 1.5 times the dry run's least
  --modes      comma-separated, from device,cpu,auto,nvme-optim,nvme-params; default all. A mode with
               -inplace appended runs with overlap_update = "off" (each update before the next forward;
               the plain modes take the recipe's "auto", which overlaps nvme-optim, and cpu and auto on a GPU)
  --nvme       the directory for the offload files; default a new one under /var/tmp
  --device     where the timed runs train (train.device); default cpu
  --dtype      precision.dtype, what the model computes in (fp32 master weights either way); default fp32
  --seq-len    T instead of the shape's; --batch: B instead of the shape's
EOF
}
shape=124m repeat=2 steps=8 budget="" modes=device,cpu,auto,nvme-optim,nvme-params nvme="" COLOSSAL=build/colossal
device=cpu dtype=fp32 seq_len="" batch=""
while (($#)); do
  case "$1" in
    --shape) shape="${2:?}"; shift 2 ;;
    --repeat) repeat="${2:?}"; shift 2 ;;
    --steps) steps="${2:?}"; shift 2 ;;
    --budget-gb) budget="${2:?}"; shift 2 ;;
    --modes) modes="${2:?}"; shift 2 ;;
    --nvme) nvme="${2:?}"; shift 2 ;;
    --device) device="${2:?}"; shift 2 ;;
    --dtype) dtype="${2:?}"; shift 2 ;;
    --seq-len) seq_len="${2:?}"; shift 2 ;;
    --batch) batch="${2:?}"; shift 2 ;;
    --colossal) COLOSSAL="${2:?}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gemini_placement: error: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
. scripts/bench/gemini_runs.sh   # the shapes both Gemini benchmarks run
model_set=()
case "$shape" in
  3b)   # no recipe of its own: GPT-2 774m's (its vocabulary, T and B) widened
    shape=774m gemini_run_shape gemini_placement
    model_set=(--set model.n_layer=36 --set model.n_embd=2560 --set model.n_head=20) ;;
  tiny|124m|350m|774m) gemini_run_shape gemini_placement ;;
  *) echo "gemini_placement: error: --shape '$shape' is not tiny, 124m, 350m, 774m or 3b" >&2; exit 2 ;;
esac
case "$device" in cpu|cuda) ;; *) echo "gemini_placement: error: --device '$device' is not cpu or cuda" >&2; exit 2 ;; esac
case "$dtype" in fp32|bf16) ;; *) echo "gemini_placement: error: --dtype '$dtype' is not fp32 or bf16" >&2; exit 2 ;; esac
for v in seq_len batch; do
  [ -z "${!v}" ] || [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "gemini_placement: error: --${v/_/-} '${!v}' is not a positive integer" >&2; exit 2; }
done
T="${seq_len:-$T}" B="${batch:-$B}"
[ -z "$budget" ] || [[ "$budget" =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "gemini_placement: error: --budget-gb '$budget' is not a number" >&2; exit 2; }
IFS=, read -r -a mode_list <<<"$modes"
for m in "${mode_list[@]}"; do
  case "${m%-inplace}" in device|cpu|auto|nvme-optim|nvme-params) ;; *) echo "gemini_placement: error: unknown mode '$m'" >&2; exit 2 ;; esac
done
[ -x "$COLOSSAL" ] || { echo "gemini_placement: error: $COLOSSAL not found; build it with scripts/build.sh" >&2; exit 1; }
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3

TMP="$(mktemp -d "${TMPDIR:-/tmp}/gemini_placement.XXXXXX")"
[ -n "$nvme" ] || nvme="$(mktemp -d /var/tmp/gemini_placement_nvme.XXXXXX)"
mkdir -p "$nvme"
trap 'rm -rf "$TMP"' EXIT
fail() { echo "gemini_placement: error: $1; its output ends:" >&2; tail -n 20 "$2" >&2; exit 1; }

args=(train "$recipe" --quiet --set "train.max_steps=$steps" --set "train.seq_len=$T" --set "train.batch_size=$B"
      --set train.grad_accum=1 --set model.dropout=0 --set train.eval_every=0 --set train.eval_batches=1
      --set checkpoint.every=0 --set checkpoint.at_end=false --set optim.warmup_steps=1 --set memory.zero=3
      --set "precision.dtype=$dtype" "${model_set[@]}")
if [ -z "$budget" ]; then   # the dry run's least under a budget far above it, times 1.5
  "$COLOSSAL" "${args[@]}" --set train.device=cpu --dry-run --set memory.device_memory_limit_gb=100000 >"$TMP/dry.txt" 2>&1 ||
    fail "the dry run failed" "$TMP/dry.txt"
  budget="$("$PY" - "$TMP/dry.txt" <<'EOF'
import re, sys
m = re.search(r"device +at least ([0-9.]+) (B|KiB|MiB|GiB|TiB)", open(sys.argv[1]).read())
scale = {"B": 0, "KiB": 1, "MiB": 2, "GiB": 3, "TiB": 4}[m.group(2)]
print(f"{1.5 * float(m.group(1)) * 1024 ** scale / 2 ** 30:.4f}")
EOF
)"
fi
flags() {
  [[ "$1" == *-inplace ]] && echo "--set memory.overlap_update=off"
  case "${1%-inplace}" in
    device) echo "--set memory.placement=device" ;;
    cpu) echo "--set memory.placement=cpu" ;;
    auto) echo "--set memory.placement=auto --set memory.device_memory_limit_gb=$budget" ;;
    nvme-optim) echo "--set memory.placement=device --set memory.offload_optimizer=nvme --set memory.nvme_path=$nvme" ;;
    nvme-params) echo "--set memory.placement=device --set memory.offload_optimizer=nvme --set memory.offload_params=nvme --set memory.nvme_path=$nvme" ;;
  esac
}
for ((r = 1; r <= repeat; r++)); do
  echo "gemini_placement: round $r/$repeat" >&2
  for m in "${mode_list[@]}"; do
    out="$TMP/$m-$r"
    # shellcheck disable=SC2046
    "$COLOSSAL" "${args[@]}" --set "train.device=$device" $(flags "$m") --set "output.dir=$out" >"$out.log" 2>&1 ||
      fail "colossal ($m) failed" "$out.log"
  done
done

"$PY" - "$TMP" "$repeat" "$shape" "$T" "$B" "$budget" "$COMMAND" "$modes" "$device" "$dtype" <<'EOF'
import datetime, json, os, statistics, subprocess, sys
tmp, repeat, shape, T, B, budget, command, modes, device, dtype = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
med = statistics.median
modes = modes.split(",")
cuda = device == "cuda"
def run(mode, r):
    d = f"{tmp}/{mode}-{r}"
    s = json.load(open(f"{d}/summary.json"))
    every = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if '"update_ms"' in l]
    steps = every[3:]   # past the untimed steps
    # The GPU's peak: the allocator's over the run, and every step's largest window (a budget's windows reset the
    # allocator's peak, so summary.json's covers only what came after the last one). 0 where neither is recorded.
    gpu = max([s.get("peak_device_mb", 0)] + [x.get("device_peak_mb", 0) for x in every])
    return {"tps": s["tokens_per_s"], "rss": s["rss_mb"]["peak"][0], "gpu": gpu,
            "window": max((x.get("device_peak_mb", 0) for x in steps), default=0),
            "evictions": med(x.get("evictions", 0) for x in steps),
            # a step's time, and of it the norm, clipping and update (the rest is forward and backward)
            "step": med(x["step_ms"] for x in steps), "update": med(x["update_ms"] for x in steps),
            # overlapped: what the step waited for the last update, which ran beside its forward
            "wait": med(x.get("update_wait_ms", 0) for x in steps), "overlapped": "update_wait_ms" in steps[0],
            "disk": med(x.get("nvme_read_mb", 0) + x.get("nvme_write_mb", 0) for x in steps)}
res = {m: [run(m, r) for r in range(1, repeat + 1)] for m in modes}
fig = {m: {k: med(x[k] for x in res[m]) if k != "overlapped" else res[m][0][k] for k in res[m][0]} for m in modes}
ref = fig.get("device", fig[modes[0]])["tps"]
name = {"tiny": "gpt-tiny", "3b": "gpt2-3b (36x2560)"}.get(shape, f"gpt2-{shape}")
how = (f", {dtype}" if dtype != "fp32" else "") + (", cuda" if cuda else "")
peak = "peak GPU | peak RSS" if cuda else "peak RSS"
print(f"| {name} T={T} B={B}{how}, ZeRO-3, 1 process | tokens/s | vs device | step | of which update (overlapped: beside the forward, of which waited for) | {peak} | device window (auto) | evictions/step | disk/step |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if cuda else ""))
for m in modes:
    f = fig[m]
    auto = m.startswith("auto")
    window = f"{f['window']:.0f} of {float(budget) * 1024:.0f} MiB" if auto else ""
    evictions = f"{f['evictions']:.0f}" if auto else ""
    update = f"{f['update']:.0f} ms" + (f" beside, {f['wait']:.0f} ms waited" if f["overlapped"] else "")
    disk = f"{f['disk'] / 1024:.2f} GiB" if f["disk"] else ""
    gpu = (f"{f['gpu']:.0f} MiB | " if f["gpu"] else "n/a | ") if cuda else ""
    print(f"| {m} | {f['tps']:.0f} | {f['tps'] / ref:.2f}x | {f['step']:.0f} ms | {update} | {gpu}{f['rss']:.0f} MiB | {window} | {evictions} | {disk} |")
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown CPU")
gpu = ""
if cuda:
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.splitlines()[0].strip()
    except (OSError, IndexError):
        gpu = "unknown GPU"
    gpu = f"GPU {gpu}, "
print(f"machine: {os.cpu_count()} cores, {cpu}, {gpu}{datetime.date.today()}, {command} (median of {repeat})")
EOF
