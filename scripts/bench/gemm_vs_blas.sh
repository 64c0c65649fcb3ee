#!/usr/bin/env bash
# gemm_vs_blas.sh: colossal's training GEMM (kernels/cpu/gemm) against ATen's BLAS call (MKL in the torch
# wheel) at every product of a real training step, both timed in the same process on the same inputs. It
# runs `colossal train` for two steps (the second sums weight gradients into their buffers: the dw+ form)
# N times and reads the engine's own first-use timings from each run's log (two warm-ups, then the fastest
# of five alternating calls per side; see src/nn/kernel_choice.h), then prints per product the median of
# each side over the runs, the ratio, and the sums over all products.
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMAND="scripts/bench/gemm_vs_blas.sh"
(($# == 0)) || COMMAND+="$(printf ' %q' "$@")"

usage() {
  cat <<EOF
usage: scripts/bench/gemm_vs_blas.sh [--shape tiny|124m] [--repeat N] [--colossal BIN]
  --shape    tiny (recipes/gpt-tiny.toml, T=128 B=16) or 124m (recipes/gpt2-124m.toml, T=256 B=4); default tiny
  --repeat   runs, medians taken over them; default 3
  --colossal the binary; default build/colossal
EOF
}

shape=tiny repeat=3 COLOSSAL=build/colossal
while (($#)); do
  case "$1" in
    --shape) shape="${2:?--shape needs tiny or 124m}"; shift 2 ;;
    --repeat) repeat="${2:?--repeat needs a number}"; shift 2 ;;
    --colossal) COLOSSAL="${2:?--colossal needs a path}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gemm_vs_blas: error: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
case "$shape" in
  tiny) recipe=recipes/gpt-tiny.toml T=128 B=16 ;;
  124m) recipe=recipes/gpt2-124m.toml T=256 B=4 ;;
  *) echo "gemm_vs_blas: error: --shape '$shape' is not one of tiny, 124m" >&2; exit 2 ;;
esac
[[ "$repeat" =~ ^[1-9][0-9]*$ ]] || { echo "gemm_vs_blas: error: --repeat '$repeat' is not a positive integer" >&2; exit 2; }
[ -x "$COLOSSAL" ] || { echo "gemm_vs_blas: error: $COLOSSAL not found; build it with scripts/build.sh" >&2; exit 1; }
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3

TMP="$(mktemp -d "${TMPDIR:-/tmp}/gemm_vs_blas.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
for ((r = 1; r <= repeat; r++)); do
  echo "gemm_vs_blas: $(basename "$recipe" .toml) run $r/$repeat" >&2
  # The kernel cache off: a run that starts with an earlier run's choices times nothing (kernel_cache.h).
  if ! COLOSSAL_KERNEL_CACHE=off "$COLOSSAL" train "$recipe" --set train.max_steps=2 --set "train.seq_len=$T" --set "train.batch_size=$B" \
      --set train.grad_accum=1 --set model.dropout=0 --set train.eval_every=0 --set train.eval_batches=1 \
      --set checkpoint.every=0 --set train.device=cpu --set optim.warmup_steps=1 --set kernels.gemm=auto --set "output.dir=$TMP/run-$r" \
      --quiet >"$TMP/out-$r" 2>&1; then
    echo "gemm_vs_blas: error: colossal train $recipe failed; its output ends:" >&2
    tail -n 20 "$TMP/out-$r" >&2
    exit 1
  fi
  grep -h 'kernels: gemm \[' "$TMP/run-$r/train.log" >"$TMP/gemm-$r" ||
    { echo "gemm_vs_blas: error: run $r logged no GEMM timing (is the shape's width a multiple of 16?)" >&2; exit 1; }
done

"$PY" - "$TMP" "$repeat" <<'EOF'
import re, statistics, sys
tmp, repeat = sys.argv[1], int(sys.argv[2])
line = re.compile(r"kernels: gemm \[(\S+) rows=(\d+) in=(\d+) out=(\d+)\]: fused ([\d.]+) ms, ATen ([\d.]+) ms")
times = {}
for r in range(1, repeat + 1):
    for text in open(f"{tmp}/gemm-{r}"):
        m = line.search(text)
        if m:
            key = m.group(1, 2, 3, 4)
            times.setdefault(key, ([], []))
            times[key][0].append(float(m.group(5)))
            times[key][1].append(float(m.group(6)))
order = {"fwd": 0, "dx": 1, "dw": 2, "dw+": 3}
total_ours = total_aten = 0.0
for key in sorted(times, key=lambda k: (int(k[2]) * int(k[3]), k[2], order.get(k[0], 9))):
    form, rows, i, o = key
    ours, aten = statistics.median(times[key][0]), statistics.median(times[key][1])
    # The weight-gradient forms are timed on at most 16 MiB of output: its first `timed` rows
    # (src/nn/gemm_choice.cpp, kTimingScratchBytes).
    timed = int(o) if not form.startswith("dw") else min(int(o), max(16, (16 << 20) // 4 // int(i) // 16 * 16))
    flop = 2.0 * int(rows) * int(i) * timed
    total_ours += ours
    total_aten += aten
    note = f" (timed on its first {timed} rows)" if timed < int(o) else ""
    print(f"{form:4} rows={rows} in={i:>5} out={o:>5}  ours {ours:8.3f} ms {flop / ours / 1e6:6.0f} GFLOP/s | "
          f"ATen {aten:8.3f} ms {flop / aten / 1e6:6.0f} GFLOP/s | {aten / ours:.2f}x{note}")
print(f"all {len(times)} products: ours {total_ours:.3f} ms, ATen {total_aten:.3f} ms, {total_aten / total_ours:.2f}x")
EOF
torch_version="$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || echo '?')"
echo "machine: $(bash scripts/bench/cpu_line.sh), $(nproc) cores, torch $torch_version, $(date +%F), $COMMAND, median of $repeat runs"
