#!/usr/bin/env bash
# quant_decode.sh: decoding speed and memory of weight-quantized checkpoints (`colossal quantize`) against fp32
# and against the memory-bandwidth bound of each, with peers in the same run. One checkpoint (the inference
# benchmarks' GPT-2 124M shape with an 8192-piece vocabulary, or --checkpoint) is quantized to int8 (per channel)
# and int4 (groups of --group-size) into runs/bench/ once; then each round decodes the same prompts greedily at
# each batch with `colossal infer` on fp32, int8 and int4, transformers' generate on fp32
# (scripts/bench/hf_generate.py) and CTranslate2 on int8 weights (scripts/bench/ct2_generate.py, its converter
# run on the same directory), alternating so drift hits all alike; medians over the rounds.
# Decode tokens/s excludes the prefill and loading (colossal's timing line; the peers time the same span). The bound
# of a scheme is this machine's read bandwidth (the best 1 GiB sum or matrix-vector product of the rounds) over what a step reads: every
# stored weight byte once (integers, scales and the fp32 embedding, which the tied head reads) and each sequence's
# KV cache at its mean length. Where a scheme's weights fit a cache (a sum at their own size runs 1.2x faster than
# the 1 GiB one), its cell also gives the bound at that faster rate: quantized weights in a large L3 stream from
# there, and the memory bound alone would put one sequence past 1. Memory is the whole process's peak RSS.
# --device cuda decodes on the GPU (colossal infer --device cuda, transformers with the model and inputs there;
# CTranslate2 is not a peer there), the bound's bandwidth is the GPU's (a 1 GiB sum on it), memory is still the host
# process's RSS, and the checkpoints are still trained and quantized on the CPU. --layers L --width W: another GPT
# shape (default_checkpoint.sh), trained once. --schemes picks the colossal sides; int8-smoothquant (W8A8, its
# smoothing vectors counted among the weights read) is a fourth, quantized like the others. --kv-cache K[,K...]
# (fp16, bf16, int8) measures each scheme again with its KV cache so (colossal infer --kv-cache), against its bound
# with the cache's bytes cut to match (half; int8 rows of D values and a 4-byte scale, (D + 4) / 4D), with the ratio
# to the same scheme's fp32 cache in the same round.
# --prefill N measures the prompt instead: each of the batch's prompts is about N tokens of the embedded corpus
# (data/kjv/kjv.txt), one new token is generated, and the cells are prefill tokens/s (colossal's timing line; the
# transformers peer's forward to the first logits), with each quantized scheme's ratio to fp32. --isa S[,S...]
# runs each quantized scheme again with colossal's kernels capped to those sets (COLOSSAL_CPU_ISA), with the
# uncapped run's ratio over each: e.g. --isa avx512vnni on a CPU with AMX shows what the tiles give the prompt GEMM.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/bench/default_checkpoint.sh
COMMAND="scripts/bench/quant_decode.sh"
(($# == 0)) || COMMAND+="$(printf ' %q' "$@")"

batches=1,8 tokens=128 threads="$(nproc)" repeat=3 checkpoint="" group=128 peers="" timeout_s=900
device=cpu layers="" width="" schemes=fp32,int8,int4 op_by_op=() kv_cache=() prefill=() isa=()
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
    --device) device="${2:?}"; shift 2 ;;
    --layers) layers="${2:?}"; shift 2 ;;
    --width) width="${2:?}"; shift 2 ;;
    --schemes) schemes="${2:?}"; shift 2 ;;
    --op-by-op) op_by_op=(--op-by-op); shift ;;
    --kv-cache) kv_cache=(--kv-cache "${2:?}"); shift 2 ;;
    --prefill) prefill=(--prefill "${2:?}"); shift 2 ;;
    --isa) isa=(--isa "${2:?}"); shift 2 ;;
    --colossal) COLOSSAL="${2:?}"; shift 2 ;;
    --python) PY="${2:?}"; shift 2 ;;
    -h|--help)
      echo "usage: scripts/bench/quant_decode.sh [--batches 1,8] [--tokens 128] [--threads N] [--repeat 3] [--checkpoint DIR]"
      echo "                                     [--group-size 128] [--peers transformers,ctranslate2|none] [--colossal BIN] [--python PY]"
      echo "                                     [--device cpu|cuda] [--layers L --width W] [--schemes fp32,int8,int4[,int8-smoothquant]]"
      echo "                                     [--op-by-op] [--kv-cache fp16,bf16,int8] [--prefill N [--isa avx512vnni,...]]"
      echo "  --peers defaults to transformers,ctranslate2 on cpu and transformers on cuda"
      echo "  --op-by-op (cuda): each scheme also without CUDA graphs (colossal infer --no-cuda-graphs), with the graphs' ratio"
      echo "  --kv-cache: each scheme also with its KV cache in each listed kind (colossal infer --kv-cache), with the ratio to the fp32 cache"
      echo "  --prefill N: prompts of about N tokens, prefill tokens/s instead of decoding's; --isa: quantized schemes again under those caps"
      exit 0 ;;
    *) echo "quant_decode: error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$batches" =~ ^[1-8](,[1-8])*$ ]] || { echo "quant_decode: error: --batches '$batches' must list sizes from 1 to 8, e.g. 1,8" >&2; exit 2; }
for v in tokens threads repeat group; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "quant_decode: error: --${v/group/group-size} '${!v}' is not a positive integer" >&2; exit 2; }
done
((tokens >= 2)) || { echo "quant_decode: error: --tokens must be at least 2 (one decode step)" >&2; exit 2; }
case "$device" in
  cpu) if ((${#prefill[@]})); then peers="${peers:-transformers}"; else peers="${peers:-transformers,ctranslate2}"; fi ;;
  cuda) peers="${peers:-transformers}"
        [[ "$peers" != *ctranslate2* ]] || { echo "quant_decode: error: --peers ctranslate2 runs on the CPU only; with --device cuda use --peers transformers or none" >&2; exit 2; } ;;
  *) echo "quant_decode: error: --device '$device' is not cpu or cuda" >&2; exit 2 ;;
esac
[ "$device" = cuda ] || ((${#op_by_op[@]} == 0)) ||
  { echo "quant_decode: error: --op-by-op compares CUDA graphs, so it needs --device cuda" >&2; exit 2; }
((${#kv_cache[@]} == 0)) || [[ "${kv_cache[1]}" =~ ^(fp16|bf16|int8)(,(fp16|bf16|int8))*$ ]] ||
  { echo "quant_decode: error: --kv-cache '${kv_cache[1]}' is not a list of fp16, bf16 and int8 (the fp32 cache is always measured)" >&2; exit 2; }
if ((${#prefill[@]})); then
  [[ "${prefill[1]}" =~ ^[1-9][0-9]*$ ]] || { echo "quant_decode: error: --prefill '${prefill[1]}' is not a positive number of tokens" >&2; exit 2; }
  [[ "$peers" != *ctranslate2* ]] || { echo "quant_decode: error: --prefill times transformers only; give --peers transformers or none" >&2; exit 2; }
  ((${#kv_cache[@]} == 0 && ${#op_by_op[@]} == 0)) || { echo "quant_decode: error: --prefill does not combine with --kv-cache or --op-by-op (decoding's)" >&2; exit 2; }
fi
((${#isa[@]} == 0)) || ((${#prefill[@]})) || { echo "quant_decode: error: --isa compares prefills; give --prefill N too" >&2; exit 2; }
((${#isa[@]} == 0)) || [[ "${isa[1]}" =~ ^(baseline|avx2|avx512|avx512vnni|amx)(,(baseline|avx2|avx512|avx512vnni|amx))*$ ]] ||
  { echo "quant_decode: error: --isa '${isa[1]}' is not a list of baseline, avx2, avx512, avx512vnni and amx" >&2; exit 2; }
[[ "$peers" =~ ^(none|(transformers|ctranslate2)(,(transformers|ctranslate2))*)$ ]] ||
  { echo "quant_decode: error: --peers '$peers' must list transformers and/or ctranslate2, or be none" >&2; exit 2; }
IFS=, read -r -a scheme_list <<<"$schemes"
for s in "${scheme_list[@]}"; do
  case "$s" in fp32|int8|int4|int8-smoothquant) ;;
    *) echo "quant_decode: error: --schemes '$schemes': '$s' is not fp32, int8, int4 or int8-smoothquant" >&2; exit 2 ;; esac
done
[[ ",$schemes," == *,fp32,* ]] || { echo "quant_decode: error: --schemes '$schemes' must include fp32 (the reference of the ratios)" >&2; exit 2; }
if [ -n "$layers$width" ]; then
  [ -n "$layers" ] && [ -n "$width" ] || { echo "quant_decode: error: --layers and --width go together (e.g. --layers 24 --width 1024)" >&2; exit 2; }
  [ -z "$checkpoint" ] || { echo "quant_decode: error: --layers/--width make their own checkpoint; drop them or --checkpoint" >&2; exit 2; }
  [[ "$layers" =~ ^[1-9][0-9]*$ ]] || { echo "quant_decode: error: --layers '$layers' is not a positive integer" >&2; exit 2; }
  [[ "$width" =~ ^[1-9][0-9]*$ ]] && ((width % 64 == 0)) ||
    { echo "quant_decode: error: --width '$width' is not a positive multiple of 64 (heads of 64)" >&2; exit 2; }
fi
[ -x "$COLOSSAL" ] || { echo "quant_decode: error: $COLOSSAL not found; build it with scripts/build.sh" >&2; exit 1; }
PY="$(command -v "$PY")" || { echo "quant_decode: error: --python: no such program" >&2; exit 1; }   # a path: the runs get a bare PATH
[ -x /usr/bin/time ] || { echo "quant_decode: error: /usr/bin/time not found (apt-get install time)" >&2; exit 1; }
need=(sentencepiece)
[[ "$peers" == *transformers* ]] && need+=(transformers)
[[ "$peers" == *ctranslate2* ]] && need+=(ctranslate2 transformers)
for pkg in "${need[@]}"; do
  "$PY" -c "import $pkg" 2>/dev/null && continue
  echo "quant_decode: installing $pkg into $PY's environment" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check "$pkg" >&2 || { echo "quant_decode: error: pip install $pkg failed" >&2; exit 1; }
done

if [ -z "$checkpoint" ]; then ckpt="$(default_checkpoint quant_decode "$COLOSSAL" ${layers:+"$layers" "$width"})" || exit 1
else ckpt="$(resolve "$checkpoint")" || { echo "quant_decode: error: --checkpoint $checkpoint: no checkpoint there" >&2; exit 1; }
fi
[ -f "$ckpt/tokenizer.model" ] || { echo "quant_decode: error: $ckpt has no tokenizer.model (a colossal GPT-2 checkpoint is needed)" >&2; exit 1; }
base="runs/bench/quant/$(echo "$ckpt" | tr '/' '_')"
mkdir -p "$base"
quantized=()
for scheme in int8 int4 int8-smoothquant; do
  [[ ",$schemes," == *",$scheme,"* ]] || continue
  case "$scheme" in
    int8) out="$base/int8" flags=(--scheme int8-weight) ;;
    int4) out="$base/int4-g$group" flags=(--scheme int4-weight --group-size "$group") ;;
    int8-smoothquant) out="$base/int8-smoothquant" flags=(--scheme int8-smoothquant) ;;   # calibrated on kjv.txt's start
  esac
  if [ ! -f "$out/model.safetensors" ] || [ "$ckpt/model.safetensors" -nt "$out/model.safetensors" ]; then
    echo "quant_decode: quantizing $ckpt to $out" >&2
    "$COLOSSAL" quantize "$ckpt" --out "$out" "${flags[@]}" --eval-tokens 0 -q >&2
  fi
  quantized+=("--$scheme" "$out")
done
exec "$PY" scripts/bench/quant_decode.py --colossal "$COLOSSAL" --python "$PY" --fp32 "$ckpt" "${quantized[@]}" \
  --ct2-cache "$base/ct2-int8" --batches "$batches" --tokens "$tokens" --threads "$threads" --repeat "$repeat" \
  --timeout "$timeout_s" --peers "$peers" --device "$device" "${op_by_op[@]}" "${kv_cache[@]}" "${prefill[@]}" "${isa[@]}" --command "$COMMAND"
