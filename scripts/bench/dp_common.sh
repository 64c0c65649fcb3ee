# dp_common.sh: what the data-parallel benchmarks (ddp_vs_torch.sh, zero_vs_torch.sh) share, sourced after
# each has read its options. Expects NAME (the script's name for messages), recipe, T, B, S, repeat,
# COLOSSAL and PY; checks them and the tools, reads the recipe's GPT shape, builds its dataset if missing,
# and sets TORCHRUN, dataset, TMP (removed on exit), peer_args (scripts/bench/gpt_ref.py with the same
# shape, batch and steps, one thread) and fail(). Workers run with one thread each.
[[ "$repeat" =~ ^[1-9][0-9]*$ ]] || { echo "$NAME: error: --repeat '$repeat' is not a positive integer" >&2; exit 2; }
{ [[ "$S" =~ ^[0-9]+$ ]] && ((S > 3)); } || { echo "$NAME: error: --steps '$S' must exceed the 3 untimed steps" >&2; exit 2; }
[ -x "$COLOSSAL" ] || { echo "$NAME: error: $COLOSSAL not found; build it with scripts/build.sh" >&2; exit 1; }
"$PY" -c 'import torch, h5py' 2>/dev/null || { echo "$NAME: error: $PY lacks torch or h5py (scripts/setup.sh)" >&2; exit 1; }
TORCHRUN="$(dirname "$PY")/torchrun"
[ -x "$TORCHRUN" ] || { echo "$NAME: error: $TORCHRUN not found (it comes with the torch wheel)" >&2; exit 1; }

read -r dataset n_layer n_head n_embd vocab block <<<"$("$PY" - "$recipe" <<'PYEOF'
import sys, tomllib
r = tomllib.load(open(sys.argv[1], "rb"))
m = r.get("model", {})
print(r["data"]["dataset"], m.get("n_layer", 12), m.get("n_head", 12), m.get("n_embd", 768),
      m.get("vocab_size", 50304), m.get("block_size", 1024))
PYEOF
)"
[ -f "$dataset" ] || "$COLOSSAL" data prepare-recipe "$recipe" >&2

TMP="$(mktemp -d "${TMPDIR:-/tmp}/$NAME.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=1
peer_args=(scripts/bench/gpt_ref.py --n-layer "$n_layer" --n-head "$n_head" --n-embd "$n_embd" --vocab-size "$vocab"
           --block-size "$block" --seq-len "$T" --batch "$B" --steps "$S" --warmup-steps 3 --dataset "$dataset"
           --attn sdpa --threads 1)
fail() { echo "$NAME: error: $1; its output ends:" >&2; tail -n 15 "$2" >&2; exit 1; }
