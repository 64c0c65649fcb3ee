#!/usr/bin/env python3
"""make_hf_dir.py: a Hugging Face model directory of a published shape (or, for vit-small, a recipe's) with random
weights, for benchmarks on machines that cannot reach the hub: save_pretrained's layout (config.json,
model.safetensors) and, for the text shapes, a tokenizer's files copied beside it. Timing does not depend on the
weights' values. The text shapes keep the published vocab_size whatever the copied tokenizer holds (its ids are
all below it).

  make_hf_dir.py --shape opt-125m|bloom-560m|bert-base --tokenizer-from DIR --out DIR
  make_hf_dir.py --shape vit-small --out DIR                 (an image classifier: no tokenizer)
"""
import argparse
import shutil
import sys
from pathlib import Path

import torch

FASHION_MNIST = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                 "Ankle boot")
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
    # bert-base-uncased's config: BertConfig's defaults (12 layers, width 768, 12 heads, MLP 3072, 30522 pieces,
    # 512 positions, dropout 0.1)
    "bert-base": ("BertConfig", "BertForMaskedLM", dict()),
    # recipes/vit-fashion.toml's model (not a hub checkpoint): Fashion-MNIST's 28x28 grey images in 7x7 patches
    # (16 and the class token), 6 layers, width 128, 4 heads, MLP 256, ten labels
    "vit-small": ("ViTConfig", "ViTForImageClassification",
                  dict(image_size=28, patch_size=7, num_channels=1, num_hidden_layers=6, num_attention_heads=4,
                       hidden_size=128, intermediate_size=256, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0, layer_norm_eps=1e-12, id2label=dict(enumerate(FASHION_MNIST)),
                       label2id={name: i for i, name in enumerate(FASHION_MNIST)})),
}
IMAGE_SHAPES = ("vit-small",)   # no tokenizer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "vocab.txt")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--tokenizer-from", help="a directory whose tokenizer files are copied (text shapes only)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    image = a.shape in IMAGE_SHAPES
    if image and a.tokenizer_from:
        sys.exit(f"make_hf_dir: error: --shape {a.shape} is an image classifier and takes no --tokenizer-from")
    if not image and not a.tokenizer_from:
        sys.exit(f"make_hf_dir: error: --shape {a.shape} needs --tokenizer-from DIR")
    copied = [] if image else [f for f in TOKENIZER_FILES if (Path(a.tokenizer_from) / f).is_file()]
    if not image and not copied:
        sys.exit(f"make_hf_dir: error: {a.tokenizer_from} holds no tokenizer files")
    import transformers
    config_cls, model_cls, kwargs = SHAPES[a.shape]
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**kwargs))
    out = Path(a.out)
    model.save_pretrained(out)
    for f in copied:
        shutil.copy(Path(a.tokenizer_from) / f, out / f)
    print(f"make_hf_dir: {a.shape}: {sum(p.numel() for p in model.parameters())} parameters -> {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
