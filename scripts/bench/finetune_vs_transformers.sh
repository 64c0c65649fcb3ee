#!/usr/bin/env bash
# finetune_vs_transformers.sh: fine-tuning throughput and peak memory of `colossal finetune` from a Hugging Face
# model directory against transformers' eager loop without Trainer (scripts/bench/hf_finetune.py:
# AutoModelForCausalLM, cross entropy, clip 1.0, torch AdamW) on the same directory, the same dataset (built by
# colossal with the directory's tokenizer), sequence length, batch and threads, with the same torch wheel. The
# directory is a published shape with random weights (scripts/bench/make_hf_dir.py; no hub is reachable here),
# which times the same. The two commands alternate in rounds; each row shows medians over the rounds, tokens/s
# over the steps after the warmup ones, and peak memory as the whole process's max RSS (/usr/bin/time).
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMAND="scripts/bench/finetune_vs_transformers.sh"
(($# == 0)) || COMMAND+="$(printf ' %q' "$@")"

usage() {
  cat <<USAGE
usage: scripts/bench/finetune_vs_transformers.sh [--shape opt-125m|bloom-560m] [--seq N] [--batch N] [--steps N]
                                                [--repeat N] [--python PY] [--colossal BIN] [--timeout S]
  --shape    the published shape, random weights, in runs/bench/hf/SHAPE (made if missing); default opt-125m
  --seq      tokens per sequence; default 256
  --batch    sequences per step; default 4
  --steps    steps each command runs, the first 2 untimed; default 8
  --repeat   alternating rounds, medians taken over them; default 3
  --python   Python with transformers and h5py; default .venv/bin/python
  --colossal the binary; default build/colossal
  --timeout  seconds one command may run; default 1800
USAGE
}

shape=opt-125m T=256 B=4 S=8 repeat=3 timeout_s=1800
COLOSSAL=build/colossal
PY=.venv/bin/python
while (($#)); do
  case "$1" in
    --shape) shape="${2:?}"; shift 2 ;;
    --seq) T="${2:?}"; shift 2 ;;
    --batch) B="${2:?}"; shift 2 ;;
    --steps) S="${2:?}"; shift 2 ;;
    --repeat) repeat="${2:?}"; shift 2 ;;
    --python) PY="${2:?}"; shift 2 ;;
    --colossal) COLOSSAL="${2:?}"; shift 2 ;;
    --timeout) timeout_s="${2:?}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "finetune_vs_transformers: error: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
case "$shape" in
  opt-125m) tokenizer_from=tests/fixtures/opt-tiny ;;
  bloom-560m) tokenizer_from=tests/fixtures/bloom-tiny ;;
  *) echo "finetune_vs_transformers: error: --shape '$shape' is not one of opt-125m, bloom-560m" >&2; exit 2 ;;
esac
for v in "$T" "$B" "$S" "$repeat" "$timeout_s"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "finetune_vs_transformers: error: '$v' is not a positive integer" >&2; exit 2; }
done
((S > 2)) || { echo "finetune_vs_transformers: error: --steps must exceed the 2 untimed warmup steps" >&2; exit 2; }
[ -x "$COLOSSAL" ] || { echo "finetune_vs_transformers: error: $COLOSSAL not found; build it with scripts/build.sh" >&2; exit 1; }
"$PY" -c 'import transformers, h5py' 2>/dev/null ||
  { echo "finetune_vs_transformers: error: $PY lacks transformers or h5py ($PY -m pip install transformers h5py)" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "finetune_vs_transformers: error: /usr/bin/time not found (apt-get install time)" >&2; exit 1; }

model="runs/bench/hf/$shape"
dataset="runs/bench/hf/$shape-kjv.h5"
if [ ! -f "$model/config.json" ]; then
  echo "finetune_vs_transformers: making $model (random weights)" >&2
  "$PY" scripts/bench/make_hf_dir.py --shape "$shape" --tokenizer-from "$tokenizer_from" --out "$model"
fi
TMP="$(mktemp -d "${TMPDIR:-/tmp}/finetune_vs_transformers.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

# run_one NAME ROUND CMD...: CMD under /usr/bin/time and a timeout; stdout, stderr and max RSS (KB) kept.
run_one() {
  local name="$1" out="$TMP/$1-$2" rc=0
  shift 2
  /usr/bin/time -f '%M' -o "$out.rss" timeout --kill-after=30 "$timeout_s" "$@" >"$out.out" 2>"$out.err" || rc=$?
  if ((rc != 0)); then
    echo "finetune_vs_transformers: error: $name failed (exit $rc); its stderr ends:" >&2
    tail -n 15 "$out.err" >&2
    exit 1
  fi
}

for ((r = 1; r <= repeat; r++)); do
  echo "finetune_vs_transformers: $shape round $r/$repeat" >&2
  run_one colossal "$r" "$COLOSSAL" finetune recipes/opt-125m-finetune.toml --set "model.from=$model" \
    --set "data.dataset=$dataset" --set "train.max_steps=$S" --set "train.seq_len=$T" --set "train.batch_size=$B" \
    --set train.eval_every=0 --set train.eval_batches=1 --set checkpoint.every=0 --set optim.warmup_steps=1 \
    --set "output.dir=$TMP/run-$r" --quiet
  cp "$TMP/run-$r/summary.json" "$TMP/colossal-$r.json"
  run_one transformers "$r" "$PY" scripts/bench/hf_finetune.py --model "$model" --dataset "$dataset" --seq-len "$T" \
    --batch "$B" --steps "$S"
  grep '^{' "$TMP/transformers-$r.out" | tail -n 1 >"$TMP/transformers-$r.json"
done

"$PY" - "$TMP" "$shape" "$T" "$B" "$repeat" <<'PYEOF'
import json, statistics, sys
from pathlib import Path
d, shape, T, B, repeat = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
def medians(side):
    tps = [float(json.loads((d / f"{side}-{r}.json").read_text())["tokens_per_s"]) for r in range(1, repeat + 1)]
    rss = [int((d / f"{side}-{r}.rss").read_text().split()[-1]) * 1024 for r in range(1, repeat + 1)]
    return statistics.median(tps), statistics.median(rss)
(ct, cr), (ht, hr) = medians("colossal"), medians("transformers")
print(f"{shape:<10} T={T} B={B}  colossal {ct:.0f} tok/s {cr / 1e9:.2f} GB | transformers eager {ht:.0f} tok/s "
      f"{hr / 1e9:.2f} GB | ratio {ct / ht:.2f}x  mem {cr / hr:.2f}x")
PYEOF
versions="$("$PY" -c 'import importlib.metadata as m; print("torch", m.version("torch") + ", transformers", m.version("transformers"))')"
echo "machine: $(bash scripts/bench/cpu_line.sh), $(nproc) cores, $versions, $(date +%F), $COMMAND, median of $repeat alternating rounds"
