#!/usr/bin/env python3
# pipeline_ref.py: the PyTorch peer for scripts/bench/pipeline.sh. gpt_ref.py's GPT-2, cut into stages the way
# torchtitan cuts it (the embeddings on the first stage, an equal share of the blocks on each, the final norm and
# head on the last; the head a copy of the token embedding, since torch.distributed.pipelining does not tie across
# stages) and run by torch.distributed.pipelining's own schedules (ScheduleGPipe, Schedule1F1B,
# ScheduleInterleaved1F1B with two chunks a rank, ScheduleInterleavedZeroBubble) under torchrun on Gloo, with
# AdamW and clipping as gpt_ref.py. Every rank reads the same batches; the global batch is split into
# --micro-batches. Prints, from the last stage, one JSON line: {"peer", "tokens_per_s", "final_loss",
# "peak_rss_mb", ...} (tokens/s over the steps after --warmup-steps).
import argparse
import json
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_ref import Gpt, Windows, fail  # noqa: E402


class Stage(nn.Module):
    """Blocks [lo, hi) of `full`, with the embeddings when first and the final norm and head when last."""

    def __init__(self, full, lo, hi, first, last):
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.wte, self.wpe = full.wte, full.wpe
        self.h = nn.ModuleList(full.h[lo:hi])
        if last:
            self.ln_f = full.ln_f
            self.lm_head = nn.Linear(full.wte.weight.shape[1], full.wte.weight.shape[0], bias=False)
            self.lm_head.weight = nn.Parameter(full.wte.weight.detach().clone())

    def forward(self, x):
        if self.first:                                        # ids [B, T] -> [B, T, C]
            x = self.wte(x) + self.wpe(torch.arange(x.shape[1], device=x.device))
        for block in self.h:
            x = block(x)
        if self.last:                                         # [B, T, V]
            x = self.lm_head(self.ln_f(x))
        return x


def main():
    ap = argparse.ArgumentParser(description="torch.distributed.pipelining peer for scripts/bench/pipeline.sh")
    for k in ("n-layer", "n-head", "n-embd", "vocab-size", "block-size", "seq-len", "batch", "steps", "micro-batches"):
        ap.add_argument(f"--{k}", type=int, required=True)
    ap.add_argument("--warmup-steps", type=int, default=3)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--schedule", choices=["gpipe", "1f1b", "interleaved", "zero_bubble"], required=True)
    ap.add_argument("--seed", type=int, default=1337)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                                              ScheduleInterleavedZeroBubble)
    chunks = 2 if a.schedule in ("interleaved", "zero_bubble") else 1
    stages = world * chunks
    if a.n_layer % stages:
        fail(f"--n-layer {a.n_layer} does not cut into {stages} equal stages")
    torch.manual_seed(a.seed)
    full = Gpt(a.n_layer, a.n_head, a.n_embd, a.vocab_size, a.block_size, 0.0, "sdpa")
    per = a.n_layer // stages
    mods, pipe = [], []
    for c in range(chunks):   # chunk c of rank r is stage c * world + r, as colossal places them
        s = c * world + rank
        m = Stage(full, s * per, (s + 1) * per, s == 0, s == stages - 1)
        mods.append(m)
        pipe.append(PipelineStage(m, s, stages, torch.device("cpu")))
    del full
    params = [p for m in mods for p in m.parameters()]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)

    def loss_fn(logits, y):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    kinds = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B,
             "zero_bubble": ScheduleInterleavedZeroBubble}
    sched = kinds[a.schedule](pipe if chunks > 1 else pipe[0], a.micro_batches, loss_fn=loss_fn)
    data = Windows(a.dataset, a.seq_len, a.batch, a.seed)     # every rank the same batches
    first, last = rank == 0, rank == world - 1
    losses = []

    def step():
        x, y = data.next()
        losses.clear()
        kw = {}
        if last:
            kw = {"target": y, "losses": losses}
        if first:
            sched.step(x, **kw)
        else:
            sched.step(**kw)
        # clipping's global norm across the stages
        sq = torch.zeros((), dtype=torch.float64)
        for p in params:
            if p.grad is not None:
                sq += torch.linalg.vector_norm(p.grad, dtype=torch.float64) ** 2
        dist.all_reduce(sq)
        coef = (1.0 / (sq.sqrt() + 1e-6)).clamp(max=1.0)
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef.to(torch.float32))
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(a.warmup_steps):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(a.steps - a.warmup_steps):
        step()
    dist.barrier()
    elapsed = time.perf_counter() - t0
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    if last:
        print(json.dumps({"peer": f"torch-pipelining-{a.schedule}{world}", "world_size": world,
                          "tokens_per_s": (a.steps - a.warmup_steps) * a.batch * a.seq_len / elapsed,
                          "final_loss": float(sum(l.item() for l in losses) / max(1, len(losses))),
                          "peak_rss_mb": float(rss.item())}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except Exception as e:
        import traceback
        traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0][:200]
        print(f"pipeline_ref: failed: {type(e).__name__}: {first}", file=sys.stderr)
        sys.exit(1)
