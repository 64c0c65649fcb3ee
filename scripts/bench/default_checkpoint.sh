# Sourced by the inference benchmarks (infer_vs_transformers.sh, stream_infer.sh): one checkpoint they
# share, GPT-2 124M's shape with an 8192-piece vocabulary trained two tiny steps (the weights only need
# to be a real checkpoint), and the resolution of a run, checkpoints or checkpoint directory.

DEFAULT_CKPT_RUN=runs/bench/gpt2-124m-v8192

# resolve DIR: one checkpoint directory (as colossal infer resolves a run, checkpoints or checkpoint directory).
resolve() {
  local d="${1%/}"
  if { [ -f "$d/model.safetensors" ] || [ -f "$d/model.safetensors.index.json" ]; } && [ -f "$d/config.json" ]; then echo "$d"
  elif [ -f "$d/latest" ]; then echo "$d/$(cat "$d/latest")"
  elif [ -f "$d/checkpoints/latest" ]; then echo "$d/checkpoints/$(cat "$d/checkpoints/latest")"
  else return 1
  fi
}

# default_checkpoint NAME COLOSSAL [LAYERS WIDTH]: the shared checkpoint's directory, trained first when
# missing (tokenizer and dataset too); NAME prefixes the messages. LAYERS and WIDTH give another shape
# (its own run directory; heads of 64; one step of SGD without momentum, so that a model near the
# machine's memory can be made at all and its checkpoint holds no optimizer state).
default_checkpoint() {
  local name="$1" colossal="$2" layers="${3:-}" width="${4:-}" ckpt run="$DEFAULT_CKPT_RUN" shape=()
  if [ -n "$layers" ]; then
    run="runs/bench/gpt-l$layers-w$width-v8192"
    shape=(--set "model.n_layer=$layers" --set "model.n_embd=$width" --set "model.n_head=$((width / 64))" --set optim.name=sgd
           --set optim.momentum=0 --set train.max_steps=1)
  fi
  if ckpt="$(resolve "$run")"; then echo "$ckpt"; return; fi
  echo "$name: no checkpoint in $run; training one (tokenizer and dataset too if missing)" >&2
  "$colossal" train recipes/gpt2-124m.toml --set model.vocab_size=8192 --set data.text=data/kjv/kjv.txt \
    --set data.tokenizer=runs/data/kjv-bpe-8192.model --set data.dataset=runs/data/kjv-bpe-8192.h5 \
    --set data.tokenizer_vocab=8192 --set train.max_steps=2 --set train.batch_size=1 --set train.grad_accum=1 \
    --set train.seq_len=128 --set train.eval_every=0 --set train.eval_batches=1 --set train.device=cpu \
    --set optim.warmup_steps=1 --set checkpoint.every=0 --set checkpoint.keep_last=1 \
    --set "output.dir=$run" --set "checkpoint.dir=$run/checkpoints" "${shape[@]}" --quiet >&2 ||
    { echo "$name: error: training the default checkpoint into $run failed" >&2; return 1; }
  resolve "$run" || { echo "$name: error: colossal train wrote no checkpoint under $run" >&2; return 1; }
}
