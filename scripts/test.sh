#!/usr/bin/env bash
# Builds keel (CUDA too when nvcc is found) and runs every test with CTest. GPU tests skip
# without a GPU. Extra arguments go to ctest (e.g. -R Training).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KEEL_BUILD_DIR:-$root/build}
KEEL_BUILD_DIR="$build" "$root/scripts/build.sh"
# The report.html render test (tests/bench/report_render_test.py) opens the page in Debian's
# chromium. A failed install fails nothing: that test then skips and says why.
if ! command -v chromium >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
  echo "test.sh: installing chromium for the report.html render test"
  { $sudo apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium \
      >/dev/null; } || echo "test.sh: chromium could not be installed; the render test skips"
fi
cd "$build"
ctest --output-on-failure --timeout 900 -j "$(nproc)" "$@"
