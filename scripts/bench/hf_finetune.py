#!/usr/bin/env python3
"""hf_finetune.py: the transformers side of scripts/bench/finetune_vs_transformers.sh.

Fine-tunes a Hugging Face model directory in an eager loop without Trainer (the loop a user writes: forward,
cross entropy, backward, clip at 1.0, torch AdamW), on the same data as colossal, with the same batch and
sequence length. --task picks the model class and the batches:
  causal_lm            AutoModelForCausalLM on random windows of seq_len + 1 tokens of the HDF5 dataset colossal
                       built from the directory's tokenizer (the default)
  masked_lm            AutoModelForMaskedLM on random windows of seq_len - 2 tokens of that dataset wrapped as
                       [CLS] window [SEP], 15% of the non-special tokens chosen with torch's RNG and of those 80%
                       made [MASK], 10% a random token, 10% kept (DataCollatorForLanguageModeling's rule); the
                       model's own labels= loss
  image_classification AutoModelForImageClassification on an IDX image set (--dataset is its directory, e.g.
                       Fashion-MNIST's), shuffled per epoch, normalised by the training set's pixel mean and
                       deviation; seq_len is the model's tokens per image (patches and the class token)
Prints one JSON object: steady tokens/s after the warmup steps (and images/s for images), the final loss, the
parameter count and the peak RSS.
"""
import argparse
import gzip
import json
import os
import resource
import struct
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from gpt_ref import Windows  # noqa: E402  (random windows of seq_len + 1 tokens from /train/tokens)

TASKS = ("causal_lm", "masked_lm", "image_classification")


def fail(msg):
    sys.exit(f"hf_finetune: error: {msg}")


def read_idx(path):
    """An IDX file (plain or gzip) as a numpy array of its dims."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08:
        fail(f"{path}: not an IDX file of unsigned bytes")
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def idx_file(directory, name):
    for p in (Path(directory) / name, Path(directory) / (name + ".gz")):
        if p.is_file():
            return p
    fail(f"{directory} has no {name}[.gz] (an IDX image set's files)")


class Images:
    """Shuffled batches of the IDX training set: images uint8 [N, ch, H, W] normalised per batch, labels [N]."""

    def __init__(self, directory, batch, seed):
        images = read_idx(idx_file(directory, "train-images-idx3-ubyte"))
        self.labels = torch.from_numpy(read_idx(idx_file(directory, "train-labels-idx1-ubyte")).astype(np.int64))
        if images.ndim == 3:
            images = images[:, None]                          # one channel
        if images.ndim != 4 or images.shape[0] != self.labels.shape[0] or images.shape[0] < batch:
            fail(f"{directory}: {images.shape} images and {tuple(self.labels.shape)} labels do not make a set of at "
                 f"least one batch of {batch}")
        self.images = torch.from_numpy(images.copy())
        # Pixel mean and (unbiased) deviation of the set in [0, 1], summed exactly a chunk at a time so the
        # peak memory is the images' own
        n, s1, s2 = images.size, 0, 0
        for chunk in np.array_split(images.reshape(-1), max(1, images.size // (1 << 22))):
            s1 += int(chunk.sum(dtype=np.int64))
            s2 += int(np.square(chunk, dtype=np.int64).sum())
        self.mean = s1 / n / 255.0
        self.std = max(((s2 - s1 * s1 / n) / (n - 1)) ** 0.5 / 255.0, 1e-6)
        self.batch, self.gen, self.position, self.order = batch, torch.Generator().manual_seed(seed), 0, None

    def next(self):
        n, picks, picked = self.images.shape[0], [], 0
        while picked < self.batch:                            # a batch may span the end of an epoch
            if self.position % n == 0:
                self.order = torch.randperm(n, generator=self.gen)
            take = min(self.batch - picked, n - self.position % n)
            picks.append(self.order[self.position % n:self.position % n + take])
            self.position += take
            picked += take
        index = torch.cat(picks)
        x = self.images.index_select(0, index).float().div_(255.0).sub_(self.mean).div_(self.std)  # [B, ch, H, W]
        return x, self.labels.index_select(0, index)


class MaskedWindows:
    """[CLS] window [SEP] batches [B, seq_len] from random windows of seq_len - 2 tokens, masked for MLM."""

    def __init__(self, dataset, seq_len, batch, seed, tokenizer):
        self.windows = Windows(dataset, seq_len - 2, batch, seed)
        self.cls, self.sep, self.mask = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.mask_token_id
        if None in (self.cls, self.sep, self.mask):
            fail("the directory's tokenizer lacks [CLS], [SEP] or [MASK]; masked_lm needs all three")
        self.specials = torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.int64)
        self.vocab = len(tokenizer)

    def next(self):
        w, _ = self.windows.next()                            # [B, T - 2]
        B = w.size(0)
        x = torch.cat([torch.full((B, 1), self.cls), w, torch.full((B, 1), self.sep)], dim=1)   # [B, T]
        labels = x.clone()
        p = torch.full(x.shape, 0.15).masked_fill_(torch.isin(x, self.specials), 0.0)
        chosen = torch.bernoulli(p).bool()
        if not chosen.any():                                  # at least one scored position per batch
            chosen[0, 1] = True
        labels[~chosen] = -100
        to_mask = torch.bernoulli(torch.full(x.shape, 0.8)).bool() & chosen
        x[to_mask] = self.mask
        to_random = torch.bernoulli(torch.full(x.shape, 0.5)).bool() & chosen & ~to_mask
        x[to_random] = torch.randint(self.vocab, x.shape)[to_random]
        return x, labels


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a Hugging Face model directory")
    ap.add_argument("--dataset", required=True,
                    help="colossal's HDF5 dataset, tokenized with the directory's tokenizer (text tasks), or the "
                         "directory of an IDX image set")
    ap.add_argument("--task", choices=TASKS, default="causal_lm")
    ap.add_argument("--seq-len", type=int, help="tokens per sequence (text tasks)")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--warmup-steps", type=int, default=2)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--seed", type=int, default=1337)
    a = ap.parse_args()
    if a.steps <= a.warmup_steps:
        fail("--steps must exceed --warmup-steps")
    image = a.task == "image_classification"
    if image and a.seq_len is not None:
        fail("--seq-len does not apply to image_classification (the model's tokens per image count)")
    if not image and a.seq_len is None:
        fail(f"--task {a.task} needs --seq-len")
    if a.task == "masked_lm" and a.seq_len < 4:
        fail(f"--seq-len {a.seq_len} is too short for masked_lm (at least 4: [CLS], two tokens, [SEP])")
    import transformers
    torch.manual_seed(a.seed)
    auto = {"causal_lm": "AutoModelForCausalLM", "masked_lm": "AutoModelForMaskedLM",
            "image_classification": "AutoModelForImageClassification"}[a.task]
    model = getattr(transformers, auto).from_pretrained(a.model, dtype=torch.float32)
    model.train()
    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.01},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95))
    if image:
        data = Images(a.dataset, a.batch, a.seed)
        tokens_per_sample = (model.config.image_size // model.config.patch_size) ** 2 + 1   # patches + class token
    elif a.task == "masked_lm":
        data = MaskedWindows(a.dataset, a.seq_len, a.batch, a.seed, transformers.AutoTokenizer.from_pretrained(a.model))
        tokens_per_sample = a.seq_len
    else:
        data = Windows(a.dataset, a.seq_len, a.batch, a.seed)
        tokens_per_sample = a.seq_len
    print(f"hf_finetune: {type(model).__name__} {n_params / 1e6:.2f}M parameters, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads", file=sys.stderr)

    def step():
        x, y = data.next()
        if a.task == "causal_lm":                            # [B, T] each: y is x shifted by one
            logits = model(input_ids=x).logits               # [B, T, V]
            loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
        elif a.task == "masked_lm":                          # [B, T] each: y is -100 where not scored
            loss = model(input_ids=x, labels=y).loss
        else:                                                # [B, ch, H, W] and [B]
            loss = torch.nn.functional.cross_entropy(model(pixel_values=x).logits, y)
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
    samples_per_s = (a.steps - a.warmup_steps) * a.batch / elapsed
    result = {"tokens_per_s": samples_per_s * tokens_per_sample}
    if image:
        result.update(images_per_s=samples_per_s, tokens_per_image=tokens_per_sample)
    result.update(final_loss=loss.item(), params=n_params,
                  peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
