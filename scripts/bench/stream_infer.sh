#!/usr/bin/env bash
# stream_infer.sh: generation with the blocks' weights kept on disk. `colossal infer --stream-weights`
# (each block read as it runs, the next one on an I/O thread meanwhile), both in place from the
# checkpoint's model.safetensors (--stream-source checkpoint, our GPT-2 layout) and through its cache
# file (--stream-source cache), against transformers with accelerate's disk offload (every block on the
# disk, loaded as it runs: scripts/bench/hf_generate.py --offload-folder), on the same checkpoint, prompts,
# greedy tokens and threads; colossal with the model in memory as the reference. Alternating rounds,
# medians: decode tokens/s, peak RSS and the whole process's seconds (/usr/bin/time: loading, the cache's
# writing where there is one, the prefill and the decode), and whether the texts agree.
# Both sides read through the page cache, so on a model smaller than memory the reads come from RAM
# after the first token: this measures what streaming costs the compute, not the disk. --budget-gb runs
# both inside a memory cgroup smaller than the model (colossal in memory, the texts' reference, runs
# outside it): a model larger than the memory it has, whose blocks come from the disk on every token.
# --layers and --width make a larger default checkpoint (scripts/bench/default_checkpoint.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMAND="scripts/bench/stream_infer.sh"
(($# == 0)) || COMMAND+="$(printf ' %q' "$@")"

usage() {
  cat <<EOF
usage: scripts/bench/stream_infer.sh --hf-python PY [--checkpoint DIR | --layers L --width C] [--budget-gb G] [--tokens N]
                                     [--threads N] [--repeat N] [--colossal BIN]
  --hf-python   a Python with torch, transformers, accelerate and sentencepiece (the peer)
  --checkpoint  a colossal GPT-2 checkpoint; default the one scripts/bench/infer_vs_transformers.sh trains
  --layers, --width  a default checkpoint of this depth and width instead (made once, one SGD step)
  --budget-gb   the streamed runs in a memory cgroup of G GiB (needs root)
  --tokens      new tokens per prompt; default 16
  --sides       which colossal runs, of memory,stream,cache (default all; a model larger than this machine's
                memory cannot run in memory, and the cache needs a second copy of it on the disk)
  --cold        drop the page cache before each streamed run (needs root; implied by --budget-gb): with a model
                larger than the machine's memory, what the run before left cached must not serve the next
EOF
}
sides=memory,stream,cache cold=0 CKPT="" tokens=16 threads="$(nproc)" repeat=3 COLOSSAL=build/colossal HF_PY="" budget="" layers="" width=""
while (($#)); do
  case "$1" in
    --hf-python) HF_PY="${2:?}"; shift 2 ;;
    --checkpoint) CKPT="${2:?}"; shift 2 ;;
    --budget-gb) budget="${2:?}"; shift 2 ;;
    --layers) layers="${2:?}"; shift 2 ;;
    --width) width="${2:?}"; shift 2 ;;
    --tokens) tokens="${2:?}"; shift 2 ;;
    --sides) sides="${2:?}"; shift 2 ;;
    --cold) cold=1; shift ;;
    --threads) threads="${2:?}"; shift 2 ;;
    --repeat) repeat="${2:?}"; shift 2 ;;
    --colossal) COLOSSAL="${2:?}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "stream_infer: error: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[ -n "$HF_PY" ] || { echo "stream_infer: error: --hf-python is required (a Python with transformers and accelerate)" >&2; exit 2; }
"$HF_PY" -c 'import transformers, accelerate, sentencepiece' 2>/dev/null ||
  { echo "stream_infer: error: $HF_PY cannot import transformers, accelerate and sentencepiece" >&2; exit 1; }
[ -x "$COLOSSAL" ] || { echo "stream_infer: error: $COLOSSAL not found; build it with scripts/build.sh" >&2; exit 1; }
[[ "$sides" =~ ^(memory|stream|cache)(,(memory|stream|cache))*$ ]] ||
  { echo "stream_infer: error: --sides '$sides' must list memory, stream and/or cache" >&2; exit 2; }
[ -z "$budget" ] || [[ "$budget" =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "stream_infer: error: --budget-gb '$budget' is not a number" >&2; exit 2; }
[ -z "$layers$width" ] || { [[ "$layers" =~ ^[1-9][0-9]*$ ]] && [[ "$width" =~ ^[1-9][0-9]*$ ]] && ((width % 64 == 0)); } ||
  { echo "stream_infer: error: --layers and --width go together (whole numbers, the width a multiple of 64)" >&2; exit 2; }
source scripts/bench/default_checkpoint.sh   # the checkpoint infer_vs_transformers.sh uses too
if [ -z "$CKPT" ]; then
  CKPT="$(default_checkpoint stream_infer "$COLOSSAL" $layers $width)" || exit 1
else
  CKPT="$(resolve "$CKPT")" || { echo "stream_infer: error: --checkpoint: no model.safetensors, latest or checkpoints/latest in it" >&2; exit 1; }
fi
TMP="$(mktemp -d "${TMPDIR:-/tmp}/stream_infer.XXXXXX")"
CG=""
if [ -n "$budget" ]; then
  . scripts/bench/memory_cgroup.sh
  memory_cgroup colossal_stream_infer "$(awk -v g="$budget" 'BEGIN { printf "%d", g * 1073741824 }')"
fi
trap 'rm -rf "$TMP"; [ -z "$CG" ] || memory_cgroup_remove' EXIT
# in_budget CMD...: runs CMD inside the cgroup when there is one, after dropping the page cache (also without
# one under --cold): pages another run read (the in-memory reference reads the whole checkpoint) belong to no
# budget and would serve a memory-mapped reader at memory speed.
in_budget() {
  if [ -z "$CG" ] && ((!cold)); then "$@"; return; fi
  sync
  echo 3 >/proc/sys/vm/drop_caches
  if [ -z "$CG" ]; then "$@"; return; fi
  (echo $BASHPID >"$CG/cgroup.procs"; exec "$@")
}
printf 'In the beginning God created\n' >"$TMP/prompts.txt"
fail() { echo "stream_infer: error: $1; its output ends:" >&2; tail -n 20 "$2" >&2; exit 1; }
for ((r = 1; r <= repeat; r++)); do
  echo "stream_infer: round $r/$repeat" >&2
  IFS=, read -r -a modes <<<"$sides"
  for mode in "${modes[@]}"; do
    flag=() run=()
    case "$mode" in
      stream) flag=(--stream-weights --stream-source checkpoint) run=(in_budget) ;;
      cache) flag=(--stream-weights --stream-source cache --stream-cache "${STREAM_CACHE:-/var/tmp}") run=(in_budget) ;;
    esac
    "${run[@]}" env OMP_NUM_THREADS="$threads" /usr/bin/time -f 'maxrss %M elapsed %e' "$COLOSSAL" infer "$CKPT" --prompts "$TMP/prompts.txt" -n "$tokens" \
      --greedy --jsonl "${flag[@]}" >"$TMP/$mode-$r.out" 2>"$TMP/$mode-$r.err" || fail "colossal infer ($mode) failed" "$TMP/$mode-$r.err"
  done
  rm -rf "$TMP/offload"
  in_budget /usr/bin/time -f 'maxrss %M elapsed %e' "$HF_PY" scripts/bench/hf_generate.py --checkpoint "$CKPT" --prompts "$TMP/prompts.txt" \
    --tokens "$tokens" --threads "$threads" --offload-folder "$TMP/offload" >"$TMP/hf-$r.out" 2>"$TMP/hf-$r.err" ||
    fail "transformers with disk offload failed" "$TMP/hf-$r.err"
done

"$HF_PY" - "$TMP" "$repeat" "$CKPT" "$tokens" "$threads" "$COMMAND" "$budget" "$sides" <<'EOF'
import datetime, json, os, re, statistics, sys
tmp, repeat, ckpt, tokens, threads, command, budget, sides = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
med = statistics.median
def rss(f): return int(re.search(r"maxrss (\d+)", open(f).read()).group(1)) / 1024
def ours(mode, r):
    err = open(f"{tmp}/{mode}-{r}.err").read()
    m = re.search(r"decode (\d+) steps x (\d+) sequences in ([\d.]+) s", err)
    text = json.loads(open(f"{tmp}/{mode}-{r}.out").read().splitlines()[0])["completion"]
    return int(m.group(1)) * int(m.group(2)) / float(m.group(3)), rss(f"{tmp}/{mode}-{r}.err"), text, wall(f"{tmp}/{mode}-{r}.err")
def wall(f): return float(re.search(r"elapsed ([\d.]+)", open(f).read()).group(1))
def hf(r):
    j = json.loads(open(f"{tmp}/hf-{r}.out").read().strip().splitlines()[-1])
    return j["decode_steps"] * j["batch"] / j["decode_s"], rss(f"{tmp}/hf-{r}.err"), j["texts"][0], wall(f"{tmp}/hf-{r}.err")
names = {"memory": "colossal, weights in memory", "stream": "colossal --stream-weights, in place",
         "cache": "colossal --stream-weights, via cache"}
rows = {names[m]: [ours(m, r) for r in range(1, repeat + 1)] for m in sides.split(",")}
rows["transformers + accelerate disk offload"] = [hf(r) for r in range(1, repeat + 1)]
ref_name = next(iter(rows))   # the texts' reference: the first side run
ref_text = rows[ref_name][0][2]
stream_tps = med(x[0] for x in rows.get(names["stream"], rows[ref_name]))
against = "in place" if "stream" in sides.split(",") else ref_name
weights = sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt)
              if f == "model.safetensors" or re.fullmatch(r"model-\d+-of-\d+\.safetensors", f)) / 2**30
limit = f", the streamed runs in a memory cgroup of {budget} GiB" if budget else ""
print(f"checkpoint {ckpt} ({weights:.2f} GiB of weights), greedy, {tokens} new tokens, batch 1, {threads} threads{limit}; "
      f"texts against {ref_name}")
for name, xs in rows.items():
    tps, peak = med(x[0] for x in xs), med(x[1] for x in xs)
    same = all(x[2] == ref_text for x in xs)
    secs = med(x[3] for x in xs)
    print(f"  {name:40s} {tps:7.3g} tok/s  peak {peak:6.0f} MiB  process {secs:6.1f} s  {against} vs it {stream_tps / tps:5.2f}x  "
          f"text {'same' if same else 'DIFFERS'}")
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown CPU")
print(f"machine: {os.cpu_count()} cores, {cpu}, {datetime.date.today()}, {command} (median of {repeat})")
EOF
