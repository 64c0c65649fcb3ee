#!/usr/bin/env bash
# sequence_length.sh: the longest sequence one training step fits in a per-rank memory budget, with the
# whole sequence on one rank against it split across 4 ranks by sequence parallelism (ring attention, and
# DeepSpeed-Ulysses's all-to-all; split_gather with --modes), one thread per rank, the same GPT (gpt-tiny's
# vocabulary at width 64, learned positions for the longest sequence tried), batch 1. A rank's memory is
# what its process grew by once the model was built (summary.json: peak RSS over the step minus the RSS
# before the model; the libraries' fixed part is the same for every layout and would only blur the ratio),
# the largest over the ranks. The search doubles the sequence until the budget breaks, then bisects in
# steps of the layout's chunk multiple. Prints each layout's longest sequence, its memory there and its
# ratio against one rank (target: at least 3x at 4 ranks).
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMAND="scripts/bench/sequence_length.sh"
(($# == 0)) || COMMAND+="$(printf ' %q' "$@")"

usage() {
  cat <<USAGE
usage: scripts/bench/sequence_length.sh [--budget-mb N] [--ranks N] [--modes LIST] [--start T] [--max T] [--colossal BIN]
  --budget-mb  per-rank memory growth allowed; default 256
  --ranks      sequence-parallel ranks; default 4
  --modes      comma-separated of ring, all_to_all, split_gather; default ring,all_to_all
  --start      the first sequence tried; default 2048
  --max        the longest tried (the model's learned positions); default 131072
USAGE
}
budget=256 ranks=4 modes=ring,all_to_all start=2048 max=131072
COLOSSAL=build/colossal
while (($#)); do
  case "$1" in
    --budget-mb) budget="${2:?}"; shift 2 ;;
    --ranks) ranks="${2:?}"; shift 2 ;;
    --modes) modes="${2:?}"; shift 2 ;;
    --start) start="${2:?}"; shift 2 ;;
    --max) max="${2:?}"; shift 2 ;;
    --colossal) COLOSSAL="${2:?}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "sequence_length: error: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
for n in "$budget" "$ranks" "$start" "$max"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "sequence_length: error: '$n' is not a positive integer" >&2; exit 2; }
done
[ -x "$COLOSSAL" ] || { echo "sequence_length: error: $COLOSSAL not found; build it with scripts/build.sh" >&2; exit 1; }
recipe=recipes/gpt-tiny.toml
dataset="$(sed -n 's/^dataset = "\(.*\)".*/\1/p' "$recipe")"
[ -f "$dataset" ] || "$COLOSSAL" data prepare-recipe "$recipe" >&2
TMP="$(mktemp -d "${TMPDIR:-/tmp}/sequence_length.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=1

# Memory growth in MiB of the largest rank for sequence T under layout $1 ("one" or a mode), or "fail".
grows() {
  local layout="$1" T="$2" out="$TMP/$1-$2" split=()
  [ "$layout" = one ] || split=(--nproc-per-node "$ranks" --set "parallel.sequence=$ranks" --set "parallel.sequence_mode=$layout")
  if ! "$COLOSSAL" train "$recipe" --quiet --set model.n_embd=64 --set "model.block_size=$max" --set "train.seq_len=$T" \
      --set train.batch_size=1 --set train.max_steps=1 --set train.eval_every=0 --set train.eval_batches=1 \
      --set checkpoint.every=0 --set checkpoint.at_end=false --set optim.warmup_steps=1 "${split[@]}" \
      --set "output.dir=$out" >"$out.log" 2>&1; then
    echo fail
    return
  fi
  python3 -c "import json,sys; m=json.load(open(sys.argv[1]))['rss_mb']; print(max(p-b for p,b in zip(m['peak'], m['before_model'])))" \
    "$out/summary.json"
}

fits() { local g; g="$(grows "$1" "$2")"; [ "$g" != fail ] && python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) else 1)" "$g" "$budget"; }

longest() {   # layout -> "T MiB" (T: the longest that fits; 0 if even the start does not)
  local layout="$1" step ok=0 bad=0 T="$start"
  step=$([ "$layout" = ring ] && echo $((2 * ranks * 64)) || echo $((ranks * 64)))
  [ "$layout" = one ] && step=64
  while ((T <= max)); do
    if fits "$layout" "$T"; then ok=$T; T=$((T * 2)); else bad=$T; break; fi
  done
  if ((bad > 0 && ok > 0)); then
    while ((bad - ok > step * 16)); do
      local mid=$(((ok + bad) / 2 / step * step))
      if fits "$layout" "$mid"; then ok=$mid; else bad=$mid; fi
    done
  fi
  echo "$ok $([ "$ok" -gt 0 ] && grows "$layout" "$ok" || echo 0)"
}

read -r one one_mb <<<"$(longest one)"
line="gpt-tiny width 64, B=1, budget $budget MiB/rank | 1 rank: T=$one (${one_mb} MiB)"
IFS=, read -ra list <<<"$modes"
for mode in "${list[@]}"; do
  read -r t mb <<<"$(longest "$mode")"
  capped=$([ "$t" -ge "$max" ] && echo " (the longest tried)" || echo "")
  ratio=$(python3 -c "import sys; a,b=int(sys.argv[1]),int(sys.argv[2]); print(f'{a/b:.2f}x' if b else 'n/a')" "$t" "$one")
  line+=" | $ranks ranks $mode: T=$t$capped (${mb} MiB) $ratio"
done
echo "$line"
echo "machine: $(bash scripts/bench/cpu_line.sh), $(OMP_NUM_THREADS= nproc) cores, $(date +%F), $COMMAND"
