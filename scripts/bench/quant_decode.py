#!/usr/bin/env python3
"""quant_decode.py: the driver of scripts/bench/quant_decode.sh (see there for what it measures)."""
import argparse
import json
import os
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = [
    "In the beginning God created the heaven and the earth.",
    "And God said, Let there be light: and there was light.",
    "The LORD is my shepherd; I shall not want.",
    "For God so loved the world, that he gave his only begotten Son, that whosoever believeth in him should not perish,",
    "Blessed are the poor in spirit: for theirs is the kingdom of heaven.",
    "Vanity of vanities, saith the Preacher;",
    "Charity suffereth long, and is kind; charity envieth not;",
    "To every thing there is a season, and a time to every purpose under the heaven:",
]
SPLIT = re.compile(r"timing: prefill (\d+) tokens in ([0-9.]+) ms \| decode (\d+) steps x (\d+) sequences in ([0-9.]+) s")


def fail(msg):
    sys.exit(f"quant_decode: error: {msg}")


def weight_bytes(d):
    """Bytes one decode step reads from a model directory: every stored tensor once (the tied head is the embedding)."""
    with open(d / "model.safetensors", "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    return sum(t["data_offsets"][1] - t["data_offsets"][0] for k, t in header.items()
               if k != "__metadata__" and not k.endswith((".attn.bias", ".attn.masked_bias")) and k != "lm_head.weight")


CAPS = ("COLOSSAL_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def timed(cmd, threads, timeout, device, extra_env=None):
    """Runs cmd under /usr/bin/time; returns (stdout, stderr, peak RSS bytes). On cuda the environment is kept
    (the GPU's driver libraries may be found through it). extra_env: variables added (COLOSSAL_CPU_ISA)."""
    with tempfile.NamedTemporaryFile() as rss:
        env = {"OMP_NUM_THREADS": str(threads), "PATH": "/usr/bin:/bin"}
        # the caps the machine line reports (cpu_line.sh) must reach the process they describe
        env.update({k: os.environ[k] for k in CAPS if k in os.environ})
        if device == "cuda":
            env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        env.update(extra_env or {})
        p = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss.name, *cmd], capture_output=True, text=True,
                           timeout=timeout, env=env)
        if p.returncode != 0:
            tail = "\n".join(p.stderr.strip().splitlines()[-5:])
            fail(f"{' '.join(cmd[:3])} ... failed (exit {p.returncode}):\n{tail}")
        return p.stdout, p.stderr, int(Path(rss.name).read_text().split()[-1]) * 1024


def bandwidth(py, threads, device, nbytes=1 << 30):
    """Read bandwidth in GB/s over nbytes (1 GiB: memory's) in host memory or on the GPU (read_bandwidth.py). A
    step's working set that fits the caches reads faster than memory delivers: read at its own size (one tensor,
    each read after the last, as each step reads the weights after the last step did), it gives that faster rate."""
    cmd = [py, str(Path(__file__).with_name("read_bandwidth.py")), "--threads", str(threads), "--bytes", str(nbytes), "--device", device]
    return float(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def machine_line(a):
    """The run's last line: the CPU (model, kernel set, caps), the GPU where it ran there, threads, torch, date, command."""
    import torch
    cpu = subprocess.run(["bash", "scripts/bench/cpu_line.sh"], capture_output=True, text=True).stdout.strip()
    gpu = f"GPU {torch.cuda.get_device_name(0)}, " if a.device == "cuda" else ""
    return (f"machine: {cpu}, {gpu}{a.threads} threads, torch {torch.__version__}, "
            f"{time.strftime('%Y-%m-%d')}, {a.command}, median of {a.repeat} alternating rounds")


PREFILL = re.compile(r"timing: prefill (\d+) tokens in ([0-9.]+) ms")


def long_prompts(sp, batch, tokens):
    """batch prompts of about `tokens` SentencePiece tokens each: consecutive pieces of the embedded corpus."""
    ids = sp.encode(Path("data/kjv/kjv.txt").read_text(encoding="utf-8")[: batch * tokens * 8])
    if len(ids) < batch * tokens:
        fail(f"--prefill {tokens}: the corpus' start gives only {len(ids)} tokens for {batch} prompts")
    return [sp.decode(ids[i * tokens:(i + 1) * tokens]).replace("\n", " ") for i in range(batch)]


def prefill_main(a, dirs, peers, sp, label):
    """--prefill: prefill tokens/s of each scheme (and each --isa cap of the quantized ones) and of the peers."""
    caps = [c for c in a.isa.split(",") if c]
    results = {}   # (side, B) -> tokens/s of each round
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(1, a.repeat + 1):
            print(f"quant_decode: {label} prefill round {r}/{a.repeat}", file=sys.stderr)
            for b in (int(x) for x in a.batches.split(",")):
                prompts = Path(tmp) / f"prompts-{b}.txt"
                prompts.write_text("\n".join(long_prompts(sp, b, a.prefill)) + "\n")
                for scheme, d in dirs.items():
                    for cap in [""] + (caps if scheme != "fp32" else []):
                        _, err, _ = timed([a.colossal, "infer", str(d), "--prompts", str(prompts), "--greedy", "-n", "1", "--jsonl",
                                           "--device", a.device], a.threads, a.timeout, a.device, {"COLOSSAL_CPU_ISA": cap} if cap else None)
                        m = PREFILL.search(err)
                        if not m:
                            fail(f"colossal infer on {d} printed no timing line")
                        results.setdefault((scheme + (f" {cap}" if cap else ""), b), []).append(int(m[1]) / (float(m[2]) / 1e3))
                for peer in peers:
                    out, _, _ = timed([a.python, "scripts/bench/hf_generate.py", "--checkpoint", str(dirs["fp32"]), "--prompts", str(prompts),
                                       "--tokens", "1", "--threads", str(a.threads), "--device", a.device], a.threads, a.timeout, a.device)
                    j = json.loads(out.strip().splitlines()[-1])
                    tokens = sum(len(sp.encode(p)) for p in prompts.read_text().splitlines() if p)
                    results.setdefault((peer, b), []).append(tokens / j["prefill_s"])
    med = lambda k: statistics.median(results[k])
    for b in (int(x) for x in a.batches.split(",")):
        cells = []
        for scheme in dirs:
            tps = med((scheme, b))
            extra = [] if scheme == "fp32" else [f"{tps / med(('fp32', b)):.2f}x fp32"]
            for cap in caps if scheme != "fp32" else []:
                capped = med((f"{scheme} {cap}", b))
                extra.append(f"{cap} {capped:.0f} tok/s, {tps / capped:.2f}x")
            cells.append(f"{scheme} {tps:.0f} tok/s" + (f" ({'; '.join(extra)})" if extra else ""))
        for peer in peers:
            mine = "int8" if "int8" in dirs else "fp32"
            cells.append(f"transformers fp32 {med((peer, b)):.0f} tok/s ({mine} {med((mine, b)) / med((peer, b)):.2f}x)")
        print(f"{label} B={b} prefill of about {a.prefill} tokens each " + " | ".join(cells))
    print(machine_line(a))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--colossal", required=True)
    ap.add_argument("--python", required=True)
    ap.add_argument("--fp32", required=True)
    ap.add_argument("--int8", help="the int8-weight directory (each quantized scheme given is measured)")
    ap.add_argument("--int4", help="the int4-weight directory")
    ap.add_argument("--int8-smoothquant", help="the int8-smoothquant directory")
    ap.add_argument("--ct2-cache", required=True)
    ap.add_argument("--batches", required=True)
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--repeat", type=int, required=True)
    ap.add_argument("--timeout", type=int, required=True)
    ap.add_argument("--peers", required=True, help="comma-separated: transformers, ctranslate2 (or none)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--op-by-op", action="store_true",
                    help="cuda: each scheme also with --no-cuda-graphs (its steps launched op by op), and the graphs' ratio over it")
    ap.add_argument("--kv-cache", default="",
                    help="comma-separated fp16, bf16, int8: each scheme also with its KV cache so (colossal infer --kv-cache), "
                         "with the ratio to the fp32 cache")
    ap.add_argument("--prefill", type=int, default=0, help="prompts of about this many tokens; prefill tokens/s instead of decoding's")
    ap.add_argument("--isa", default="", help="with --prefill: comma-separated COLOSSAL_CPU_ISA caps to run the quantized schemes under too")
    ap.add_argument("--command", required=True)
    a = ap.parse_args()
    kv_kinds = [k for k in a.kv_cache.split(",") if k]
    for k in kv_kinds:
        if k not in ("fp16", "bf16", "int8"):
            fail(f"--kv-cache {k!r} is not fp16, bf16 or int8")
    dirs = {"fp32": Path(a.fp32)}
    dirs.update({k: Path(v) for k, v in (("int8", a.int8), ("int4", a.int4), ("int8-smoothquant", a.int8_smoothquant)) if v})
    peers = [p for p in a.peers.split(",") if p and p != "none"]
    cfg = json.loads((dirs["fp32"] / "config.json").read_text())
    layers, width = cfg["n_layer"], cfg["n_embd"]
    kv_per_token = 2 * layers * width * 4
    head_dim = width // cfg["n_head"]
    # bytes a narrower cache keeps per fp32 byte: 16 bits, or int8 rows of head_dim values and a 4-byte scale
    kv_fraction = {"fp16": 0.5, "bf16": 0.5, "int8": (head_dim + 4) / (4 * head_dim)}
    label = {(12, 768): "gpt2-124m", (24, 1024): "gpt2-350m"}.get((layers, width), f"gpt-L{layers}-C{width}") + f"/v{cfg['vocab_size']}"
    wbytes = {k: weight_bytes(d) for k, d in dirs.items()}
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(dirs["fp32"] / "tokenizer.model"))
    if a.prefill:
        return prefill_main(a, dirs, peers, sp, label)
    results = {}   # (side, B) -> list of (tok/s, rss)
    bw = 0.0
    bw_at = {k: 0.0 for k in dirs}   # each scheme's rate at its weights' size (faster where they fit a cache)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(1, a.repeat + 1):
            print(f"quant_decode: {label} round {r}/{a.repeat}", file=sys.stderr)
            bw = max(bw, bandwidth(a.python, a.threads, a.device))
            for scheme in dirs:
                bw_at[scheme] = max(bw_at[scheme], bandwidth(a.python, a.threads, a.device, wbytes[scheme]))
            for b in (int(x) for x in a.batches.split(",")):
                prompts = Path(tmp) / f"prompts-{b}.txt"
                prompts.write_text("\n".join(PROMPTS[:b]) + "\n")
                for scheme, d in dirs.items():
                    # (name suffix, extra options): the scheme as it is; op by op; with a 16-bit KV cache
                    variants = [("", [])] + ([(" op by op", ["--no-cuda-graphs"])] if a.op_by_op else []) + \
                               [(f" kv {k}", ["--kv-cache", k]) for k in kv_kinds]
                    for suffix, options in variants:
                        _, err, rss = timed([a.colossal, "infer", str(d), "--prompts", str(prompts), "--greedy", "-n", str(a.tokens),
                                             "--jsonl", "--device", a.device] + options, a.threads, a.timeout, a.device)
                        m = SPLIT.search(err)
                        if not m:
                            fail(f"colossal infer on {d} printed no timing line")
                        steps, seqs, secs = int(m[3]), int(m[4]), float(m[5])
                        if steps != a.tokens - 1 or seqs != b:
                            fail(f"colossal infer on {d} timed {steps} steps x {seqs}, not {a.tokens - 1} x {b}")
                        results.setdefault((scheme + suffix, b), []).append((steps * seqs / secs, rss))
                for peer in peers:
                    if peer == "transformers":
                        cmd = [a.python, "scripts/bench/hf_generate.py", "--checkpoint", str(dirs["fp32"]), "--prompts", str(prompts),
                               "--tokens", str(a.tokens), "--threads", str(a.threads), "--device", a.device]
                    else:
                        cmd = [a.python, "scripts/bench/ct2_generate.py", "--checkpoint", str(dirs["fp32"]), "--prompts", str(prompts),
                               "--tokens", str(a.tokens), "--threads", str(a.threads), "--cache", a.ct2_cache]
                    out, _, rss = timed(cmd, a.threads, a.timeout, a.device)
                    j = json.loads(out.strip().splitlines()[-1])
                    results.setdefault((peer, b), []).append((j["decode_steps"] * j["batch"] / j["decode_s"], rss))
    med = lambda k, i: statistics.median(v[i] for v in results[k])
    for b in (int(x) for x in a.batches.split(",")):
        # Mean context over the decode steps: the prompts' tokens plus half the new ones, each sequence's cache read once a step.
        ctx = sum(len(sp.encode(p)) for p in PROMPTS[:b]) / b + a.tokens / 2
        cells = []
        for scheme in dirs:
            step_bytes = wbytes[scheme] + b * ctx * kv_per_token
            bound = bw * 1e9 / step_bytes * b
            tps = med((scheme, b), 0)
            extra = "" if scheme == "fp32" else f", {tps / med(('fp32', b), 0):.2f}x fp32, mem {med((scheme, b), 1) / med(('fp32', b), 1):.2f}x"
            # where the weights fit a cache (their own size summed 1.2x faster than memory): the bound at that rate too
            if bw_at[scheme] > 1.2 * bw:
                cached = bw_at[scheme] * 1e9 / step_bytes * b
                extra += f"; {tps / cached:.2f} of {cached:.0f} at {bw_at[scheme]:.0f} GB/s, their size's"
            cells.append(f"{scheme} {tps:.1f} tok/s {med((scheme, b), 1) / 1e9:.2f} GB ({tps / bound:.2f} of {bound:.0f}{extra})")
            if a.op_by_op:
                slow = med((scheme + " op by op", b), 0)
                cells.append(f"{scheme} op by op {slow:.1f} tok/s ({slow / bound:.2f}; graphs {tps / slow:.2f}x)")
            for kind in kv_kinds:   # the same weights, fewer of the cache's bytes a step
                key = (f"{scheme} kv {kind}", b)
                narrow = med(key, 0)
                f = kv_fraction[kind]
                narrow_bound = bw * 1e9 / (wbytes[scheme] + b * ctx * kv_per_token * f) * b
                # the cache the generator allocates: every sequence at the longest prompt's length plus the new tokens (peak RSS
                # hardly moves with it: loading the weights sets the peak, and the cache grows into the memory it freed)
                cache_mb = b * (max(len(sp.encode(p)) for p in PROMPTS[:b]) + a.tokens) * kv_per_token / 1e6
                cells.append(f"{scheme} kv {kind} {narrow:.1f} tok/s {med(key, 1) / 1e9:.2f} GB ({narrow / narrow_bound:.2f} of "
                             f"{narrow_bound:.0f}; {narrow / tps:.2f}x the fp32 cache; cache {cache_mb * f:.0f} MB against {cache_mb:.0f})")
        for peer in peers:
            name = "transformers fp32" if peer == "transformers" else "ctranslate2 int8"
            tps = med((peer, b), 0)
            mine = "int8" if "int8" in dirs else "fp32"   # colossal's side to compare with
            cells.append(f"{name} {tps:.1f} tok/s {med((peer, b), 1) / 1e9:.2f} GB ({mine} {med((mine, b), 0) / tps:.2f}x)")
        print(f"{label} B={b} n={a.tokens} " + " | ".join(cells))
    read = ", ".join(f"{k} {v / 1e6:.0f} MB" for k, v in wbytes.items())
    whose = " (the GPU's)" if a.device == "cuda" else ""
    at_size = ", ".join(f"{k} {v:.1f}" for k, v in bw_at.items())
    print(f"weights read a step: {read} (all stored tensors, the tied embedding included); "
          f"bound = {bw:.1f} GB/s{whose} over weights + KV cache (the best 1 GiB sum or matrix-vector product; at the weights' own sizes, GB/s: {at_size})")
    print(machine_line(a))


if __name__ == "__main__":
    main()
