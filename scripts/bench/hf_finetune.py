#!/usr/bin/env python3
"""hf_finetune.py: the transformers side of scripts/bench/finetune_vs_transformers.sh.

Fine-tunes a Hugging Face model directory with AutoModelForCausalLM in an eager loop without Trainer (the
loop a user writes: forward with labels, backward, clip at 1.0, torch AdamW), on random windows of the
HDF5 dataset colossal built from the same directory's tokenizer, the same batch and sequence length as
colossal. Prints one JSON object: steady tokens/s after the warmup steps, the final loss, the parameter
count and the peak RSS.
"""
import argparse
import json
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from gpt_ref import Windows  # noqa: E402  (random windows of seq_len + 1 tokens from /train/tokens)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a Hugging Face model directory")
    ap.add_argument("--dataset", required=True, help="colossal's HDF5 dataset, tokenized with the directory's tokenizer")
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--warmup-steps", type=int, default=2)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--seed", type=int, default=1337)
    a = ap.parse_args()
    if a.steps <= a.warmup_steps:
        sys.exit("hf_finetune: error: --steps must exceed --warmup-steps")
    from transformers import AutoModelForCausalLM
    torch.manual_seed(a.seed)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    model.train()
    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.01},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95))
    data = Windows(a.dataset, a.seq_len, a.batch, a.seed)
    print(f"hf_finetune: {type(model).__name__} {n_params / 1e6:.2f}M parameters, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads", file=sys.stderr)

    def step():
        x, y = data.next()                                   # [B, T] each: y is x shifted by one
        logits = model(input_ids=x).logits                   # [B, T, V]
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup_steps):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps - a.warmup_steps):
        loss = step()
    elapsed = time.perf_counter() - t0
    print(json.dumps({"tokens_per_s": (a.steps - a.warmup_steps) * a.batch * a.seq_len / elapsed,
                      "final_loss": loss.item(), "params": n_params,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}), flush=True)


if __name__ == "__main__":
    main()
