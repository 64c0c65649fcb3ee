#!/usr/bin/env python3
"""read_bandwidth.py: this machine's read bandwidth in GB/s, the bound the decoding benchmarks divide by
(infer_vs_transformers.sh, quant_decode.py): the best of 8 reads of a float32 tensor of --bytes (default 1 GiB:
memory's, not a cache's), each kind of read warmed once first. On the CPU the faster of a sum and MKL's
matrix-vector product over the same floats: one sequential stream a core (the sum) reads 0.8 of what several do
on an Intel Xeon (kernels/cpu/weight_streams.h). On a GPU, a sum."""
import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--bytes", type=int, default=1 << 30)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    a = ap.parse_args()
    n = max(a.bytes // 4, 1 << 16)
    if a.device == "cuda":
        x = torch.ones(n, device="cuda")
        reads = [lambda: (x.sum(), torch.cuda.synchronize())]
    else:
        torch.set_num_threads(a.threads)
        n = n // 4096 * 4096
        x = torch.ones(n)
        m, v = x.view(4096, -1), torch.ones(n // 4096)
        reads = [lambda: x.sum(), lambda: torch.mv(m, v)]
    best = float("inf")
    for read in reads:
        read()
        for _ in range(8):
            t0 = time.perf_counter()
            read()
            best = min(best, time.perf_counter() - t0)
    print(x.numel() * x.element_size() / best / 1e9)


if __name__ == "__main__":
    main()
