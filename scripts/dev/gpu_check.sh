#!/usr/bin/env bash
# gpu_check.sh: builds colossal on a GPU machine that has torch, CMake, ninja and nvcc but none of Debian's
# -dev packages and no package registry (the lent H100/H200 machines), then checks the CUDA path: ctest
# (tests/test_cuda.cpp runs there instead of skipping), the tiny recipe trained on the GPU against the
# CPU, generation from it, and optionally the training benchmark with --device cuda.
#
# Beforehand, on a machine with Debian 12's registry, from the repository root:
#   bash scripts/dev/gpu_check.sh --download      # Debian packages into .debs/ (ignored by git)
# Then on the GPU machine, from the repository root, with .debs/ and runs/data/ carried along:
#   bash scripts/dev/gpu_check.sh [--bench | --build-only] [OUT_DIR]
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
                  libhogweed6 libgmp10 libidn2-0 libunistring2 libp11-kit0 libtasn1-6 libffi8 libkeyutils1)

if [ "${1:-}" = --download ]; then
  set -e
  mkdir -p .debs/runtime
  (cd .debs && apt-get download "${DEV_PACKAGES[@]}")
  (cd .debs/runtime && apt-get download "${RUNTIME_PACKAGES[@]}")
  echo "gpu_check: $(ls .debs/*.deb .debs/runtime/*.deb | wc -l) packages in .debs/"
  exit 0
fi
bench=0 build_only=0
if [ "${1:-}" = --bench ]; then bench=1; shift; fi
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

python="$(command -v python3)"
step "configure against $("$python" -c 'import torch; print(torch.__version__)') ($python)"
build=build-gpu
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOLOSSAL_PYTHON="$python" \
  -DCMAKE_PREFIX_PATH="$prefix/usr" -DHDF5_ROOT="$prefix/usr/lib/x86_64-linux-gnu/hdf5/serial" \
  -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$libs -Wl,-rpath,$libs" >"$out/configure.log" 2>&1 ||
  { tail -n 40 "$out/configure.log"; exit 1; }
grep -E "^-- colossal:|CXX compiler identification" "$out/configure.log"
step "build"
cmake --build "$build" -j "$(nproc)" >"$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head -n 30; exit 1; }
((build_only == 0)) || exit 0
echo "first DT_NEEDED of colossal: $(readelf -d "$build/colossal" | grep -m1 NEEDED | sed 's/.*\[//; s/\]//')"

step "ctest"
OMP_NUM_THREADS=4 ctest --test-dir "$build" -j 4 --output-on-failure >"$out/ctest.log" 2>&1
rc_test=$?
grep -E "tests passed|tests failed|Skipped|Failed|\*\*\*" "$out/ctest.log" | head -n 30

# The tiny recipe on the GPU and on the CPU: both learn, to about the same loss.
for dev in cuda cpu; do
  step "train gpt-tiny on $dev"
  "$build/colossal" train recipes/gpt-tiny.toml --set "train.device=$dev" --set "output.dir=/tmp/gpu_check-$dev" \
    --quiet >"$out/train-$dev.log" 2>&1
  tail -n 2 "$out/train-$dev.log"
  cp "/tmp/gpu_check-$dev/summary.json" "$out/summary-$dev.json" 2>/dev/null
done
# The trainer with NCCL named explicitly: a world of one still runs real NCCL collectives (gradient
# buckets, the step agreement, barriers), and must land on the loss of the plain GPU run above.
step "train gpt-tiny on cuda with parallel.backend = nccl (world of one)"
"$build/colossal" train recipes/gpt-tiny.toml --set train.device=cuda --set 'parallel.backend="nccl"' \
  --set output.dir=/tmp/gpu_check-nccl --quiet >"$out/train-nccl.log" 2>&1
tail -n 2 "$out/train-nccl.log"
cp /tmp/gpu_check-nccl/summary.json "$out/summary-nccl.json" 2>/dev/null
step "infer on cuda"
"$build/colossal" infer /tmp/gpu_check-cuda -p "And God said" -n 40 --seed 5 --top-k 20 --device cuda -q 2>&1 | tee "$out/infer-cuda.txt"
echo

if ((bench)); then
  step "benchmark (GPU)"
  bash scripts/bench/train_vs_torch.sh --device cuda --python "$python" --colossal "$build/colossal" \
    --shape 124m-1k --repeat 3 2>&1 | tee "$out/bench.txt"
  step "benchmark: AdamW on the GPU (kernels/cuda against torch's fused and foreach)"
  bash scripts/bench/host_adam.sh --device cuda --python "$python" --colossal "$build/colossal" --repeat 3 2>&1 |
    tee "$out/bench-adamw.txt"
fi
step "done (ctest exit $rc_test)"
exit "$rc_test"
