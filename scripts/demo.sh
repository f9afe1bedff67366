#!/usr/bin/env bash
# The demo: installs what keel needs, builds it, makes the demo corpus from Debian's fortunes
# text, then trains the tiny GPT (examples/configs/tiny-gpt.pbtxt) on one rank and the same
# model on 8 local ranks as TP=2 × PP=2 × DP=2. Progress lines show step, loss, tokens/s and
# MFU; the loss curves are drawn to out/demo/*.svg.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KEEL_BUILD_DIR:-$root/build}
cd "$root"
KEEL_BUILD_DIR="$build" scripts/build.sh keel-worker keel_gpt keel-prepare-data
KEEL_BUILD_DIR="$build" scripts/make-demo-data.sh data/demo
mkdir -p out/demo
echo "== one rank =="
"$build/bin/keel-worker" --config examples/configs/tiny-gpt.pbtxt \
  --report out/demo/single.json --loss-svg out/demo/single-loss.svg --set train.log_every=25 "$@"
echo "== TP=2 x PP=2 x DP=2 on 8 local processes =="
"$build/bin/keel-worker" --nproc 8 --config examples/configs/tiny-gpt-3d.pbtxt \
  --report out/demo/3d.json --loss-svg out/demo/3d-loss.svg --set train.log_every=25 "$@"
echo "reports: out/demo/single.json out/demo/3d.json; loss curves: out/demo/*-loss.svg"
