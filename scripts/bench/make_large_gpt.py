#!/usr/bin/env python3
"""make_large_gpt.py: a GPT-2 checkpoint larger than this machine's memory, with random weights, written one
tensor at a time so that neither this script nor anything else ever holds the model: config.json and the
weights as transformers' save_pretrained shards them (model-0000i-of-0000n.safetensors of at most
--max-shard-gb each, cut between tensors, and model.safetensors.index.json), in the model's order, and the
tokenizer copied from a colossal checkpoint. For the inference-from-disk benchmark (scripts/bench/stream_infer.sh)
at whole-machine scale; timing does not depend on the weights' values. (One file larger than memory is what
transformers cannot open here: safetensors' mmap of it fails with ENOMEM under the kernel's default overcommit.)

  make_large_gpt.py --layers 40 --width 4096 --tokenizer-from DIR --out DIR [--max-shard-gb 5]
"""
import argparse
import json
import os
import shutil
import struct
import sys
from pathlib import Path

import numpy as np


def tensors(layers, width, vocab, positions):
    """(name, shape, kind) in the order colossal writes them; kind: normal, ones or zeros."""
    yield "transformer.wte.weight", (vocab, width), "normal"
    yield "transformer.wpe.weight", (positions, width), "normal"
    for i in range(layers):
        h = f"transformer.h.{i}."
        for ln in ("ln_1", "ln_2"):
            yield h + ln + ".weight", (width,), "ones"
            yield h + ln + ".bias", (width,), "zeros"
        for name, shape in (("attn.c_attn", (width, 3 * width)), ("attn.c_proj", (width, width)),
                            ("mlp.c_fc", (width, 4 * width)), ("mlp.c_proj", (4 * width, width))):
            yield h + name + ".weight", shape, "normal"   # Conv1D: [in, out]
            yield h + name + ".bias", (shape[1],), "zeros"
    yield "transformer.ln_f.weight", (width,), "ones"
    yield "transformer.ln_f.bias", (width,), "zeros"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--width", type=int, required=True, help="a multiple of 64 (heads of 64)")
    ap.add_argument("--tokenizer-from", required=True, help="a colossal checkpoint whose tokenizer.model and vocabulary to use")
    ap.add_argument("--positions", type=int, default=1024)
    ap.add_argument("--max-shard-gb", type=float, default=5.0, help="save_pretrained's default max_shard_size, 5GB")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.layers < 1 or a.width < 64 or a.width % 64:
        sys.exit("make_large_gpt: error: --layers must be positive and --width a positive multiple of 64")
    src = Path(a.tokenizer_from)
    if not (src / "tokenizer.model").is_file() or not (src / "config.json").is_file():
        sys.exit(f"make_large_gpt: error: {src} has no tokenizer.model and config.json (a colossal GPT-2 checkpoint is needed)")
    base = json.loads((src / "config.json").read_text())
    vocab = base["vocab_size"]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    plan = list(tensors(a.layers, a.width, vocab, a.positions))
    limit = int(a.max_shard_gb * 1e9)
    shards, size = [[]], 0   # tensors in order, a new shard where the next would pass the limit
    for name, shape, kind in plan:
        n = 4 * int(np.prod(shape))
        if shards[-1] and size + n > limit:
            shards.append([])
            size = 0
        shards[-1].append((name, shape, kind))
        size += n
    total = sum(4 * int(np.prod(s)) for _, s, _ in plan)
    free = shutil.disk_usage(out).free
    if total > free:
        sys.exit(f"make_large_gpt: error: the model needs {total / 2**30:.1f} GiB and {out} has {free / 2**30:.1f} GiB free")
    rng = np.random.default_rng(0)
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name, shape, _ in shard:
            n = 4 * int(np.prod(shape))
            header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + n]}
            offset += n
            weight_map[name] = fname
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)   # data starts 8-byte aligned, as safetensors' writers leave it
        with open(out / (fname + ".partial"), "wb") as f:
            f.write(struct.pack("<Q", len(blob)))
            f.write(blob)
            for name, shape, kind in shard:
                if kind == "normal":
                    v = rng.standard_normal(shape, dtype=np.float32)
                    v *= 0.02
                else:
                    v = (np.ones if kind == "ones" else np.zeros)(shape, dtype=np.float32)
                f.write(v.tobytes())
        os.replace(out / (fname + ".partial"), out / fname)
        print(f"make_large_gpt: {fname} written ({offset / 2**30:.2f} GiB)", file=sys.stderr)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    config = dict(base, n_layer=a.layers, n_embd=a.width, n_head=a.width // 64, n_positions=a.positions, n_ctx=a.positions)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    shutil.copy(src / "tokenizer.model", out / "tokenizer.model")
    params = sum(int(np.prod(s)) for _, s, _ in plan)
    print(f"make_large_gpt: {out}: {params / 1e9:.2f}B parameters, {total / 2**30:.2f} GiB of fp32 weights in {len(shards)} shards")


if __name__ == "__main__":
    main()
