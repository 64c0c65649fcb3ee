# Sourced by the multi-node and SLURM checks: the recipe and overrides under which a distributed run must
# end with the same weights as one process on the same global batch (see tests/test_dist_e2e.cpp for why
# AdamW's eps is raised and kernels are pinned). Sets RECIPE and DP_ARGS (an array).
RECIPE=recipes/gpt-tiny.toml
DP_ARGS=(--quiet --set model.dropout=0 --set train.max_steps=6 --set train.eval_every=0 --set train.eval_batches=1
         --set checkpoint.every=0 --set optim.eps=1e-5 --set optim.warmup_steps=2 --set optim.decay_steps=8
         --set 'kernels.attention="fused"' --set 'kernels.gelu="fused"' --set 'kernels.layer_norm="fused"'
         --set 'kernels.gemm="fused"')
