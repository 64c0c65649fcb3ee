#!/usr/bin/env bash
# quant_decode.sh: decoding speed and memory of weight-quantized checkpoints (`colossal quantize`) against fp32
# and against the memory-bandwidth bound of each, with peers in the same run. One checkpoint (the inference
# benchmarks' GPT-2 124M shape with an 8192-piece vocabulary, or --checkpoint) is quantized to int8 (per channel)
# and int4 (groups of --group-size) into runs/bench/ once; then each round decodes the same prompts greedily at
# each batch with `colossal infer` on fp32, int8 and int4, transformers' generate on fp32
# (scripts/bench/hf_generate.py) and CTranslate2 on int8 weights (scripts/bench/ct2_generate.py, its converter
# run on the same directory), alternating so drift hits all alike; medians over the rounds.
# Decode tokens/s excludes the prefill and loading (colossal's timing line; the peers time the same span). The bound
# of a scheme is this machine's read bandwidth (the best 1 GiB sum of the rounds) over what a step reads: every
# stored weight byte once (integers, scales and the fp32 embedding, which the tied head reads) and each sequence's
# KV cache at its mean length. Memory is the whole process's peak RSS.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/bench/default_checkpoint.sh
COMMAND="scripts/bench/quant_decode.sh"
(($# == 0)) || COMMAND+="$(printf ' %q' "$@")"

batches=1,8 tokens=128 threads="$(nproc)" repeat=3 checkpoint="" group=128 peers=transformers,ctranslate2 timeout_s=900
COLOSSAL=build/colossal PY=.venv/bin/python
while (($#)); do
  case "$1" in
    --batches) batches="${2:?}"; shift 2 ;;
    --tokens) tokens="${2:?}"; shift 2 ;;
    --threads) threads="${2:?}"; shift 2 ;;
    --repeat) repeat="${2:?}"; shift 2 ;;
    --checkpoint) checkpoint="${2:?}"; shift 2 ;;
    --group-size) group="${2:?}"; shift 2 ;;
    --peers) peers="${2:?}"; shift 2 ;;
    --colossal) COLOSSAL="${2:?}"; shift 2 ;;
    --python) PY="${2:?}"; shift 2 ;;
    -h|--help)
      echo "usage: scripts/bench/quant_decode.sh [--batches 1,8] [--tokens 128] [--threads N] [--repeat 3] [--checkpoint DIR]"
      echo "                                     [--group-size 128] [--peers transformers,ctranslate2|none] [--colossal BIN] [--python PY]"
      exit 0 ;;
    *) echo "quant_decode: error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$batches" =~ ^[1-8](,[1-8])*$ ]] || { echo "quant_decode: error: --batches '$batches' must list sizes from 1 to 8, e.g. 1,8" >&2; exit 2; }
for v in tokens threads repeat group; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "quant_decode: error: --${v/group/group-size} '${!v}' is not a positive integer" >&2; exit 2; }
done
((tokens >= 2)) || { echo "quant_decode: error: --tokens must be at least 2 (one decode step)" >&2; exit 2; }
[ -x "$COLOSSAL" ] || { echo "quant_decode: error: $COLOSSAL not found; build it with scripts/build.sh" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "quant_decode: error: /usr/bin/time not found (apt-get install time)" >&2; exit 1; }
need=(sentencepiece)
[[ "$peers" == *transformers* ]] && need+=(transformers)
[[ "$peers" == *ctranslate2* ]] && need+=(ctranslate2 transformers)
for pkg in "${need[@]}"; do
  "$PY" -c "import $pkg" 2>/dev/null && continue
  echo "quant_decode: installing $pkg into $PY's environment" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check "$pkg" >&2 || { echo "quant_decode: error: pip install $pkg failed" >&2; exit 1; }
done

if [ -z "$checkpoint" ]; then ckpt="$(default_checkpoint quant_decode "$COLOSSAL")" || exit 1
else ckpt="$(resolve "$checkpoint")" || { echo "quant_decode: error: --checkpoint $checkpoint: no checkpoint there" >&2; exit 1; }
fi
[ -f "$ckpt/tokenizer.model" ] || { echo "quant_decode: error: $ckpt has no tokenizer.model (a colossal GPT-2 checkpoint is needed)" >&2; exit 1; }
base="runs/bench/quant/$(echo "$ckpt" | tr '/' '_')"
mkdir -p "$base"
for scheme in int8 int4; do
  out="$base/$scheme" flags=(--scheme "$scheme-weight")
  [ "$scheme" = int4 ] && { out+="-g$group"; flags+=(--group-size "$group"); }
  if [ ! -f "$out/model.safetensors" ] || [ "$ckpt/model.safetensors" -nt "$out/model.safetensors" ]; then
    echo "quant_decode: quantizing $ckpt to $out" >&2
    "$COLOSSAL" quantize "$ckpt" --out "$out" "${flags[@]}" --eval-tokens 0 -q >&2
  fi
  declare "dir_$scheme=$out"
done
exec "$PY" scripts/bench/quant_decode.py --colossal "$COLOSSAL" --python "$PY" --fp32 "$ckpt" --int8 "$dir_int8" --int4 "$dir_int4" \
  --ct2-cache "$base/ct2-int8" --batches "$batches" --tokens "$tokens" --threads "$threads" --repeat "$repeat" \
  --timeout "$timeout_s" --peers "$peers" --command "$COMMAND"
