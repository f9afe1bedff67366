#!/usr/bin/env bash
# Configures and builds keel into build/ (override with KEEL_BUILD_DIR). CUDA is built when
# nvcc is found (KEEL_CUDA=AUTO); pass e.g. KEEL_CUDA=OFF to skip it. Arguments name targets
# to build (default: all).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KEEL_BUILD_DIR:-$root/build}
"$root/scripts/install-deps.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKEEL_CUDA="${KEEL_CUDA:-AUTO}" >/dev/null
if [ $# -gt 0 ]; then
  cmake --build "$build" -j "$(nproc)" --target "$@"
else
  cmake --build "$build" -j "$(nproc)"
fi
