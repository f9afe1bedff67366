#!/usr/bin/env bash
# Builds keel (CUDA too when nvcc is found) and runs every test with CTest. GPU tests skip
# without a GPU. Extra arguments go to ctest (e.g. -R Training).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KEEL_BUILD_DIR:-$root/build}
KEEL_BUILD_DIR="$build" "$root/scripts/build.sh"
cd "$build"
ctest --output-on-failure --timeout 900 -j "$(nproc)" "$@"
