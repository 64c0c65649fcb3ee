#!/usr/bin/env python3
# gpt_ref.py: the PyTorch peer for scripts/bench/train_vs_torch.sh. A self-contained GPT-2 (learned token and
# position embeddings, pre-LayerNorm blocks, fused qkv, causal attention, tanh-GELU MLP, lm_head tied to the
# token embedding) trained with AdamW on random windows of the same HDF5 dataset `colossal train` reads, so the
# bench compares the two on one shape, one batch and one torch wheel. It times the steps after --warmup-steps
# (whole step: batch, forward, backward, clipping, optimizer) and prints one JSON line on stdout:
#   {"peer": ..., "tokens_per_s": ..., "steps": ..., "final_loss": ..., "peak_rss_mb": ..., "params": ...}
# --steps counts all steps run, warmup included, as train.max_steps does on the colossal side.
import argparse
import os
import json
import math
import resource
import sys
import time

import h5py
import numpy as np
import torch
import torch.nn as nn
import torch.utils.checkpoint
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size, dropout, attn):
        super().__init__()
        self.n_head, self.dropout, self.attn = n_head, dropout, attn
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)   # fused q, k, v
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)
        if attn == "naive":
            causal = torch.ones(block_size, block_size, dtype=torch.bool).tril()
            self.register_buffer("causal", causal.view(1, 1, block_size, block_size), persistent=False)

    def forward(self, x):                                     # [B, T, C]
        B, T, _ = x.shape
        qkv = self.c_attn(x)                                  # [B, T, 3C] (a tensor-parallel rank's 3C/P: its heads)
        C = qkv.shape[-1] // 3
        H, D = self.n_head, C // self.n_head
        q, k, v = qkv.split(C, dim=2)                         # each [B, T, C]
        q = q.view(B, T, H, D).transpose(1, 2)                # each [B, H, T, D]
        k = k.view(B, T, H, D).transpose(1, 2)
        v = v.view(B, T, H, D).transpose(1, 2)
        if self.attn == "naive":
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))            # [B, H, T, T]
            att = att.masked_fill(~self.causal[:, :, :T, :T], float("-inf"))
            att = self.attn_drop(F.softmax(att, dim=-1))
            y = att @ v                                                        # [B, H, T, D]
        else:
            p = self.dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)  # [B, H, T, D]
        y = y.transpose(1, 2).contiguous().view(B, T, C)      # [B, T, C]
        return self.resid_drop(self.c_proj(y))


class Mlp(nn.Module):
    def __init__(self, n_embd, dropout):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):                                     # [B, T, C]
        h = F.gelu(self.c_fc(x), approximate="tanh")          # [B, T, 4C]
        return self.drop(self.c_proj(h))                      # [B, T, C]


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size, dropout, attn):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, dropout, attn)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = Mlp(n_embd, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, vocab_size, block_size, dropout, attn, checkpoint="none"):
        super().__init__()
        self.block_size = block_size
        self.checkpoint = checkpoint   # torch.utils.checkpoint on every block ("full") or every other ("every2")
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(n_embd, n_head, block_size, dropout, attn) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight                 # tied
        # GPT-2 initialisation: N(0, 0.02), zero biases, residual projections scaled by 1/sqrt(2 * n_layer).
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def forward(self, idx, targets):                          # idx, targets: [B, T]
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))          # [B, T, C]
        for i, block in enumerate(self.h):
            if self.training and (self.checkpoint == "full" or (self.checkpoint == "every2" and i % 2 == 0)):
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.lm_head(self.ln_f(x))                   # [B, T, V]
        return F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T))


class Windows:
    """Random windows of seq_len + 1 tokens from /train/tokens, read from the file batch by batch."""

    def __init__(self, path, seq_len, batch, seed):
        self.file = h5py.File(path, "r")
        if "train/tokens" not in self.file:
            fail(f"{path}: no /train/tokens dataset (expected groups /train and /val holding tokens and doc_offsets)")
        self.tokens = self.file["train/tokens"]
        self.seq_len, self.batch = seq_len, batch
        self.rng = np.random.default_rng(seed)
        if self.tokens.ndim != 1 or self.tokens.shape[0] < seq_len + 1:
            fail(f"{path}: /train/tokens has shape {self.tokens.shape}; need a 1-D array of at least "
                 f"seq_len + 1 = {seq_len + 1} tokens")
        self.vocab_size = int(self.file.attrs["vocab_size"]) if "vocab_size" in self.file.attrs else None

    def next(self):
        T = self.seq_len
        starts = self.rng.integers(0, self.tokens.shape[0] - T, size=self.batch)
        w = torch.from_numpy(np.stack([self.tokens[s:s + T + 1] for s in starts]).astype(np.int64))  # [B, T+1]
        return w[:, :-1], w[:, 1:]                            # inputs, targets: [B, T]


def clip_mixed(params, max_norm):
    """clip_grad_norm_ over DTensor and plain gradients together (torch's own refuses the mix): the split
    tensors' norms summed over their shards, the replicated ones counted once."""
    from torch.distributed.tensor import DTensor
    sq = torch.zeros((), dtype=torch.float64)
    for p in params:
        n = torch.linalg.vector_norm(p.grad, dtype=torch.float64)
        sq += (n.full_tensor() if isinstance(n, DTensor) else n) ** 2
    coef = (max_norm / (sq.sqrt() + 1e-6)).clamp(max=1.0)
    for p in params:
        p.grad.mul_(coef.to(torch.float32))


def fail(msg):
    print(f"gpt_ref: error: {msg}", file=sys.stderr)
    sys.exit(2)


def parse_args():
    ap = argparse.ArgumentParser(description="PyTorch GPT-2 training peer for scripts/bench/train_vs_torch.sh")
    ap.add_argument("--n-layer", type=int, required=True)
    ap.add_argument("--n-head", type=int, required=True)
    ap.add_argument("--n-embd", type=int, required=True)
    ap.add_argument("--vocab-size", type=int, required=True)
    ap.add_argument("--block-size", type=int, required=True, help="number of learned positions")
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True, help="steps run in all, warmup included")
    ap.add_argument("--warmup-steps", type=int, default=3, help="first steps, not timed (default 3)")
    ap.add_argument("--dataset", required=True, help="HDF5 file with /train/tokens (int32)")
    ap.add_argument("--attn", choices=["naive", "sdpa"], default="sdpa")
    ap.add_argument("--compile", action="store_true", help="wrap the model in torch.compile (default backend)")
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--checkpoint", choices=["none", "full", "every2"], default="none",
                    help="torch.utils.checkpoint (non-reentrant) on every block or every other block")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--deepspeed", type=int, default=None, metavar="STAGE",
                    help="under torchrun: DeepSpeed's ZeRO at this stage (Gloo on CPU) instead of DDP")
    ap.add_argument("--fsdp", action="store_true",
                    help="under torchrun: PyTorch FSDP2 (fully_shard on each block, then the root) instead of DDP")
    ap.add_argument("--tp", action="store_true",
                    help="under torchrun: PyTorch's tensor parallelism instead of DDP (parallelize_module, DTensor: each "
                         "block's qkv and MLP expansion column-wise, both projections row-wise; every rank the same batch)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: model and batches on the GPU, AdamW fused (its fastest eager form)")
    a = ap.parse_args()
    if a.n_embd % a.n_head:
        fail(f"--n-head {a.n_head} does not divide --n-embd {a.n_embd}")
    if a.seq_len > a.block_size:
        fail(f"--seq-len {a.seq_len} is longer than --block-size {a.block_size} (the learned positions)")
    if not 0 <= a.warmup_steps < a.steps:
        fail(f"--steps {a.steps} must exceed --warmup-steps {a.warmup_steps} (steps counts warmup too)")
    return a


def main():
    a = parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    # Under torchrun (WORLD_SIZE > 1): PyTorch DDP over Gloo (NCCL on cuda), the peer a user of data
    # parallelism would pick; --batch is per worker, tokens/s counts all workers.
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1 and a.deepspeed is not None:
        import deepspeed
        deepspeed.init_distributed(dist_backend="nccl" if a.device == "cuda" else "gloo")
    elif world > 1:
        import torch.distributed as dist
        dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
    torch.manual_seed(a.seed)
    data = Windows(a.dataset, a.seq_len, a.batch, a.seed + (0 if a.tp else rank))   # tensor parallelism: one batch
    if data.vocab_size is not None and data.vocab_size > a.vocab_size:
        fail(f"{a.dataset}: vocab_size attribute {data.vocab_size} exceeds --vocab-size {a.vocab_size}")

    if a.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda but torch sees no GPU")
    dev = torch.device(a.device)
    model = Gpt(a.n_layer, a.n_head, a.n_embd, a.vocab_size, a.block_size, a.dropout, a.attn, a.checkpoint).to(dev)
    model.train()
    params = list(model.parameters())                         # the tied weight appears once
    n_params = sum(p.numel() for p in params)
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    run = model
    engine = None
    if world > 1 and a.deepspeed is not None:   # DeepSpeed's own ZeRO, with torch's AdamW on the same groups
        import deepspeed
        opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
        engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=opt, config={
            "train_micro_batch_size_per_gpu": a.batch, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
            "zero_optimization": {"stage": a.deepspeed}, "steps_per_print": 1 << 30})
        run = engine
    elif world > 1 and a.fsdp:   # ZeRO-3's peer: parameters, gradients and AdamW state sharded per block
        from torch.distributed.fsdp import fully_shard
        for block in model.h:
            fully_shard(block)
        fully_shard(model)   # the embeddings, final norm and the tied head
        params = list(model.parameters())
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    elif world > 1 and a.tp:   # torchtitan's recipe for a GPT block; the fused qkv's columns are laid out per rank
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        if a.n_head % world:
            fail(f"--n-head {a.n_head} does not split across {world} tensor-parallel ranks")
        mesh = init_device_mesh(a.device, (world,))
        for block in model.h:
            block.attn.n_head //= world                       # each rank computes its heads
            parallelize_module(block, mesh, {"attn.c_attn": ColwiseParallel(), "attn.c_proj": RowwiseParallel(),
                                             "mlp.c_fc": ColwiseParallel(), "mlp.c_proj": RowwiseParallel()})
        params = list(model.parameters())
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    elif world > 1:   # the same bucket size as colossal's default, buckets as views of the gradients
        run = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25, gradient_as_bucket_view=True)
    if engine is None:
        opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=a.device == "cuda")
    run = torch.compile(run) if a.compile else run
    peer = "torch-compile" if a.compile else f"torch-eager-{a.attn}"
    if world > 1:
        kind = f"deepspeed-zero{a.deepspeed}" if a.deepspeed is not None else ("fsdp2" if a.fsdp else ("tp" if a.tp else "ddp"))
        peer = f"torch-{kind}{world}-" + peer.removeprefix("torch-")
    print(f"gpt_ref: {peer}: {n_params / 1e6:.2f}M parameters, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads", file=sys.stderr)

    def step():
        x, y = data.next()
        loss = run(x.to(dev, non_blocking=True), y.to(dev, non_blocking=True))
        if engine is not None:   # DeepSpeed clips, steps and zeroes itself
            engine.backward(loss)
            engine.step()
            return loss
        loss.backward()
        if a.tp and world > 1:
            clip_mixed(params, 1.0)
        else:
            torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup_steps):                           # torch.compile compiles here
        step()
    timed = a.steps - a.warmup_steps
    if a.device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(timed):
        loss = step()
    final_loss = loss.item()                                  # waits for the GPU's last step too
    elapsed = time.perf_counter() - t0

    if rank != 0:
        return
    print(json.dumps({
        "peer": peer,
        "world_size": world,
        "tokens_per_s": timed * a.batch * a.seq_len * (1 if a.tp else world) / elapsed,   # tensor-parallel ranks share a batch
        "steps": a.steps,
        "final_loss": final_loss,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_device_mb": torch.cuda.max_memory_allocated() / 1048576 if a.device == "cuda" else 0.0,
        "params": n_params,
    }), flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # the bench shows the last stderr line as the reason a peer failed
        import traceback
        traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0][:200]
        print(f"gpt_ref: failed: {type(e).__name__}: {first}", file=sys.stderr)
        sys.exit(1)
