#!/usr/bin/env bash
# quantize_memory.sh: what int8 weight quantization of a checkpoint costs in memory and time.
# `colossal quantize --scheme int8-weight --eval-tokens 0` block at a time (--stream-weights on: each
# tensor read, quantized and written at once) and with the whole model in memory (--stream-weights off),
# against the same quantization in PyTorch as a careful user writes it (scripts/bench/quantize_peer.py:
# safetensors' safe_open one tensor at a time from the mapped files, save_file at the end, which needs the
# whole output in memory). Alternating rounds, medians of peak RSS and the whole process's seconds
# (/usr/bin/time). --cold drops the page cache before each run, so every side reads the checkpoint from
# the disk. On a checkpoint larger than memory only the block-at-a-time side can run (--sides streamed).
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMAND="scripts/bench/quantize_memory.sh"
(($# == 0)) || COMMAND+="$(printf ' %q' "$@")"

usage() {
  cat <<EOF
usage: scripts/bench/quantize_memory.sh --python PY [--checkpoint DIR] [--sides LIST] [--cold] [--repeat N] [--threads N]
  --python      a Python with torch and safetensors (the peer)
  --checkpoint  a colossal GPT-2 checkpoint or HF GPT-2 directory; default the one infer_vs_transformers.sh trains
  --sides       of streamed,whole,peer (default all three)
  --cold        drop the page cache before each run (needs root)
  --out-dir     where the outputs go (default a temporary directory; each removed after its run)
EOF
}
sides=streamed,whole,peer cold=0 CKPT="" threads="$(nproc)" repeat=3 COLOSSAL=build/colossal PY="" OUT_DIR=""
while (($#)); do
  case "$1" in
    --python) PY="${2:?}"; shift 2 ;;
    --checkpoint) CKPT="${2:?}"; shift 2 ;;
    --sides) sides="${2:?}"; shift 2 ;;
    --cold) cold=1; shift ;;
    --out-dir) OUT_DIR="${2:?}"; shift 2 ;;
    --threads) threads="${2:?}"; shift 2 ;;
    --repeat) repeat="${2:?}"; shift 2 ;;
    --colossal) COLOSSAL="${2:?}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "quantize_memory: error: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[ -n "$PY" ] || { echo "quantize_memory: error: --python is required (a Python with torch and safetensors)" >&2; exit 2; }
"$PY" -c 'import torch, safetensors' 2>/dev/null || { echo "quantize_memory: error: $PY cannot import torch and safetensors" >&2; exit 1; }
[ -x "$COLOSSAL" ] || { echo "quantize_memory: error: $COLOSSAL not found; build it with scripts/build.sh" >&2; exit 1; }
[[ "$sides" =~ ^(streamed|whole|peer)(,(streamed|whole|peer))*$ ]] ||
  { echo "quantize_memory: error: --sides '$sides' must list streamed, whole and/or peer" >&2; exit 2; }
source scripts/bench/default_checkpoint.sh
if [ -z "$CKPT" ]; then
  CKPT="$(default_checkpoint quantize_memory "$COLOSSAL")" || exit 1
else
  CKPT="$(resolve "$CKPT")" || { echo "quantize_memory: error: --checkpoint: no model.safetensors, latest or checkpoints/latest in it" >&2; exit 1; }
fi
TMP="$(mktemp -d "${TMPDIR:-/tmp}/quantize_memory.XXXXXX")"
OUT_DIR="${OUT_DIR:-$TMP}"
trap 'rm -rf "$TMP" "$OUT_DIR/q"' EXIT
fail() { echo "quantize_memory: error: $1; its output ends:" >&2; tail -n 20 "$2" >&2; exit 1; }
timed=(/usr/bin/time -f 'maxrss %M elapsed %e')
for ((r = 1; r <= repeat; r++)); do
  echo "quantize_memory: round $r/$repeat" >&2
  IFS=, read -r -a each <<<"$sides"
  for side in "${each[@]}"; do
    rm -rf "$OUT_DIR/q"
    if ((cold)); then sync; echo 3 >/proc/sys/vm/drop_caches; fi
    case "$side" in
      streamed|whole)
        mode=on; [ "$side" = whole ] && mode=off
        OMP_NUM_THREADS="$threads" "${timed[@]}" "$COLOSSAL" quantize "$CKPT" --out "$OUT_DIR/q" --scheme int8-weight --eval-tokens 0 \
          --stream-weights "$mode" >"$TMP/$side-$r.out" 2>"$TMP/$side-$r.err" || fail "colossal quantize ($side) failed" "$TMP/$side-$r.err" ;;
      peer)
        "${timed[@]}" "$PY" scripts/bench/quantize_peer.py "$CKPT" "$OUT_DIR/q" --threads "$threads" >"$TMP/$side-$r.out" 2>"$TMP/$side-$r.err" ||
          fail "the PyTorch peer failed" "$TMP/$side-$r.err" ;;
    esac
    du -sb "$OUT_DIR/q" | cut -f1 >"$TMP/$side-$r.bytes"
  done
done

"$PY" - "$TMP" "$repeat" "$CKPT" "$threads" "$COMMAND" "$sides" "$cold" <<'EOF'
import datetime, os, re, statistics, sys
tmp, repeat, ckpt, threads, command, sides, cold = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
med = statistics.median
def run(side, r):
    err = open(f"{tmp}/{side}-{r}.err").read()
    return (int(re.search(r"maxrss (\d+)", err).group(1)) / 1024, float(re.search(r"elapsed ([\d.]+)", err).group(1)),
            int(open(f"{tmp}/{side}-{r}.bytes").read()) / 2**30)
names = {"streamed": "colossal quantize, block at a time", "whole": "colossal quantize, whole model in memory",
         "peer": "PyTorch + safetensors (safe_open, save_file)"}
rows = {s: [run(s, r) for r in range(1, repeat + 1)] for s in sides.split(",")}
weights = sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt)
              if f == "model.safetensors" or re.fullmatch(r"model-\d+-of-\d+\.safetensors", f)) / 2**30
first = next(iter(rows))
print(f"checkpoint {ckpt} ({weights:.2f} GiB of weights) to int8 weights, {threads} threads, "
      f"{'page cache dropped before each run' if cold == '1' else 'through the page cache'}; ratios: the side against {names[first]}")
ref_rss, ref_secs = med(x[0] for x in rows[first]), med(x[1] for x in rows[first])
for side, xs in rows.items():
    rss, secs, out = med(x[0] for x in xs), med(x[1] for x in xs), med(x[2] for x in xs)
    print(f"  {names[side]:46s} peak {rss:7.0f} MiB ({rss / ref_rss:5.2f}x)  process {secs:7.1f} s ({secs / ref_secs:5.2f}x)  "
          f"wrote {out:6.2f} GiB")
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown CPU")
mem = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal")) / 2**20
print(f"machine: {os.cpu_count()} cores, {cpu}, {mem:.1f} GiB, {datetime.date.today()}, {command} (median of {repeat})")
EOF
