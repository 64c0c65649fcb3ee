#!/usr/bin/env bash
# gpu_check.sh: builds colossal on a GPU machine that has torch, CMake, ninja and nvcc but none of Debian's
# -dev packages and no package registry (the lent H100/H200 machines), then checks the CUDA path: ctest
# (tests/test_cuda.cpp runs there instead of skipping), the tiny recipe trained on the GPU against the
# CPU, generation from it, and optionally the training benchmark with --device cuda.
#
# Beforehand, on a machine with Debian 12's registry, from the repository root:
#   bash scripts/dev/gpu_check.sh --download      # Debian packages into .debs/ (ignored by git)
# Then on the GPU machine, from the repository root, with .debs/ and runs/data/ carried along:
#   bash scripts/dev/gpu_check.sh [--tests-only | --bench [LIST] | --bench-only LIST | --build-only] [OUT_DIR]
# LIST: comma-separated from train, adamw, quant, gemini, capacity, serve, cpu (default train,adamw); capacity is
# the largest GPT plain PyTorch trains on the GPU against Gemini's at 1.5 times it (about 5 minutes, the
# host's memory bounding colossal's side there); cpu measures the host
# CPU on 2 of its cores (taskset) as issue 28's benchmarks do, since these machines' hosts are Intel Xeons
# (family 6 model 207 on 2026-11-26) and the development machines AMD EPYCs. The GPU's own tests run
# first, then the checks and benchmarks, and the rest of the suite (CPU tests) last, since a lease is short.
# --bench-only LIST builds the binary alone and runs those benchmarks, nothing else (a lease's last minutes).
# Logs go to OUT_DIR (default $OUT, else /tmp/gpu_check).
set -uo pipefail
cd "$(dirname "$0")/../.."

DEV_PACKAGES=(libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libtomlplusplus-dev libcli11-dev nlohmann-json3-dev
              libhdf5-dev libhdf5-103-1 libhdf5-hl-100 libaec0 libaec-dev libsz2 libsentencepiece-dev libsentencepiece0
              libprotobuf-lite32 libgtest-dev libgmock-dev libgloo-dev zlib1g-dev libcpp-httplib-dev libcpp-httplib0.11
              libssl-dev libbrotli-dev)
# libhdf5 needs libcurl; these are linked in only where the GPU machine lacks them (see below).
RUNTIME_PACKAGES=(libcurl4 libbrotli1 libcom-err2 libgssapi-krb5-2 libk5crypto3 libkrb5-3 libkrb5support0 libldap-2.5-0
                  libnghttp2-14 libpsl5 librtmp1 libsasl2-2 libsasl2-modules-db libssh2-1 libgnutls30 libnettle8
                  libhogweed6 libgmp10 libidn2-0 libunistring2 libp11-kit0 libtasn1-6 libffi8 libkeyutils1 time)

if [ "${1:-}" = --download ]; then
  set -e
  mkdir -p .debs/runtime
  (cd .debs && apt-get download "${DEV_PACKAGES[@]}")
  (cd .debs/runtime && apt-get download "${RUNTIME_PACKAGES[@]}")
  echo "gpu_check: $(ls .debs/*.deb .debs/runtime/*.deb | wc -l) packages in .debs/"
  exit 0
fi
bench="" build_only=0 tests_only=0 bench_only=0
if [ "${1:-}" = --tests-only ]; then tests_only=1; shift; fi   # build what the GPU's suites need, run them, stop
if [ "${1:-}" = --bench-only ]; then bench_only=1; set -- --bench "${@:2}"; fi
if [ "${1:-}" = --bench ]; then
  shift
  if [[ "${1:-}" =~ ^[a-z]+(,[a-z]+)*$ ]]; then bench="$1"; shift; else bench=train,adamw; fi
  for b in ${bench//,/ }; do
    case "$b" in train|adamw|quant|gemini|capacity|serve|cpu) ;; *) echo "gpu_check: error: unknown benchmark '$b' (valid: train, adamw, quant, gemini, capacity, serve, cpu)" >&2; exit 2 ;; esac
  done
fi
benched() { [[ ",$bench," == *",$1,"* ]]; }
# $GPU_CHECK_SECONDS: a deadline for the whole check (a lease's command limit); each benchmark and the
# rest of the suite get what is left, and are skipped with under 30 s.
deadline=$(($(date +%s) + ${GPU_CHECK_SECONDS:-86400}))
left() { echo $((deadline - $(date +%s))); }
in_time() { (($(left) >= 30)) || { echo "gpu_check: skipped, $(left) s left before the deadline: $*"; return 1; }; }
if [ "${1:-}" = --build-only ]; then build_only=1; shift; fi
out="${1:-${OUT:-/tmp/gpu_check}}"
mkdir -p "$out"
ls .debs/*.deb >/dev/null 2>&1 || { echo "gpu_check: error: no .debs/*.deb; run 'bash $0 --download' first and carry .debs" >&2; exit 1; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

step() { echo "== $(date +%T) $*"; }

# Debian's packages unpacked under a prefix; their shared libraries that the machine lacks are linked into
# one folder that the binaries find through their RUNPATH.
prefix=/tmp/colossal-debs
libs=/tmp/colossal-debs-libs
step "unpacking $(ls .debs/*.deb .debs/runtime/*.deb 2>/dev/null | wc -l) Debian packages into $prefix"
mkdir -p "$prefix" "$libs"
for f in .debs/*.deb .debs/runtime/*.deb; do [ -f "$f" ] && dpkg -x "$f" "$prefix"; done
for so in "$prefix"/usr/lib/x86_64-linux-gnu/lib*.so.*; do
  name="$(basename "$so")"
  ldconfig -p | grep -qE "^[[:space:]]+${name//./\\.} " || ln -sf "$so" "$libs/$name"
done
echo "linked $(ls "$libs" | wc -l) libraries the machine lacks: $(ls "$libs" | tr '\n' ' ')"
# The benchmarks' peak-memory columns read /usr/bin/time, which a bare machine may lack: Debian's, unpacked above.
[ -x /usr/bin/time ] || ln -sf "$prefix/usr/bin/time" /usr/bin/time

python="$(command -v python3)"
step "configure against $("$python" -c 'import torch; print(torch.__version__)') ($python)"
build=build-gpu
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOLOSSAL_PYTHON="$python" \
  -DCMAKE_PREFIX_PATH="$prefix/usr" -DHDF5_ROOT="$prefix/usr/lib/x86_64-linux-gnu/hdf5/serial" \
  -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$libs -Wl,-rpath,$libs" >"$out/configure.log" 2>&1 ||
  { tail -n 40 "$out/configure.log"; exit 1; }
grep -E "^-- colossal:|CXX compiler identification" "$out/configure.log"
# The binary and the test binaries that hold the GPU's suites first; the other tests' binaries only
# before the rest of the suite, so a short lease spends its time on the GPU.
step "build"
first=(--target colossal reference_tests dist_tests e2e_tests)
((build_only == 0)) || first=()
((bench_only == 0)) || first=(--target colossal)
cmake --build "$build" -j "$(nproc)" "${first[@]}" >"$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head -n 30; exit 1; }
((build_only == 0)) || exit 0
echo "first DT_NEEDED of colossal: $(readelf -d "$build/colossal" | grep -m1 NEEDED | sed 's/.*\[//; s/\]//')"

gpu_suites='^(Cuda.*|.*OnGpu)$'
rc_test=0
if ((bench_only == 0)); then
step "ctest: the GPU's suites"
OMP_NUM_THREADS=4 ctest --test-dir "$build" -R "$gpu_suites" -j 3 --output-on-failure >"$out/ctest-gpu.log" 2>&1
rc_test=$?
grep -E "tests passed|tests failed|Skipped|Failed|\*\*\*|Test +#" "$out/ctest-gpu.log" | head -n 30
((tests_only == 0)) || exit "$rc_test"

# The tiny recipe on the GPU and on the CPU: both learn, to about the same loss.
for dev in cuda cpu; do
  step "train gpt-tiny on $dev"
  "$build/colossal" train recipes/gpt-tiny.toml --set "train.device=$dev" --set "output.dir=/tmp/gpu_check-$dev" \
    --quiet >"$out/train-$dev.log" 2>&1
  tail -n 2 "$out/train-$dev.log"
  cp "/tmp/gpu_check-$dev/summary.json" "$out/summary-$dev.json" 2>/dev/null
done
step "infer on cuda"
"$build/colossal" infer /tmp/gpu_check-cuda -p "And God said" -n 40 --seed 5 --top-k 20 --device cuda -q 2>&1 | tee "$out/infer-cuda.txt"
echo
# Each quantization of the CPU-trained model decodes greedily on the GPU (its dp4a GEMV, SmoothQuant's
# cuBLASLt GEMM for the prompt) and on the CPU: the same text expected, as the sums are the same integers.
for scheme in int8-weight int4-weight int8-smoothquant; do
  step "quantize $scheme; greedy on cuda and cpu"
  group=(); [ "$scheme" = int4-weight ] && group=(--group-size 32)
  "$build/colossal" quantize /tmp/gpu_check-cpu --out "/tmp/gpu_check-$scheme" --scheme "$scheme" "${group[@]}" -q >"$out/quantize-$scheme.log" 2>&1 ||
    { echo "quantize $scheme failed: $(tail -n 1 "$out/quantize-$scheme.log")"; continue; }
  tail -n 2 "$out/quantize-$scheme.log"
  for dev in cuda cpu; do
    "$build/colossal" infer "/tmp/gpu_check-$scheme" -p "And God said unto Moses" -p "In the beginning" -n 40 --greedy --device "$dev" -q \
      >"/tmp/gpu_check-$scheme-$dev.txt" 2>&1 || echo "infer $scheme on $dev failed: $(tail -n 1 "/tmp/gpu_check-$scheme-$dev.txt")"
  done
  cmp -s "/tmp/gpu_check-$scheme-cuda.txt" "/tmp/gpu_check-$scheme-cpu.txt" && echo "$scheme: the GPU's greedy text equals the CPU's" ||
    { echo "$scheme: texts differ"; diff "/tmp/gpu_check-$scheme-cuda.txt" "/tmp/gpu_check-$scheme-cpu.txt" | head -n 8; }
done
# The fp32 model with its KV cache in fp16 and in int8 rows (--kv-cache), replayed as CUDA graphs on the GPU: the
# CPU's text (the GPU quantizes each row with ATen's operations, the CPU with its kernels: the same bytes).
for kv in fp16 int8; do
  step "greedy with an $kv KV cache on cuda and cpu"
  for dev in cuda cpu; do
    "$build/colossal" infer /tmp/gpu_check-cpu -p "And God said unto Moses" -p "In the beginning" -n 40 --greedy --kv-cache "$kv" \
      --device "$dev" -q >"/tmp/gpu_check-kv-$kv-$dev.txt" 2>&1 ||
      echo "infer --kv-cache $kv on $dev failed: $(tail -n 1 "/tmp/gpu_check-kv-$kv-$dev.txt")"
  done
  cmp -s "/tmp/gpu_check-kv-$kv-cuda.txt" "/tmp/gpu_check-kv-$kv-cpu.txt" && echo "$kv KV cache: the GPU's greedy text equals the CPU's" ||
    { echo "$kv KV cache: texts differ"; diff "/tmp/gpu_check-kv-$kv-cuda.txt" "/tmp/gpu_check-kv-$kv-cpu.txt" | head -n 8; }
done
fi

if benched adamw && in_time "AdamW benchmark"; then
  step "benchmark: AdamW on the GPU (kernels/cuda against torch's fused and foreach)"
  timeout "$(left)" bash scripts/bench/host_adam.sh --device cuda --python "$python" --colossal "$build/colossal" --repeat 3 2>&1 |
    tee "$out/bench-adamw.txt"
fi
if benched gemini && in_time "Gemini benchmark"; then
  step "benchmark: Gemini on the GPU within a device budget"
  # a 3.0B GPT in bf16: every chunk in host memory (placement cpu: all transfers on the side stream),
  # placement auto within 8 GB, each with the host update beside the next forward and in place
  # (-inplace), and everything on the GPU (51 GiB planned); a table per placement, so a lease that
  # ends early keeps the ones done
  # $GPU_CHECK_GEMINI_MODES narrows them (a short lease: "cpu,cpu-inplace,auto,auto-inplace")
  for m in $(echo "${GPU_CHECK_GEMINI_MODES:-cpu,cpu-inplace,auto,device,auto-inplace}" | tr , ' '); do
    in_time "Gemini benchmark, placement $m" || break
    timeout "$(left)" bash scripts/bench/gemini_placement.sh --device cuda --colossal "$build/colossal" --shape 3b --dtype bf16 \
      --modes "$m" --budget-gb 8 --repeat 1 --steps 5 2>&1 | tee -a "$out/bench-gemini.txt"
  done
fi
if benched capacity && in_time "capacity benchmark"; then
  step "benchmark: the largest GPT PyTorch trains on the GPU against Gemini's"
  timeout "$(left)" bash scripts/bench/gemini_capacity.sh --device cuda --ratio 1.5 --python "$python" --colossal "$build/colossal" 2>&1 |
    tee "$out/bench-capacity.txt"
fi
if benched serve && in_time "serving benchmark"; then
  step "benchmark: colossal serve on the GPU (continuous batching against one sequence at a time)"
  # transformers' server needs packages these machines lack (fastapi, uvicorn): colossal's two sides only
  timeout "$(left)" bash scripts/bench/serve_load.sh --device cuda --sides colossal,colossal-1 --python "$python" --colossal "$build/colossal" \
    --requests 32 --concurrency 16 2>&1 | tee "$out/bench-serve.txt"
fi
if benched quant && in_time "quantized decoding benchmark"; then
  step "benchmark: quantized decoding on the GPU"
  # each scheme with its decoding steps as CUDA graphs and op by op (--no-cuda-graphs); $GPU_CHECK_QUANT_SCHEMES
  # narrows the schemes for a short lease
  timeout "$(left)" bash scripts/bench/quant_decode.sh --device cuda --python "$python" --colossal "$build/colossal" --batches 1,8 \
    --tokens 64 --repeat 1 --schemes "${GPU_CHECK_QUANT_SCHEMES:-fp32,int8,int4,int8-smoothquant}" --layers 24 --width 1536 \
    --op-by-op 2>&1 | tee "$out/bench-quant.txt"
fi
if benched cpu && in_time "CPU benchmarks"; then
  step "benchmark: the host CPU on 2 cores (training against eager PyTorch and torch.compile, GEMM against MKL, decoding)"
  bash scripts/bench/cpu_line.sh
  # decoding first: a lease on 2026-11-27 ran out of time inside it when it came last (its checkpoint is
  # trained on the spot, about 10 s)
  for b in "infer_vs_transformers.sh --python $python --repeat 2" "train_vs_torch.sh --python $python --shape tiny --repeat 3" \
           "gemm_vs_blas.sh --shape tiny --repeat 3"; do
    in_time "$b" || break
    # shellcheck disable=SC2086  # the words of $b are the script and its options
    timeout "$(left)" taskset -c 0,1 bash scripts/bench/$b --colossal "$build/colossal" 2>&1 | tee -a "$out/bench-cpu.txt"
  done
fi
if benched train && in_time "training benchmark"; then
  step "benchmark (GPU)"
  timeout "$(left)" bash scripts/bench/train_vs_torch.sh --device cuda --python "$python" --colossal "$build/colossal" \
    --shape 124m-1k --repeat 3 2>&1 | tee "$out/bench.txt"
fi
# $GPU_CHECK_REST=0 leaves the CPU's suites to the development machine (a lease split over two calls)
if ((bench_only == 0)) && [ "${GPU_CHECK_REST:-1}" != 0 ] && in_time "the rest of the suite"; then
  step "ctest: the rest of the suite"
  timeout "$(left)" cmake --build "$build" -j "$(nproc)" >>"$out/build.log" 2>&1 || echo "gpu_check: building the other tests failed or ran out of time"
  OMP_NUM_THREADS=2 timeout "$(left)" ctest --test-dir "$build" -E "$gpu_suites" -j 8 --output-on-failure >"$out/ctest.log" 2>&1
  rc_rest=$?
  grep -E "tests passed|tests failed|Failed|\*\*\*" "$out/ctest.log" | head -n 30
  ((rc_test == 0)) && rc_test=$rc_rest
fi
step "done (ctest exit $rc_test)"
exit "$rc_test"
