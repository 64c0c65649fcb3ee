#!/usr/bin/env bash
# The main job: set everything up, build, train the default GPT (recipes/gpt-mini.toml) on the
# embedded King James Bible for a few minutes, then print samples from the checkpoint it saved.
# Extra arguments go to `colossal train` (e.g. --set train.time_limit_min=10).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_TESTING=OFF bash scripts/build.sh
./build/colossal train recipes/gpt-mini.toml "$@"
echo
echo "=== samples from runs/gpt-mini (temperature 0.8, top-k 40, seed 1) ==="
./build/colossal infer runs/gpt-mini --prompts data/prompts.txt --max-tokens 60 --temperature 0.8 --top-k 40 --seed 1 --quiet
