#!/usr/bin/env python3
"""quantize_peer.py: the int8 weight quantization `colossal quantize --scheme int8-weight --eval-tokens 0`
does, written as a careful PyTorch user would write it: safetensors' safe_open reads one tensor at a time
from the memory-mapped files, each linear layer's weight (and the token embedding) becomes int8 with one
fp32 scale per output channel, everything else is kept, and safetensors' save_file writes the result,
which it needs whole in memory. The peer of scripts/bench/quantize_memory.sh (time and peak memory).

usage: quantize_peer.py CHECKPOINT OUT_DIR [--threads N]
Prints one JSON line: {"seconds": ..., "tensors": ..., "bytes_out": ...}.
"""
import argparse, json, os, shutil, time

import torch
from safetensors import safe_open
from safetensors.torch import save_file

# GPT-2's linear layers (Conv1D: [in, out], so an output channel is a column) and its token embedding
# (rows), as colossal quantizes them; the position table and the norms stay fp32.
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def quantize(t, dim):
    """int8 values and fp32 absmax / 127 scales, one per slice along `dim` (symmetric, no zero point)."""
    scale = t.abs().amax(dim=dim, keepdim=True).clamp_min(1e-12) / 127
    return torch.round(t / scale).clamp_(-127, 127).to(torch.int8), scale.float()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("out")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    index = os.path.join(a.checkpoint, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    out = {}
    for f in files:
        with safe_open(os.path.join(a.checkpoint, f), framework="pt") as st:
            for name in st.keys():
                t = st.get_tensor(name)
                base = name[: -len(".weight")]
                if name.endswith(CONV1D):
                    out[base + ".qweight"], out[base + ".scales"] = quantize(t.float(), 0)
                elif name.endswith("wte.weight"):
                    out[base + ".qweight"], out[base + ".scales"] = quantize(t.float(), 1)
                else:
                    out[name] = t.contiguous()
    os.makedirs(a.out, exist_ok=True)
    save_file(out, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(a.checkpoint, "config.json"), a.out)
    print(json.dumps({"seconds": time.perf_counter() - t0, "tensors": len(out),
                      "bytes_out": sum(v.numel() * v.element_size() for v in out.values())}))


if __name__ == "__main__":
    main()
