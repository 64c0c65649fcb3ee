# gemini_runs.sh: sourced by the Gemini training benchmarks (gemini_offload.sh, gemini_placement.sh), which
# run the same shapes so their figures compare: tiny (recipes/gpt-tiny.toml, T=128, B=16) or a GPT-2
# shape (T=256, B=2), some rounds of some steps each, the first 3 untimed.
#   gemini_run_shape NAME   from $shape, $repeat and $steps: sets recipe, T and B, or exits 2 with
#                           NAME's error naming the flag
gemini_run_shape() {
  local name=$1
  case "$shape" in
    tiny) recipe=recipes/gpt-tiny.toml T=128 B=16 ;;
    124m|350m|774m) recipe="recipes/gpt2-$shape.toml" T=256 B=2 ;;
    *) echo "$name: error: --shape '$shape' is not tiny, 124m, 350m or 774m" >&2; exit 2 ;;
  esac
  [[ "$repeat" =~ ^[1-9][0-9]*$ ]] || { echo "$name: error: --repeat '$repeat' is not a positive integer" >&2; exit 2; }
  [[ "$steps" =~ ^[0-9]+$ ]] && ((steps >= 4)) || { echo "$name: error: --steps '$steps' must be at least 4" >&2; exit 2; }
}
