#!/usr/bin/env python3
"""hf_generate.py: the transformers side of scripts/bench/infer_vs_transformers.sh.

Greedy-decodes a colossal checkpoint (HF layout: model.safetensors, config.json as GPT2Config, tokenizer.model)
with GPT2LMHeadModel.generate, or a Hugging Face model directory with its tokenizer files (OPT, BLOOM, ...) with
AutoModelForCausalLM.generate, on the prompts colossal infer reads from the same file and tokenised as colossal
tokenises them (SentencePiece: no BOS or EOS added, an empty prompt becomes [EOS]; a Hugging Face tokenizer: with
its special tokens, as tokenizer(prompt) and colossal infer add them), left-padded with an attention mask as
colossal pads (with the end-of-text id). Exactly --tokens new tokens per prompt: min_new_tokens = max_new_tokens, so EOS never ends
a row early. Prints one JSON object: generate()'s wall time split, as colossal infer's timing line splits it, into
the prefill (to its logits) and the decode (the n - 1 one-token forwards that follow, with token selection), model
loading excluded; the new-token count of each row; and the new token ids and text of each row. --device cuda puts
the model and the inputs on the GPU and synchronizes it at the span's ends (the prefill's logits too).
"""
import argparse
import json
import sys
import time
from pathlib import Path

EOS = 2   # colossal's Tokenizer::kEos: the padding id too


def fail(msg):
    sys.exit(f"hf_generate: error: {msg}")


def read_prompts(path):
    """One prompt per line, blank lines skipped, backslash-n for a newline: colossal infer --prompts' rules."""
    try:
        lines = Path(path).read_text(encoding="utf-8").split("\n")
    except OSError as e:
        fail(f"prompts file {path}: {e.strerror}")
    prompts = [line.replace("\\n", "\n") for line in lines if line]
    if not prompts:
        fail(f"prompts file {path}: no prompts (one per line)")
    return prompts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True, help="one checkpoint directory (model.safetensors or its sharded index, config.json, tokenizer.model)")
    ap.add_argument("--prompts", required=True, help="file with one prompt per line; all of them run as one batch")
    ap.add_argument("--tokens", type=int, required=True, help="new tokens per prompt, exactly")
    ap.add_argument("--threads", type=int, required=True, help="torch.set_num_threads")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the model and the inputs live")
    ap.add_argument("--offload-folder", help="accelerate's disk offload: every block's weights in this folder, "
                    "loaded as the block runs (the peer of colossal infer --stream-weights)")
    args = ap.parse_args()
    if args.offload_folder and args.device != "cpu":
        fail("--offload-folder keeps the model on the CPU; it does not combine with --device cuda")

    import torch
    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        fail(f"--device cuda but torch {torch.__version__} sees no GPU")
    import sentencepiece as spm
    import transformers
    from transformers import GPT2LMHeadModel, LogitsProcessor, LogitsProcessorList

    ckpt = Path(args.checkpoint)
    prompts = read_prompts(args.prompts)
    if not (ckpt / "tokenizer.model").is_file():
        return generate_hf_directory(ckpt, prompts, args.tokens, args.device, transformers, LogitsProcessor, LogitsProcessorList)
    for name in ("config.json", "tokenizer.model"):
        if not (ckpt / name).is_file():
            fail(f"checkpoint {ckpt}: no {name}")
    if not (ckpt / "model.safetensors").is_file() and not (ckpt / "model.safetensors.index.json").is_file():
        fail(f"checkpoint {ckpt}: no model.safetensors or model.safetensors.index.json")
    sp = spm.SentencePieceProcessor(model_file=str(ckpt / "tokenizer.model"))
    encoded = [sp.encode(p, out_type=int) or [EOS] for p in prompts]

    offload = {}
    if args.offload_folder:   # blocks on disk, embeddings, final norm and the tied head in memory
        n_layer = json.loads((ckpt / "config.json").read_text())["n_layer"]
        device_map = {"transformer.wte": "cpu", "transformer.wpe": "cpu", "transformer.drop": "cpu", "transformer.ln_f": "cpu",
                      "lm_head": "cpu", **{f"transformer.h.{i}": "disk" for i in range(n_layer)}}
        offload = {"device_map": device_map, "offload_folder": args.offload_folder, "offload_state_dict": False}
    model, info = GPT2LMHeadModel.from_pretrained(str(ckpt), dtype=torch.float32, output_loading_info=True, **offload)
    buffers = (".attn.bias", ".attn.masked_bias")   # causal-mask buffers older checkpoints carry; not weights
    missing = [k for k in info.get("missing_keys", []) if k != "lm_head.weight" and not k.endswith(buffers)]
    unexpected = [k for k in info.get("unexpected_keys", []) if not k.endswith(buffers)]
    mismatched = list(info.get("mismatched_keys", []))
    if missing or unexpected or mismatched:
        fail(f"checkpoint {ckpt} does not load cleanly into GPT2LMHeadModel: missing {missing[:4]}, "
             f"unexpected {unexpected[:4]}, mismatched {mismatched[:4]}")
    if model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr():
        fail(f"checkpoint {ckpt}: transformers did not tie lm_head to wte (colossal's head is tied)")
    model.eval()
    if args.device == "cuda":   # not otherwise: a model dispatched with an offload folder must not be moved
        model.to("cuda")

    report(model, encoded, args.tokens, model.config.n_positions, EOS, lambda row: sp.decode(row), transformers,
           LogitsProcessor, LogitsProcessorList, args.device)


def generate_hf_directory(ckpt, prompts, n, device, transformers, LogitsProcessor, LogitsProcessorList):
    """A Hugging Face directory: AutoTokenizer with special tokens, AutoModelForCausalLM, padding with EOS."""
    import torch
    tok = transformers.AutoTokenizer.from_pretrained(str(ckpt))
    eos = tok.eos_token_id
    if eos is None:
        fail(f"{ckpt}: the tokenizer names no eos_token")
    encoded = [tok(p).input_ids or [eos] for p in prompts]
    model = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32)
    cfg = model.config
    context = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None) or \
        getattr(cfg, "seq_length", None) or 2048
    report(model.eval().to(device), encoded, n, context, eos, lambda row: tok.decode(row, skip_special_tokens=True), transformers,
           LogitsProcessor, LogitsProcessorList, device)


def report(model, encoded, n, context, EOS, decode, transformers, LogitsProcessor, LogitsProcessorList, device):
    """Generates exactly n new tokens per prompt, left-padded with EOS, on `device` (where the model is), and prints the timing JSON."""
    import torch
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)   # the GPU's queue drained at the span's ends
    b, longest = len(encoded), max(len(ids) for ids in encoded)
    if longest + n > context:
        fail(f"the longest prompt has {longest} tokens; with --tokens {n} that passes the context of {context} "
             f"(use at most {context - longest} tokens)")
    input_ids = torch.full((b, longest), EOS, dtype=torch.long)
    attention_mask = torch.zeros((b, longest), dtype=torch.long)
    for i, ids in enumerate(encoded):
        input_ids[i, longest - len(ids):] = torch.tensor(ids, dtype=torch.long)
        attention_mask[i, longest - len(ids):] = 1
    if device == "cuda":
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)

    class Stamp(LogitsProcessor):
        """Records when the prefill's logits arrive: generate() calls it once after each forward."""
        def __init__(self):
            self.first = None

        def __call__(self, ids, scores):
            if self.first is None:
                sync()
                self.first = time.perf_counter()
            return scores

    stamp = Stamp()
    with torch.inference_mode():
        sync()
        t0 = time.perf_counter()
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=False, num_beams=1,
                             max_new_tokens=n, min_new_tokens=n, pad_token_id=EOS, eos_token_id=EOS,
                             bos_token_id=1, use_cache=True, logits_processor=LogitsProcessorList([stamp]))
        sync()
        t1 = time.perf_counter()
    rows = [row[longest:].tolist() for row in out]
    counts = [row.index(EOS) if EOS in row else len(row) for row in rows]   # EOS suppressed: every row should be n
    print(json.dumps({
        "secs": t1 - t0,                   # the whole generate call: prefill and n - 1 decode forwards
        "prefill_s": stamp.first - t0,     # to the prefill's logits
        "decode_s": t1 - stamp.first,      # the n - 1 one-token forwards, selection included
        "decode_steps": n - 1,
        "batch": b,
        "prompt_tokens": [len(ids) for ids in encoded],
        "completion_tokens": counts,
        "ids": rows,
        "texts": [decode(row[:c]) for row, c in zip(rows, counts)],
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "device": device,
        "threads": torch.get_num_threads(),
        "transformers": transformers.__version__,
    }))


if __name__ == "__main__":
    main()
