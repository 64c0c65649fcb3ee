#!/usr/bin/env bash
# gemini_offload.sh: what optimizer offload to NVMe costs, and how close its streaming comes to the disk.
# In alternating rounds on one GPT shape, `colossal train` with the optimizer states in memory
# (offload_optimizer = "none") and on disk ("nvme", a file under --nvme): tokens/s of each and their ratio,
# the update phase (norm, clipping, AdamW; with nvme, every chunk's states read and written back through
# io_uring) and the bytes it moved. Then fio on the same directory, O_DIRECT with io_uring at the same
# queue depth (16) and request size (1 MiB) as the offload file, sequential write then read: the time fio
# needs for the update's bytes against the time the update took ("of fio": the issue asks at least 0.8;
# the update's Adam arithmetic is inside that time, overlapped with the transfers).
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMAND="scripts/bench/gemini_offload.sh"
(($# == 0)) || COMMAND+="$(printf ' %q' "$@")"

usage() {
  cat <<EOF
usage: scripts/bench/gemini_offload.sh [--shape tiny|124m|350m|774m] [--repeat N] [--steps N] [--nvme DIR] [--colossal BIN]
  --shape    tiny (recipes/gpt-tiny.toml, T=128, B=16), or a GPT-2 shape (T=256, B=2); default 124m
  --repeat   alternating rounds, medians over them; default 3
  --steps    steps each run makes, the first 3 untimed; default 8
  --nvme     the directory the offload file and fio's file go in; default a new one under /var/tmp
EOF
}
shape=124m repeat=3 steps=8 nvme="" COLOSSAL=build/colossal
while (($#)); do
  case "$1" in
    --shape) shape="${2:?}"; shift 2 ;;
    --repeat) repeat="${2:?}"; shift 2 ;;
    --steps) steps="${2:?}"; shift 2 ;;
    --nvme) nvme="${2:?}"; shift 2 ;;
    --colossal) COLOSSAL="${2:?}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gemini_offload: error: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
. scripts/bench/gemini_runs.sh   # the shapes both Gemini benchmarks run
gemini_run_shape gemini_offload
[ -x "$COLOSSAL" ] || { echo "gemini_offload: error: $COLOSSAL not found; build it with scripts/build.sh" >&2; exit 1; }
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
if ! command -v fio >/dev/null; then
  echo "gemini_offload: installing fio (Debian) for the disk's own rates" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio >/dev/null
fi

TMP="$(mktemp -d "${TMPDIR:-/tmp}/gemini_offload.XXXXXX")"
[ -n "$nvme" ] || nvme="$(mktemp -d /var/tmp/gemini_offload_nvme.XXXXXX)"
mkdir -p "$nvme"
trap 'rm -rf "$TMP" "$nvme"/gemini_offload_fio.*' EXIT
fail() { echo "gemini_offload: error: $1; its output ends:" >&2; tail -n 20 "$2" >&2; exit 1; }

args=(train "$recipe" --quiet --set "train.max_steps=$steps" --set "train.seq_len=$T" --set "train.batch_size=$B"
      --set train.grad_accum=1 --set model.dropout=0 --set train.eval_every=0 --set train.eval_batches=1
      --set checkpoint.every=0 --set optim.warmup_steps=1 --set train.device=cpu)
for ((r = 1; r <= repeat; r++)); do
  echo "gemini_offload: round $r/$repeat" >&2
  for mode in none nvme; do
    out="$TMP/$mode-$r"
    "$COLOSSAL" "${args[@]}" --set "memory.offload_optimizer=$mode" --set "memory.nvme_path=$nvme" --set "output.dir=$out" \
      >"$out.log" 2>&1 || fail "colossal with offload_optimizer = $mode failed" "$out.log"
  done
done

# The disk alone: as many bytes as one update reads, written then read back.
size_mb="$("$PY" - "$TMP/nvme-1/metrics.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"nvme_read_mb"' in l]
print(max(256, int(max(r["nvme_read_mb"] for r in rows)) + 1))
EOF
)"
for rw in write read; do
  fio --name=gemini_offload_fio --directory="$nvme" --filename=gemini_offload_fio.dat --rw="$rw" --bs=1M --iodepth=16 \
      --ioengine=io_uring --direct=1 --size="${size_mb}M" --output-format=json >"$TMP/fio-$rw.json" 2>"$TMP/fio-$rw.err" ||
    fail "fio --rw=$rw failed" "$TMP/fio-$rw.err"
done

"$PY" - "$TMP" "$repeat" "$shape" "$T" "$B" "$COMMAND" "$nvme" <<'EOF'
import datetime, json, os, statistics, subprocess, sys
tmp, repeat, shape, T, B, command, nvme = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
med = statistics.median
def run(mode, r):
    d = f"{tmp}/{mode}-{r}"
    summary = json.load(open(f"{d}/summary.json"))
    steps = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if '"update_ms"' in l][3:]   # past the untimed steps
    return summary["tokens_per_s"], med(s["update_ms"] for s in steps), \
        med(s.get("nvme_read_mb", 0) for s in steps), med(s.get("nvme_write_mb", 0) for s in steps), \
        summary["rss_mb"]["peak"][0]
res = {m: [run(m, r) for r in range(1, repeat + 1)] for m in ("none", "nvme")}
tps = {m: med(x[0] for x in res[m]) for m in res}
upd = {m: med(x[1] for x in res[m]) for m in res}
rss = {m: med(x[4] for x in res[m]) for m in res}
read_mb, write_mb = med(x[2] for x in res["nvme"]), med(x[3] for x in res["nvme"])
bw = {rw: json.load(open(f"{tmp}/fio-{rw}.json"))["jobs"][0][rw]["bw_bytes"] / 2**20 for rw in ("read", "write")}
fio_ms = 1e3 * (read_mb / bw["read"] + write_mb / bw["write"])
moved = (read_mb + write_mb) / 1024 / (upd["nvme"] / 1e3)
print(f"gpt2-{shape}  T={T} B={B}  states in memory {tps['none']:.0f} tok/s, peak {rss['none']:.0f} MiB | "
      f"on NVMe {tps['nvme']:.0f} tok/s, peak {rss['nvme']:.0f} MiB | ratio {tps['nvme'] / tps['none']:.2f}x")
print(f"update (norm, clipping, AdamW): in memory {upd['none']:.0f} ms | on NVMe {upd['nvme']:.0f} ms, "
      f"reading {read_mb:.0f} MiB and writing {write_mb:.0f} MiB ({moved:.2f} GiB/s)")
print(f"fio on {nvme} (O_DIRECT, io_uring, 1 MiB, depth 16): read {bw['read']:.0f} MiB/s, write {bw['write']:.0f} MiB/s -> "
      f"the same bytes in {fio_ms:.0f} ms | the update at {fio_ms / upd['nvme']:.2f} of fio")
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown CPU")
disk = subprocess.run(["df", "--output=source,fstype", nvme], capture_output=True, text=True).stdout.split("\n")[1].split()
print(f"machine: {os.cpu_count()} cores, {cpu}, {' '.join(disk)}, {datetime.date.today()}, {command} (median of {repeat})")
EOF
