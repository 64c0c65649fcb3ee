#!/usr/bin/env bash
# host_adam.sh: the host optimizer step on about 100M fp32 parameters (GPT-2 width, 9 blocks: 103M) in
# alternating rounds. colossal: the update phase of `colossal train` (metrics.jsonl's update_ms: the global
# norm, clipping folded into the fused AdamW pass, the update), without the norm's time (norm_ms) and
# with clipping that acts. Peers (scripts/bench/host_adam.py, same shapes, random gradients): torch.optim.AdamW foreach and
# fused, and DeepSpeed's CPUAdam from --ds-python, each without and with torch's clip_grad_norm_ first.
# Prints medians and colossal's ratio to each (peer time / colossal time: above 1 is faster).
# --device cuda: the same on a GPU (colossal's multi-piece kernel in kernels/cuda against torch's foreach
# and fused AdamW there, each step timed to its completion; no DeepSpeed).
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMAND="scripts/bench/host_adam.sh"
(($# == 0)) || COMMAND+="$(printf ' %q' "$@")"

usage() {
  cat <<EOF
usage: scripts/bench/host_adam.sh [--repeat N] [--steps N] [--device cpu|cuda] [--python PY] [--ds-python PY] [--colossal BIN]
  --repeat     alternating rounds, medians over them; default 3
  --steps      timed steps per run (colossal runs 3 more, untimed); default 5
  --device     where the parameters and the update are: cpu (default) or cuda
  --ds-python  a Python with deepspeed for its CPUAdam (it builds its C++ op at first use: needs g++,
               ninja and python3-dev); left out when not given and PY has no deepspeed
EOF
}
repeat=3 steps=5 device=cpu COLOSSAL=build/colossal PY=.venv/bin/python DS_PY=
while (($#)); do
  case "$1" in
    --repeat) repeat="${2:?}"; shift 2 ;;
    --steps) steps="${2:?}"; shift 2 ;;
    --device) device="${2:?}"; shift 2 ;;
    --python) PY="${2:?}"; shift 2 ;;
    --ds-python) DS_PY="${2:?}"; shift 2 ;;
    --colossal) COLOSSAL="${2:?}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "host_adam: error: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[[ "$repeat" =~ ^[1-9][0-9]*$ ]] || { echo "host_adam: error: --repeat '$repeat' is not a positive integer" >&2; exit 2; }
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "host_adam: error: --steps '$steps' is not a positive integer" >&2; exit 2; }
[[ "$device" =~ ^(cpu|cuda)$ ]] || { echo "host_adam: error: --device '$device' is not cpu or cuda" >&2; exit 2; }
[ -x "$COLOSSAL" ] || { echo "host_adam: error: $COLOSSAL not found; build it with scripts/build.sh" >&2; exit 1; }
if [ "$device" = cpu ]; then
  [ -n "$DS_PY" ] || { "$PY" -c 'import deepspeed' 2>/dev/null && DS_PY="$PY"; } || true
  [ -n "$DS_PY" ] || echo "host_adam: no Python with deepspeed (see --ds-python): its CPUAdam is left out" >&2
else
  DS_PY=   # DeepSpeed's CPUAdam is a host optimizer
fi

TMP="$(mktemp -d "${TMPDIR:-/tmp}/host_adam.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
fail() { echo "host_adam: error: $1; its output ends:" >&2; tail -n 20 "$2" >&2; exit 1; }
LAYERS=9
args=(train recipes/gpt2-124m.toml --quiet --set "model.n_layer=$LAYERS" --set "train.max_steps=$((steps + 3))"
      --set train.seq_len=64 --set train.batch_size=1 --set train.grad_accum=1 --set model.dropout=0
      --set train.eval_every=0 --set train.eval_batches=1 --set checkpoint.every=0 --set optim.warmup_steps=1
      --set "train.device=$device")
for ((r = 1; r <= repeat; r++)); do
  echo "host_adam: round $r/$repeat" >&2
  for clip in 0 0.001; do
    out="$TMP/colossal-$clip-$r"
    "$COLOSSAL" "${args[@]}" --set "train.grad_clip=$clip" --set "output.dir=$out" >"$out.log" 2>&1 ||
      fail "colossal train failed" "$out.log"
  done
  "$PY" scripts/bench/host_adam.py --layers "$LAYERS" --steps "$steps" --device "$device" --peers foreach,fused >"$TMP/torch-$r.json" 2>"$TMP/torch-$r.err" ||
    fail "the torch peers failed" "$TMP/torch-$r.err"
  if [ -n "$DS_PY" ]; then
    "$DS_PY" scripts/bench/host_adam.py --layers "$LAYERS" --steps "$steps" --peers deepspeed >"$TMP/ds-$r.json" 2>"$TMP/ds-$r.err" ||
      fail "the DeepSpeed peer failed" "$TMP/ds-$r.err"
  fi
done

"$PY" - "$TMP" "$repeat" "$COMMAND" "$device" <<'EOF'
import datetime, glob, json, os, statistics, sys
tmp, repeat, command, device = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
med = statistics.median
def update_ms(clip, r, without_norm=False):
    rows = [json.loads(l) for l in open(f"{tmp}/colossal-{clip}-{r}/metrics.jsonl") if '"update_ms"' in l][3:]
    return med(x["update_ms"] - (x["norm_ms"] if without_norm else 0) for x in rows)
# The update alone (the norm's time taken out: torch's step computes none) and with clipping (norm included).
ours = {"step_ms": med(update_ms("0", r, True) for r in range(1, repeat + 1)),
        "clip_step_ms": med(update_ms("0.001", r) for r in range(1, repeat + 1)),
        "norm_ms": med(update_ms("0.001", r) - update_ms("0.001", r, True) for r in range(1, repeat + 1))}
peers, params, torch_version = {}, 0, ""
for f in sorted(glob.glob(f"{tmp}/torch-*.json")) + sorted(glob.glob(f"{tmp}/ds-*.json")):
    j = json.loads(open(f).read().strip().splitlines()[-1])
    params, torch_version = j["params"], torch_version or j["torch"]
    for name in ("foreach", "fused", "deepspeed"):
        if name in j:
            for k in ("step_ms", "clip_step_ms"):
                peers.setdefault(name, {}).setdefault(k, []).append(j[name][k])
label = {"foreach": "torch AdamW foreach", "fused": "torch AdamW fused", "deepspeed": "DeepSpeed CPUAdam"}
print(f"AdamW on {'the host' if device == 'cpu' else 'the GPU'}, {params / 1e6:.1f}M fp32 parameters (GPT-2 width, 9 blocks)")
print(f"  {'':22s} {'update':>10s} {'ratio':>7s} {'clip+update':>12s} {'ratio':>7s}")
print(f"  {'colossal':22s} {ours['step_ms']:8.1f} ms {'':>7s} {ours['clip_step_ms']:10.1f} ms")
for name, v in peers.items():
    s, c = med(v["step_ms"]), med(v["clip_step_ms"])
    print(f"  {label[name]:22s} {s:8.1f} ms {s / ours['step_ms']:6.2f}x {c:10.1f} ms {c / ours['clip_step_ms']:6.2f}x")
print(f"  colossal's clip+update: its global norm ({ours['norm_ms']:.0f} ms), then clipping folded into the AdamW pass")
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown CPU")
if device == "cuda":
    import torch
    cpu = f"{torch.cuda.get_device_name(0)} on {cpu}"
print(f"machine: {os.cpu_count()} cores, {cpu}, torch {torch_version}, {datetime.date.today()}, {command} (median of {repeat})")
EOF
