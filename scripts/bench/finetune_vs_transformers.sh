#!/usr/bin/env bash
# finetune_vs_transformers.sh: fine-tuning throughput and peak memory of `colossal finetune` from a Hugging Face
# model directory against transformers' eager loop without Trainer (scripts/bench/hf_finetune.py: forward, cross
# entropy, clip 1.0, torch AdamW) on the same directory, the same data, sequence length, batch and threads, with
# the same torch wheel. The directory is a published shape (vit-small: recipes/vit-fashion.toml's) with random
# weights (scripts/bench/make_hf_dir.py; no hub is reachable here), which times the same. Per shape:
#   opt-125m, bloom-560m  causal LM (AutoModelForCausalLM) on the embedded corpus, tokenized by colossal with the
#                         directory's tokenizer (tests/fixtures' opt-tiny and bloom-tiny)
#   bert-base             masked LM (AutoModelForMaskedLM, BERT-base with bert-tiny's tokenizer) on that corpus:
#                         [CLS] window [SEP] of T tokens, 15% of them scored, 80/10/10 [MASK]/random/kept;
#                         transformers' BertForMaskedLM scores every position, colossal only the chosen ones
#   vit-small             image classification (AutoModelForImageClassification, recipes/vit-fashion.toml's ViT:
#                         7x7 patches, 6 layers, width 128) on Fashion-MNIST, shuffled and normalised alike; a
#                         token is a patch or the class token, 17 per image, and images/s is shown as well
# The two commands alternate in rounds; each row shows medians over the rounds, tokens/s over the steps after the
# warmup ones, and peak memory as the whole process's max RSS (/usr/bin/time).
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMAND="scripts/bench/finetune_vs_transformers.sh"
(($# == 0)) || COMMAND+="$(printf ' %q' "$@")"

usage() {
  cat <<USAGE
usage: scripts/bench/finetune_vs_transformers.sh [--shape opt-125m|bloom-560m|bert-base|vit-small] [--seq N]
                                                [--batch N] [--steps N] [--repeat N] [--python PY] [--colossal BIN]
                                                [--timeout S]
  --shape    the shape, random weights, in runs/bench/hf/SHAPE (made if missing); default opt-125m
  --seq      tokens per sequence, [CLS] and [SEP] included for bert-base; default 256, 128 for bert-base;
             not for vit-small (17 tokens per image)
  --batch    sequences (images) per step; default 4, 128 for vit-small
  --steps    steps each command runs, the first 2 untimed; default 8, 30 for vit-small
  --repeat   alternating rounds, medians taken over them; default 3
  --python   Python with transformers and h5py; default .venv/bin/python
  --colossal the binary; default build/colossal
  --timeout  seconds one command may run; default 1800
USAGE
}

shape=opt-125m T='' B='' S='' repeat=3 timeout_s=1800
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
images=/usr/share/datasets/fashion-mnist
# Per shape: the tokenizer its directory gets, the task, and the defaults of --seq, --batch and --steps.
case "$shape" in
  opt-125m) tokenizer_from=tests/fixtures/opt-tiny task=causal_lm defaults=(256 4 8) ;;
  bloom-560m) tokenizer_from=tests/fixtures/bloom-tiny task=causal_lm defaults=(256 4 8) ;;
  bert-base) tokenizer_from=tests/fixtures/bert-tiny task=masked_lm defaults=(128 4 8) ;;
  vit-small) tokenizer_from='' task=image_classification defaults=(17 128 30) ;;
  *) echo "finetune_vs_transformers: error: --shape '$shape' is not one of opt-125m, bloom-560m, bert-base, vit-small" >&2
     exit 2 ;;
esac
if [ "$task" = image_classification ] && [ -n "$T" ]; then
  echo "finetune_vs_transformers: error: --seq does not apply to --shape $shape (17 tokens per image)" >&2
  exit 2
fi
T="${T:-${defaults[0]}}" B="${B:-${defaults[1]}}" S="${S:-${defaults[2]}}"
for v in "$T" "$B" "$S" "$repeat" "$timeout_s"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "finetune_vs_transformers: error: '$v' is not a positive integer" >&2; exit 2; }
done
((S > 2)) || { echo "finetune_vs_transformers: error: --steps must exceed the 2 untimed warmup steps" >&2; exit 2; }
if [ "$task" = masked_lm ] && ((T < 4)); then
  echo "finetune_vs_transformers: error: --seq $T is too short for masked LM (at least 4: [CLS], two tokens, [SEP])" >&2
  exit 2
fi
[ -x "$COLOSSAL" ] || { echo "finetune_vs_transformers: error: $COLOSSAL not found; build it with scripts/build.sh" >&2; exit 1; }
"$PY" -c 'import transformers, h5py' 2>/dev/null ||
  { echo "finetune_vs_transformers: error: $PY lacks transformers or h5py ($PY -m pip install transformers h5py)" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "finetune_vs_transformers: error: /usr/bin/time not found (apt-get install time)" >&2; exit 1; }
if [ "$task" = image_classification ] && [ ! -f "$images/train-images-idx3-ubyte.gz" ] &&
   [ ! -f "$images/train-images-idx3-ubyte" ]; then
  echo "finetune_vs_transformers: error: $images lacks Fashion-MNIST (scripts/setup.sh installs it)" >&2
  exit 1
fi

model="runs/bench/hf/$shape"
if [ ! -f "$model/config.json" ]; then
  echo "finetune_vs_transformers: making $model (random weights)" >&2
  "$PY" scripts/bench/make_hf_dir.py --shape "$shape" ${tokenizer_from:+--tokenizer-from "$tokenizer_from"} --out "$model"
fi
# The colossal command's recipe and data: any family's directory fine-tunes with opt-125m-finetune.toml (its
# [model] is the directory), building the dataset with the directory's tokenizer on first use; the ViT recipe's
# [model] keys equal vit-small's, which [model] from accepts.
if [ "$task" = image_classification ]; then
  dataset="$images"
  colossal_args=(recipes/vit-fashion.toml --set "data.dataset=$dataset")
  hf_args=(--task "$task" --lr 2e-3)
else
  dataset="runs/bench/hf/$shape-kjv.h5"
  colossal_args=(recipes/opt-125m-finetune.toml --set "data.dataset=$dataset" --set "train.seq_len=$T")
  hf_args=(--task "$task" --seq-len "$T")
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
  run_one colossal "$r" "$COLOSSAL" finetune "${colossal_args[@]}" --set "model.from=$model" \
    --set "train.max_steps=$S" --set "train.batch_size=$B" \
    --set train.eval_every=0 --set train.eval_batches=1 --set checkpoint.every=0 --set optim.warmup_steps=1 \
    --set "output.dir=$TMP/run-$r" --quiet
  cp "$TMP/run-$r/summary.json" "$TMP/colossal-$r.json"
  run_one transformers "$r" "$PY" scripts/bench/hf_finetune.py --model "$model" --dataset "$dataset" "${hf_args[@]}" \
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
# Images: tokens are patches and the class token on both sides (transformers' JSON gives how many per image).
per_image = json.loads((d / "transformers-1.json").read_text()).get("tokens_per_image")
img = (lambda tps: f" {tps / per_image:.0f} img/s") if per_image else (lambda tps: "")
print(f"{shape:<10} T={T} B={B}  colossal {ct:.0f} tok/s{img(ct)} {cr / 1e9:.2f} GB | transformers eager {ht:.0f} tok/s"
      f"{img(ht)} {hr / 1e9:.2f} GB | ratio {ct / ht:.2f}x  mem {cr / hr:.2f}x")
PYEOF
versions="$("$PY" -c 'import importlib.metadata as m; print("torch", m.version("torch") + ", transformers", m.version("transformers"))')"
echo "machine: $(bash scripts/bench/cpu_line.sh), $(nproc) cores, $versions, $(date +%F), $COMMAND, median of $repeat alternating rounds"
