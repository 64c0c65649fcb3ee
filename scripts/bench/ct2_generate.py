#!/usr/bin/env python3
"""ct2_generate.py: CTranslate2's side of scripts/bench/quant_decode.sh.

Converts a colossal checkpoint (GPT-2 layout: model.safetensors, config.json, tokenizer.model) to a CTranslate2
model with int8 weights (cached in --cache), then greedy-decodes the prompts colossal infer reads, tokenised as
colossal tokenises them (SentencePiece ids, no BOS/EOS; each id given to CTranslate2 as its own vocabulary entry,
so the converter needs no Hugging Face tokenizer), exactly --tokens new tokens per prompt (min = max length).
CTranslate2 does not split its timing, so the decode time is T(n new tokens) - T(1 new token), the same batch
(the prefill and first token cancel); prints one JSON object like hf_generate.py's.
"""
import argparse
import json
import sys
import time
from pathlib import Path


def fail(msg):
    sys.exit(f"ct2_generate: error: {msg}")


class IdVocabulary:
    """A tokenizer stand-in for the converter: entry i is the string 't<i>'."""
    def __init__(self, size):
        self.size = size
        self.bos_token, self.eos_token, self.unk_token = "t1", "t2", "t0"

    def get_vocab(self):
        return {f"t{i}": i for i in range(self.size)}


def convert(ckpt, out, quantization):
    import ctranslate2.converters.transformers as ct
    vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
    ct.TransformersConverter.load_tokenizer = lambda self, cls, path, **kw: IdVocabulary(vocab)
    ct.TransformersConverter(str(ckpt)).convert(str(out), quantization=quantization, force=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--cache", required=True, help="directory of the converted model (made when missing)")
    ap.add_argument("--compute-type", default="int8", help="int8 (int8 weights, int8 GEMM) or float32")
    args = ap.parse_args()
    import ctranslate2
    import sentencepiece as spm
    ckpt, cache = Path(args.checkpoint), Path(args.cache)
    if not (cache / "model.bin").is_file():
        convert(ckpt, cache, args.compute_type)
    sp = spm.SentencePieceProcessor(model_file=str(ckpt / "tokenizer.model"))
    prompts = [line.replace("\\n", "\n") for line in Path(args.prompts).read_text().split("\n") if line]
    starts = [[f"t{i}" for i in (sp.encode(p, out_type=int) or [2])] for p in prompts]
    gen = ctranslate2.Generator(str(cache), device="cpu", compute_type=args.compute_type, intra_threads=args.threads)

    def run(n):
        t0 = time.perf_counter()
        out = gen.generate_batch(starts, max_length=n, min_length=n, sampling_topk=1, include_prompt_in_result=False,
                                 end_token=[])
        return time.perf_counter() - t0, out

    run(2)   # warm-up: the first call allocates
    t1, _ = run(1)
    tn, out = run(args.tokens)
    counts = [len(r.sequences_ids[0]) for r in out]
    if any(c != args.tokens for c in counts):
        fail(f"CTranslate2 generated {counts} tokens per prompt, not {args.tokens}")
    print(json.dumps({"secs": tn, "prefill_s": t1, "decode_s": tn - t1, "decode_steps": args.tokens - 1,
                      "batch": len(starts), "counts": counts, "tokens": [r.sequences_ids[0] for r in out]}))


if __name__ == "__main__":
    main()
