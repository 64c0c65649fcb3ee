#!/usr/bin/env bash
# serve_load.sh: serving under load. A local client streams --requests completions, --concurrency at a time,
# prompts alternating short and long (about 8 and 120 tokens), greedy, --max-tokens each, against:
#   colossal          colossal serve (continuous batching, paged KV cache)
#   colossal-1        the same server taking one sequence at a time (--max-running 1)
#   colossal-fp16kv   colossal serve with its KV blocks in fp16 (--kv-cache fp16; not in the default sides)
#   colossal-int8kv   the same with int8 blocks (--kv-cache int8: a scale per position and head; not in the default sides)
#   transformers      `transformers serve` on the same directory (its default)
#   transformers-cb   `transformers serve --continuous-batching` (its paged-attention batching)
# each started fresh, warmed with one request, loaded, and stopped, in rounds. Prints generated tokens/s
# (completion tokens from the streams' usage over the wall time), time to first token and the time between
# consecutive chunks (percentiles over every request), and colossal's throughput ratio to each; for colossal's
# sides, the sequences preempted for lack of KV blocks (its /metrics). --kv-memory-gb sets their KV memory, so
# that a cache kind's capacity (fp32, fp16, int8 blocks) shows as preemptions and their recomputation.
# The model is a Hugging Face directory both read (default: opt-125m's shape with random weights, made by
# scripts/bench/make_hf_dir.py; random weights decode at the same speed).
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMAND="scripts/bench/serve_load.sh"
(($# == 0)) || COMMAND+="$(printf ' %q' "$@")"
requests=32 concurrency=16 max_tokens=64 threads="$(nproc)" repeat=1 port=18731 model="" sides=colossal,colossal-1,transformers,transformers-cb
device=cpu kv_memory=()
COLOSSAL=build/colossal PY=.venv/bin/python
while (($#)); do
  case "$1" in
    --requests) requests="${2:?}"; shift 2 ;;
    --concurrency) concurrency="${2:?}"; shift 2 ;;
    --max-tokens) max_tokens="${2:?}"; shift 2 ;;
    --threads) threads="${2:?}"; shift 2 ;;
    --repeat) repeat="${2:?}"; shift 2 ;;
    --port) port="${2:?}"; shift 2 ;;
    --device) device="${2:?}"; shift 2 ;;
    --kv-memory-gb) kv_memory=(--kv-memory-gb "${2:?}"); shift 2 ;;
    --model) model="${2:?}"; shift 2 ;;
    --sides) sides="${2:?}"; shift 2 ;;
    --colossal) COLOSSAL="${2:?}"; shift 2 ;;
    --python) PY="${2:?}"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
      echo "usage: scripts/bench/serve_load.sh [--requests 32] [--concurrency 16] [--max-tokens 64] [--repeat 1] [--model DIR]"
      echo "                                   [--sides colossal,colossal-1,colossal-fp16kv,colossal-int8kv,transformers,transformers-cb] [--port N]"
      echo "                                   [--device cpu|cuda] [--kv-memory-gb G (colossal's sides)]"; exit 0 ;;
    *) echo "serve_load: error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for v in requests concurrency max_tokens threads repeat port; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "serve_load: error: --${v//_/-} '${!v}' is not a positive integer" >&2; exit 2; }
done
side_re="colossal|colossal-1|colossal-fp16kv|colossal-int8kv|transformers|transformers-cb"
[[ "$sides" =~ ^($side_re)(,($side_re))*$ ]] ||
  { echo "serve_load: error: --sides '$sides' must list colossal, colossal-1, colossal-fp16kv, colossal-int8kv, transformers, transformers-cb" >&2; exit 2; }
[[ "$device" =~ ^(cpu|cuda)$ ]] || { echo "serve_load: error: --device '$device' is not cpu or cuda" >&2; exit 2; }
[ -x "$COLOSSAL" ] || { echo "serve_load: error: $COLOSSAL not found; build it with scripts/build.sh" >&2; exit 1; }
if [[ "$sides" == *transformers* ]] && ! "$PY" -c 'import fastapi, uvicorn, transformers' 2>/dev/null; then
  echo "serve_load: installing transformers[serving] into $PY's environment" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check "transformers[serving]" >&2 ||
    { echo "serve_load: error: pip install transformers[serving] failed" >&2; exit 1; }
fi
if [ -z "$model" ]; then
  model=runs/bench/hf/opt-125m
  [ -f "$model/model.safetensors" ] ||
    "$PY" scripts/bench/make_hf_dir.py --shape opt-125m --tokenizer-from tests/fixtures/opt-tiny --out "$model"
fi
LOGS="$(mktemp -d "${TMPDIR:-/tmp}/serve_load.XXXXXX")"
echo "serve_load: server logs in $LOGS" >&2
exec "$PY" scripts/bench/serve_load.py --colossal "$COLOSSAL" --python "$PY" --model "$model" --sides "$sides" --command "$COMMAND" \
  --logs "$LOGS" --requests "$requests" --concurrency "$concurrency" --max-tokens "$max_tokens" --threads "$threads" \
  --repeat "$repeat" --port "$port" --device "$device" "${kv_memory[@]}"
