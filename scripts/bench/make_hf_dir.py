#!/usr/bin/env python3
"""make_hf_dir.py: a Hugging Face model directory of a published shape with random weights, for benchmarks on
machines that cannot reach the hub: save_pretrained's layout (config.json, model.safetensors) and a
tokenizer's files copied beside it. Timing does not depend on the weights' values.

  make_hf_dir.py --shape opt-125m|bloom-560m --tokenizer-from DIR --out DIR
"""
import argparse
import shutil
import sys
from pathlib import Path

import torch

SHAPES = {
    # facebook/opt-125m's config
    "opt-125m": ("OPTConfig", "OPTForCausalLM", dict(vocab_size=50272, hidden_size=768, num_hidden_layers=12,
                                                     num_attention_heads=12, ffn_dim=3072, max_position_embeddings=2048,
                                                     word_embed_proj_dim=768, do_layer_norm_before=True, dropout=0.1,
                                                     attention_dropout=0.0, pad_token_id=1, bos_token_id=2,
                                                     eos_token_id=2)),
    # bigscience/bloom-560m's config
    "bloom-560m": ("BloomConfig", "BloomForCausalLM", dict(vocab_size=250880, hidden_size=1024, n_layer=24, n_head=16,
                                                           hidden_dropout=0.0, attention_dropout=0.0, bos_token_id=1,
                                                           eos_token_id=2, pad_token_id=3)),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--tokenizer-from", required=True, help="a directory whose tokenizer files are copied")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import transformers
    config_cls, model_cls, kwargs = SHAPES[a.shape]
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**kwargs))
    out = Path(a.out)
    model.save_pretrained(out)
    copied = [f for f in TOKENIZER_FILES if (Path(a.tokenizer_from) / f).is_file()]
    if not copied:
        sys.exit(f"make_hf_dir: error: {a.tokenizer_from} holds no tokenizer files")
    for f in copied:
        shutil.copy(Path(a.tokenizer_from) / f, out / f)
    print(f"make_hf_dir: {a.shape}: {sum(p.numel() for p in model.parameters())} parameters -> {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
