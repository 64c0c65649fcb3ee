"""Prints this machine's fp32 matmul rate in GFLOP/s at a GPT's training GEMM shapes, measured with the
torch of the running Python (so under the same thread count and ISA caps as the benchmark's peers):
the forward products of one step (QKV, attention output, MLP up and down, the LM head) over M = batch x
sequence tokens, and their two backward products each, timed as a whole, best of several rounds."""
import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, required=True, help="M: batch x sequence length")
    ap.add_argument("--n-embd", type=int, required=True)
    ap.add_argument("--vocab-size", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    m, c, v = a.tokens, a.n_embd, a.vocab_size
    # (k, n) of each forward product x[M, k] @ w[k, n]; backward adds dX = dY w^T and dW = x^T dY.
    shapes = [(c, 3 * c), (c, c), (c, 4 * c), (4 * c, c), (c, v)]
    work = []
    for k, n in shapes:
        x, w, dy = torch.randn(m, k), torch.randn(k, n), torch.randn(m, n)
        work += [(x, w), (dy, w.t()), (x.t(), dy)]
    flops = sum(2 * a_.shape[0] * a_.shape[1] * b_.shape[1] for a_, b_ in work)
    best = float("inf")
    for _ in range(a.rounds + 1):   # the first round warms up
        start = time.perf_counter()
        for a_, b_ in work:
            torch.mm(a_, b_)
        best = min(best, time.perf_counter() - start)
    print(f"{flops / best / 1e9:.1f}")


if __name__ == "__main__":
    main()
