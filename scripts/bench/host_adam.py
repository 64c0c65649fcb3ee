#!/usr/bin/env python3
# host_adam.py: the peers of scripts/bench/host_adam.sh. AdamW steps on the host over a GPT-2 parameter
# list (the tensors and shapes of a GPT-2-width model with --layers blocks, the embedding untied from
# nothing else, decay on matrices only) with random fp32 gradients: torch.optim.AdamW with foreach=True
# and with fused=True, and DeepSpeed's DeepSpeedCPUAdam (its C++/AVX op, built at first use) when
# deepspeed imports. Each is timed alone (the step) and with torch.nn.utils.clip_grad_norm_ before it
# (clipping that acts), as the median of --steps steps after two warm-ups. Prints one JSON line.
# --device cuda: the same parameters on the GPU, each step timed to its completion (torch's fused and foreach
# AdamW there; DeepSpeed's CPUAdam is a host optimizer and is left out).
import argparse
import json
import statistics
import sys
import time

import torch


def gpt2_params(layers, device, n_embd=768, vocab=50257, positions=1024):
    shapes = [(vocab, n_embd), (positions, n_embd)]
    for _ in range(layers):
        shapes += [(n_embd,), (n_embd,), (3 * n_embd, n_embd), (3 * n_embd,), (n_embd, n_embd), (n_embd,),
                   (n_embd,), (n_embd,), (4 * n_embd, n_embd), (4 * n_embd,), (n_embd, 4 * n_embd), (n_embd,)]
    shapes += [(n_embd,), (n_embd,)]
    g = torch.Generator().manual_seed(0)
    params = []
    for s in shapes:
        p = torch.nn.Parameter((torch.randn(s, generator=g) * 0.02).to(device))
        p.grad = torch.randn(s, generator=g).to(device)   # norm far above 1: clipping acts
        params.append(p)
    return params


def groups(params):
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def timed(step, steps, clip, params):
    times = []
    sync = torch.cuda.synchronize if params[0].is_cuda else (lambda: None)
    for i in range(steps + 2):
        sync()
        t0 = time.perf_counter()
        if clip:
            torch.nn.utils.clip_grad_norm_(params, 1.0)
        step()
        sync()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=9)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--peers", default="foreach,fused,deepspeed")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    params = gpt2_params(a.layers, a.device)
    out = {"params": sum(p.numel() for p in params), "threads": torch.get_num_threads(), "torch": torch.__version__}
    for peer in a.peers.split(","):
        if peer == "deepspeed":
            try:
                from deepspeed.ops.adam import DeepSpeedCPUAdam
            except Exception as e:   # not installed, or its op does not build here
                print(f"host_adam: DeepSpeed left out: {e}", file=sys.stderr)
                continue
            opt = DeepSpeedCPUAdam(groups(params), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, adamw_mode=True)
        else:
            opt = torch.optim.AdamW(groups(params), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, **{peer: True})
        out[peer] = {"step_ms": timed(opt.step, a.steps, False, params), "clip_step_ms": timed(opt.step, a.steps, True, params)}
        del opt
    print(json.dumps(out))


if __name__ == "__main__":
    main()
