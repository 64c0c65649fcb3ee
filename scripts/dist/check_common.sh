# Sourced by two_node_check.sh and slurm_check.sh with their arguments: parses --colossal BIN and
# --python PY, and sets the recipe and overrides under which a distributed run must end with the same
# weights as one process on the same global batch (tests/test_dist_e2e.cpp says why AdamW's eps is raised
# and the kernels pinned): COLOSSAL, PY, RECIPE and DP_ARGS (an array).
COLOSSAL=build/colossal PY=.venv/bin/python
while (($#)); do
  case "$1" in
    --colossal) COLOSSAL="$2"; shift 2 ;;
    --python) PY="$2"; shift 2 ;;
    *) echo "${0##*/}: error: unknown argument '$1' (valid: --colossal BIN, --python PY)" >&2; exit 2 ;;
  esac
done
COLOSSAL="$(realpath "$COLOSSAL")"
RECIPE=recipes/gpt-tiny.toml
DP_ARGS=(--quiet --set model.dropout=0 --set train.max_steps=6 --set train.eval_every=0 --set train.eval_batches=1
         --set checkpoint.every=0 --set optim.eps=1e-5 --set optim.warmup_steps=2 --set optim.decay_steps=8
         --set 'kernels.attention="fused"' --set 'kernels.gelu="fused"' --set 'kernels.layer_norm="fused"'
         --set 'kernels.gemm="fused"')
