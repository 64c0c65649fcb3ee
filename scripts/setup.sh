#!/usr/bin/env bash
# Installs everything colossal needs on a bare Debian 12 machine, idempotently:
# Debian packages (headers and tools) and the pinned torch wheel, whose LibTorch we build against,
# into a project-local virtual environment (.venv). Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION="${COLOSSAL_TORCH_VERSION:-2.15.0}"
VENV="${COLOSSAL_VENV:-$PWD/.venv}"
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"

DEBS=(build-essential cmake ninja-build ccache pkg-config git time python3 python3-venv python3-pip
      libgloo-dev libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libsentencepiece-dev
      sentencepiece libhdf5-dev zlib1g-dev libspdlog-dev libfmt-dev libgtest-dev googletest
      liburing-dev            # the NVMe offload tier's asynchronous reads and writes (io_uring)
      libcpp-httplib-dev      # colossal serve's HTTP server
      dataset-fashion-mnist   # ViT recipes train on its IDX files
      iproute2 slurm-wlm munge)   # the two-node (network namespaces) and one-node SLURM tests
# Test builds only (scripts/run.sh sets BUILD_TESTING=OFF): the profile page's render test opens it in
# a headless browser.
[ "${BUILD_TESTING:-ON}" = OFF ] || DEBS+=(chromium)
missing=()
for p in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Debian's libtorch-dev / python3-torch would shadow the wheel's LibTorch at link time.
if dpkg-query -W -f='${Status}' libtorch-dev 2>/dev/null | grep -q "install ok installed"; then
  echo "setup: error: Debian's libtorch-dev is installed; it makes CMake link its old libtorch.so. Remove it (apt-get remove libtorch-dev)." >&2
  exit 1
fi

# A python that can make virtual environments: prefer the one on PATH, fall back to Debian's.
PY=python3
"$PY" -c 'import venv, ensurepip' 2>/dev/null || PY=/usr/bin/python3
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating virtual environment $VENV"
  "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  # The wheels (torch and its CUDA libraries) unpack to about 5.4 GB (5.0 GiB), more while pip holds
  # their downloads in TMPDIR: say so before starting rather than fail half-way with ENOSPC.
  free_kb=$(df -Pk "$VENV" | awk 'NR == 2 {print $4}')
  if [ "${free_kb:-0}" -lt $((6 * 1024 * 1024)) ]; then
    echo "setup: error: $((free_kb / 1024 / 1024)) GiB free at $VENV; installing torch==$TORCH_VERSION needs at least 6 GiB (free some space, or set COLOSSAL_VENV to a larger disk)" >&2
    exit 1
  fi
  echo "setup: installing torch==$TORCH_VERSION into $VENV (about 2 minutes, 5.4 GB)"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
  # No wheel cache: a second copy of the downloads would stay on the disk after the install.
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir "torch==$TORCH_VERSION"
fi
# Python is for fixtures and benchmark peers only (never for building or running colossal).
if ! "$VENV/bin/python" -c "import numpy, h5py" 2>/dev/null; then
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check numpy h5py
fi
# Test builds: the serving test drives colossal serve with OpenAI's own Python client.
if [ "${BUILD_TESTING:-ON}" != OFF ] && ! "$VENV/bin/python" -c "import openai" 2>/dev/null; then
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "openai==3.57.0"
fi
echo "setup: ok (torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)'), venv $VENV)"
