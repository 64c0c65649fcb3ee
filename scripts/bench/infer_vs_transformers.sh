#!/usr/bin/env bash
# infer_vs_transformers.sh: greedy decoding speed and peak memory of `colossal infer` against Hugging Face
# transformers' generate (scripts/bench/hf_generate.py: GPT2LMHeadModel for our checkpoints, AutoModelForCausalLM for a
# Hugging Face directory such as OPT's or BLOOM's) on the same directory, the same
# prompts (the same token ids: both sides tokenise with the directory's tokenizer: tokenizer.model without BOS/EOS,
# or Hugging Face tokenizer files with their special tokens), the
# same number of new tokens (exactly N on both sides) and the same thread count, at batch 1 and batch 4 (left
# padding with an attention mask on both sides). The commands alternate in rounds (colossal, transformers, ...) so
# drift on a shared machine hits them alike; each row shows medians over the rounds.
#
# Decode speed is decode forwards x batch / their seconds, prefill and loading excluded: colossal infer logs the
# split ("timing: prefill P tokens in X ms | decode S steps x B sequences in D s"), and hf_generate.py times the
# same span (from the prefill's logits to the end of generate: n - 1 one-token forwards, as the first new token
# comes from the prefill). A colossal binary without that line is timed on its whole generate call ("generated X
# tokens for P prompt(s) in S s"), the peer likewise (n tokens, prefill included).
# Peak memory is the whole process's max RSS as /usr/bin/time sees it. Each row also prints the memory-bandwidth
# bound: this machine's read bandwidth (scripts/bench/read_bandwidth.py: a sum and a matrix-vector product over a
# 1 GiB float32 tensor with the same threads, the best over both and the rounds) against what the decode steps must read: every weight once a
# step for the whole batch (a tied head counted once), and each sequence's KV cache at its length that step (keys
# and values of every layer, fp32); and each side's fraction of it.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/bench/default_checkpoint.sh   # DEFAULT_CKPT_RUN, resolve, default_checkpoint
COMMAND="scripts/bench/infer_vs_transformers.sh"
(($# == 0)) || COMMAND+="$(printf ' %q' "$@")"

usage() {
  cat <<EOF
usage: scripts/bench/infer_vs_transformers.sh [--batch 1|4|all] [--tokens N] [--threads N] [--repeat N]
                                             [--checkpoint DIR] [--python PY] [--colossal BIN] [--timeout S]
  --batch      prompts decoded together: 1, 4 or all (1 and 4); default all
  --tokens     new tokens per prompt, exactly, on both sides; default 256
  --threads    threads for both sides (OMP_NUM_THREADS, torch.set_num_threads); default nproc ($(nproc))
  --repeat     alternating rounds, medians taken over them; default 3
  --checkpoint a colossal checkpoint (or its run or checkpoints directory) or a Hugging Face model directory with
               its tokenizer files (scripts/bench/make_hf_dir.py makes opt-125m's); default: a GPT-2 124M shape with an
               8192-piece KJV tokenizer, trained 2 steps into $DEFAULT_CKPT_RUN if missing
  --python     Python for transformers (pip-installed into it with sentencepiece if missing); default .venv/bin/python
  --colossal   the binary; default build/colossal
  --timeout    seconds one command may run before it counts as failed; default 900
EOF
}

batch=all tokens=256 threads="$(nproc)" repeat=3 checkpoint="" timeout_s=900
COLOSSAL=build/colossal
PY=.venv/bin/python
while (($#)); do
  case "$1" in
    --batch) batch="${2:?--batch needs 1, 4 or all}"; shift 2 ;;
    --tokens) tokens="${2:?--tokens needs a number}"; shift 2 ;;
    --threads) threads="${2:?--threads needs a number}"; shift 2 ;;
    --repeat) repeat="${2:?--repeat needs a number}"; shift 2 ;;
    --checkpoint) checkpoint="${2:?--checkpoint needs a directory}"; shift 2 ;;
    --python) PY="${2:?--python needs a path}"; shift 2 ;;
    --colossal) COLOSSAL="${2:?--colossal needs a path}"; shift 2 ;;
    --timeout) timeout_s="${2:?--timeout needs seconds}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "infer_vs_transformers: error: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
case "$batch" in
  1|4) batches=("$batch") ;;
  all) batches=(1 4) ;;
  *) echo "infer_vs_transformers: error: --batch '$batch' is not one of 1, 4, all" >&2; exit 2 ;;
esac
for v in tokens threads repeat timeout_s; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] ||
    { echo "infer_vs_transformers: error: --${v%_s} '${!v}' is not a positive integer" >&2; exit 2; }
done
((tokens >= 2)) || { echo "infer_vs_transformers: error: --tokens 1 leaves no decode step to time (use 2 or more)" >&2; exit 2; }

[ -x "$COLOSSAL" ] || { echo "infer_vs_transformers: error: $COLOSSAL not found; build it with scripts/build.sh" >&2; exit 1; }
[ -x "$PY" ] || { echo "infer_vs_transformers: error: $PY not found; create it with scripts/setup.sh" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "infer_vs_transformers: error: /usr/bin/time not found (apt-get install time)" >&2; exit 1; }
"$PY" -c 'import torch' 2>/dev/null || { echo "infer_vs_transformers: error: $PY has no torch; run scripts/setup.sh" >&2; exit 1; }
if ! "$PY" -c 'import transformers, sentencepiece' 2>/dev/null; then
  echo "infer_vs_transformers: installing transformers and sentencepiece into $PY's environment" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check transformers sentencepiece >&2 ||
    { echo "infer_vs_transformers: error: '$PY -m pip install transformers sentencepiece' failed" >&2; exit 1; }
  "$PY" -c 'import transformers, sentencepiece' ||
    { echo "infer_vs_transformers: error: $PY still cannot import transformers and sentencepiece" >&2; exit 1; }
fi

if [ -z "$checkpoint" ]; then
  ckpt="$(default_checkpoint infer_vs_transformers "$COLOSSAL")" || exit 1
else
  [ -e "$checkpoint" ] || { echo "infer_vs_transformers: error: --checkpoint $checkpoint: no such directory" >&2; exit 1; }
  ckpt="$(resolve "$checkpoint")" ||
    { echo "infer_vs_transformers: error: --checkpoint $checkpoint: no model.safetensors, latest or checkpoints/latest in it" >&2; exit 1; }
fi
for f in model.safetensors config.json; do
  [ -f "$ckpt/$f" ] || { echo "infer_vs_transformers: error: checkpoint $ckpt has no $f" >&2; exit 1; }
done
[ -f "$ckpt/tokenizer.model" ] || [ -f "$ckpt/tokenizer.json" ] || [ -f "$ckpt/vocab.json" ] ||
  { echo "infer_vs_transformers: error: checkpoint $ckpt has no tokenizer files" >&2; exit 1; }

TMP="$(mktemp -d "${TMPDIR:-/tmp}/infer_vs_transformers.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
# Four prompts of different lengths (so batch 4 pads); batch 1 decodes the first.
cat >"$TMP/prompts-4.txt" <<'EOF'
In the beginning God created the heaven and the earth.
And God said, Let there be light: and there was light.
The LORD is my shepherd; I shall not want.
For God so loved the world, that he gave his only begotten Son, that whosoever believeth in him should not perish,
EOF
head -n 1 "$TMP/prompts-4.txt" >"$TMP/prompts-1.txt"

# Model label and the bytes one decode step reads: every parameter once (a tied head is the embedding); and the
# check that the longest prompt plus the new tokens fits the context (colossal would quietly generate fewer).
info="$("$PY" - "$ckpt" "$TMP/prompts-${batches[-1]}.txt" "$tokens" <<'EOF'
import json, struct, sys
from pathlib import Path
d, prompts, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
try:
    cfg = json.loads((d / "config.json").read_text())
    with open(d / "model.safetensors", "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    get = lambda *keys: next((cfg[k] for k in keys if k in cfg), None)
    shape = (get("n_layer", "num_hidden_layers"), get("n_head", "num_attention_heads"), get("n_embd", "hidden_size"))
    vocab = cfg["vocab_size"]
    context = get("n_positions", "max_position_embeddings", "seq_length") or 2048
    tied = cfg.get("tie_word_embeddings", True)
    total = sum(t["data_offsets"][1] - t["data_offsets"][0] for name, t in header.items()
                if name != "__metadata__" and not name.endswith((".attn.bias", ".attn.masked_bias"))
                and not (tied and name == "lm_head.weight"))
    if (d / "tokenizer.model").is_file():
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=str(d / "tokenizer.model"))
        count = lambda p: len(sp.encode(p))
    else:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(str(d))
        count = lambda p: len(tok(p).input_ids)
except (OSError, ValueError, KeyError, TypeError, RuntimeError, struct.error) as e:
    sys.exit(f"infer_vs_transformers: error: checkpoint {d}: cannot read config.json, model.safetensors and "
             f"its tokenizer ({type(e).__name__}: {e})")
longest = max(count(p) for p in Path(prompts).read_text().splitlines() if p)
if longest + n > context:
    sys.exit(f"infer_vs_transformers: error: --tokens {n} and the longest prompt's {longest} tokens pass the model's "
             f"context of {context} (use --tokens {context - longest} or fewer)")
known = {(12, 12, 768): "gpt2-124m", (24, 16, 1024): "gpt2-350m", (36, 20, 1280): "gpt2-774m", (48, 25, 1600): "gpt2-1.5b"}
family = cfg.get("model_type", "gpt2")
label = known.get(shape, "gpt-L{}-H{}-C{}".format(*shape)) if family == "gpt2" else "{}-L{}-H{}-C{}".format(family, *shape)
print(f"{label}/v{vocab}", total, 2 * shape[0] * shape[2] * 4)   # and the KV cache's bytes per token of context
EOF
)" || exit 1
read -r label param_bytes kv_bytes <<<"$info"

# run_one NAME CMD...: runs CMD under /usr/bin/time and a timeout, leaving $TMP/NAME.{rc,rss,out,err,reason}.
run_one() {
  local out="$TMP/$1" rc=0; shift
  OMP_NUM_THREADS="$threads" /usr/bin/time -f '%M' -o "$out.rss" timeout --kill-after=30 "$timeout_s" "$@" \
    >"$out.out" 2>"$out.err" || rc=$?
  echo "$rc" >"$out.rc"
  if ((rc == 124 || rc == 137)); then
    echo "timed out after $timeout_s s" >"$out.reason"
  elif ((rc != 0)); then
    { grep -v '^[[:space:]]*$' "$out.err" | tail -n 1 | cut -c1-200; } >"$out.reason" || true
    [ -s "$out.reason" ] || echo "exit status $rc" >"$out.reason"
  fi
  return "$rc"
}

for ((r = 1; r <= repeat; r++)); do
  echo "infer_vs_transformers: $label round $r/$repeat" >&2
  OMP_NUM_THREADS="$threads" "$PY" scripts/bench/read_bandwidth.py --threads "$threads" >"$TMP/bw-$r" ||
    { echo "infer_vs_transformers: error: measuring memory bandwidth with $PY failed" >&2; exit 1; }
  for B in "${batches[@]}"; do
    if ! run_one "colossal-$B-$r" "$COLOSSAL" infer "$ckpt" --prompts "$TMP/prompts-$B.txt" --greedy -n "$tokens" \
        --jsonl --device cpu; then
      echo "infer_vs_transformers: error: colossal infer at B=$B failed ($(cat "$TMP/colossal-$B-$r.reason")); its stderr ends:" >&2
      tail -n 20 "$TMP/colossal-$B-$r.err" >&2
      exit 1
    fi
    if ! run_one "transformers-$B-$r" "$PY" scripts/bench/hf_generate.py --checkpoint "$ckpt" \
        --prompts "$TMP/prompts-$B.txt" --tokens "$tokens" --threads "$threads"; then
      echo "infer_vs_transformers: error: transformers at B=$B failed ($(cat "$TMP/transformers-$B-$r.reason")); its stderr ends:" >&2
      tail -n 20 "$TMP/transformers-$B-$r.err" >&2
      exit 1
    fi
  done
done

"$PY" - "$TMP" "$ckpt" "$label" "$param_bytes" "$kv_bytes" "$tokens" "$repeat" "$threads" "${batches[@]}" <<'EOF'
import json, re, statistics, sys
from pathlib import Path
d, ckpt, label = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
param_bytes, kv_bytes, n, repeat, threads = (int(v) for v in sys.argv[4:9])
batches = [int(b) for b in sys.argv[9:]]
if (Path(ckpt) / "tokenizer.model").is_file():
    import sentencepiece as spm
    decode_ids = spm.SentencePieceProcessor(model_file=str(Path(ckpt) / "tokenizer.model")).decode
else:   # a Hugging Face directory: its own tokenizer, special tokens left out as colossal prints completions
    from transformers import AutoTokenizer
    hf_tok = AutoTokenizer.from_pretrained(ckpt)
    decode_ids = lambda ids: hf_tok.decode(ids, skip_special_tokens=True)
total_line = re.compile(r"generated (\d+) tokens for (\d+) prompt\(s\) in ([0-9.]+) s")
split_line = re.compile(r"timing: prefill (\d+) tokens in ([0-9.]+) ms \| decode (\d+) steps x (\d+) sequences in ([0-9.]+) s")

def fail(msg):
    sys.exit(f"infer_vs_transformers: error: {msg}")

def rss(name):
    return int((d / f"{name}.rss").read_text().split()[-1]) * 1024   # /usr/bin/time %M is KB

def colossal(B, r):
    """One colossal infer run, its counts checked: {total_s, prefill_s, decode_s, decode_steps, rss, texts}."""
    name = f"colossal-{B}-{r}"
    err = (d / f"{name}.err").read_text()
    m = total_line.search(err)
    if not m:
        fail(f"colossal infer at B={B} printed no 'generated X tokens for P prompt(s) in S s' line on stderr")
    rows = [json.loads(line) for line in (d / f"{name}.out").read_text().splitlines() if line.startswith("{")]
    counts = [row["completion_tokens"] for row in rows]
    if len(rows) != B or counts != [n] * B or int(m[1]) != n * B:
        reasons = sorted({str(row.get("finish_reason")) for row in rows})
        fail(f"colossal infer at B={B} generated {counts} tokens per prompt ({m[1]} in all; finish {reasons}), not "
             f"{n} each: it stops at EOS and has no flag to ignore it; try fewer --tokens or another checkpoint")
    if (t := re.search(r"on cpu \((\d+) threads?\)", err)) and int(t[1]) != threads:
        fail(f"colossal infer ran on {t[1]} threads, not {threads} (is OMP_NUM_THREADS overridden?)")
    res = {"total_s": float(m[3]), "rss": rss(name), "texts": [row["completion"] for row in rows]}
    if t := split_line.search(err):
        if int(t[3]) != n - 1 or int(t[4]) != B:
            fail(f"colossal infer at B={B} timed {t[3]} decode steps x {t[4]} sequences, not {n - 1} x {B}")
        res.update(prefill_s=float(t[2]) / 1e3, decode_s=float(t[5]))
    return res

def transformers(B, r):
    name = f"transformers-{B}-{r}"
    lines = [line for line in (d / f"{name}.out").read_text().splitlines() if line.startswith("{")]
    if not lines:
        fail(f"transformers at B={B} printed no result JSON")
    res = json.loads(lines[-1])
    if res["threads"] != threads:
        fail(f"transformers ran on {res['threads']} threads, not {threads}")
    if res["completion_tokens"] != [n] * B:
        fail(f"transformers at B={B} generated {res['completion_tokens']} tokens per prompt, not {n} each")
    return {"total_s": res["secs"], "prefill_s": res["prefill_s"], "decode_s": res["decode_s"], "rss": rss(name),
            "result": res}

def agreement(ids, text):
    """How many of transformers' greedy tokens colossal's completion text starts with."""
    for k in range(1, len(ids) + 1):
        if not text.startswith(decode_ids(ids[:k]).rstrip("\ufffd")):
            return k - 1
    return len(ids)

bw = max(float((d / f"bw-{r}").read_text()) for r in range(1, repeat + 1))
fmt = lambda v: f"{v:.0f}" if v >= 100 else f"{v:.1f}"
for B in batches:
    ours = [colossal(B, r) for r in range(1, repeat + 1)]
    peer = [transformers(B, r) for r in range(1, repeat + 1)]
    # Decode only (prefill excluded: n - 1 one-token forwards) where colossal logs its split; else each side's
    # whole generate call (the prefill of a short prompt included: n tokens).
    split = all("decode_s" in o for o in ours)
    key, steps = ("decode_s", n - 1) if split else ("total_s", n)
    if not split:
        print("infer_vs_transformers: note: colossal infer logs no 'timing: prefill ... | decode ...' line; using "
              "each side's whole generate time (prefill included)", file=sys.stderr)
    c_tps = statistics.median(steps * B / o[key] for o in ours)
    t_tps = statistics.median(steps * B / p[key] for p in peer)
    c_rss = statistics.median(o["rss"] for o in ours)
    t_rss = statistics.median(p["rss"] for p in peer)
    res = peer[0]["result"]
    # Decode step s (1 to n - 1) reads the weights once and each sequence's cache of its prompt + s tokens.
    read = sum(param_bytes + sum(kv_bytes * (p + s) for p in res["prompt_tokens"]) for s in range(1, n))
    bound = (n - 1) * B / (read / (bw * 1e9))
    agree = [agreement(ids, text) for ids, text in zip(res["ids"], ours[0]["texts"])]
    weak = " (each row repeats one token: a weak check on this checkpoint)" if all(len(set(ids)) == 1 for ids in res["ids"]) else ""
    prefill = (f"colossal {statistics.median(o['prefill_s'] for o in ours) * 1e3:.0f} ms, " if split else "") + \
        f"transformers {statistics.median(p['prefill_s'] for p in peer) * 1e3:.0f} ms"
    print(f"infer_vs_transformers: B={B} new tokens per prompt: colossal {[n] * B}, transformers "
          f"{res['completion_tokens']}; greedy tokens agreeing from the start: {agree} of {n}{weak}; prefill of "
          f"{res['prompt_tokens']} prompt tokens: {prefill} (transformers: {res['attn_implementation']} attention, "
          f"{res['threads']} threads)", file=sys.stderr)
    for i, (a, ids) in enumerate(zip(agree, res["ids"])):
        if a < n:
            theirs = sp.decode(ids[:a + 8])
            print(f"infer_vs_transformers: B={B} prompt {i + 1}: first difference at token {a + 1}: transformers "
                  f"{theirs!r}, colossal {ours[0]['texts'][i][:len(theirs) + 8]!r}", file=sys.stderr)
    print(f"{label} B={B} n={n}  colossal {fmt(c_tps)} tok/s {c_rss / 1e9:.2f} GB | transformers {fmt(t_tps)} tok/s "
          f"{t_rss / 1e9:.2f} GB ({c_tps / t_tps:.2f}x, mem {c_rss / t_rss:.2f}x) | bound {fmt(bound)} tok/s at "
          f"{bw:.1f} GB/s: colossal {c_tps / bound:.2f}, transformers {t_tps / bound:.2f}", flush=True)
EOF

versions="$("$PY" -c 'import importlib.metadata as m; print("torch", m.version("torch") + ", transformers", m.version("transformers"))')"
echo "machine: $(bash scripts/bench/cpu_line.sh), $(nproc) cores, threads $threads, $versions, $(date +%F), $COMMAND," \
  "median of $repeat alternating rounds"
