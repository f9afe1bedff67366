#!/usr/bin/env bash
# The demo: installs what keel needs, builds it, makes the demo corpus from Debian's fortunes
# text, then trains the tiny GPT (examples/configs/tiny-gpt.pbtxt) on one rank, and the same
# model on 8 local ranks as TP=2 × PP=2 × DP=2 twice: once without faults, once with the
# injected faults of examples/faults/mixed.pbtxt (a crash, an exit, a hang, a NaN loss and a
# lost snapshot), which it survives without restarting the healthy ranks and ends with the
# same parameters bit for bit. Progress lines show step, loss, tokens/s, MFU and each
# incident; the loss curves are drawn to out/demo/*.svg.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KEEL_BUILD_DIR:-$root/build}
cd "$root"
KEEL_BUILD_DIR="$build" scripts/build.sh keel-worker keel_gpt keel-prepare-data
KEEL_BUILD_DIR="$build" scripts/make-demo-data.sh data/demo
mkdir -p out/demo
echo "== one rank =="
"$build/bin/keel-worker" --config examples/configs/tiny-gpt.pbtxt \
  --report out/demo/single.json --loss-svg out/demo/single-loss.svg --set train.log_every=50 "$@"
echo "== TP=2 x PP=2 x DP=2 on 8 local processes, no faults =="
"$build/bin/keel-worker" --nproc 8 --config examples/configs/tiny-gpt-3d.pbtxt \
  --report out/demo/3d.json --loss-svg out/demo/3d-loss.svg --set train.log_every=100 "$@"
echo "== the same job with injected faults (examples/faults/mixed.pbtxt) =="
"$build/bin/keel-worker" --nproc 8 --config examples/configs/tiny-gpt-3d.pbtxt \
  --inject examples/faults/mixed.pbtxt --set parallel.comm_timeout_ms=5000 \
  --report out/demo/3d-faults.json --loss-svg out/demo/3d-faults-loss.svg \
  --set train.log_every=100 "$@"
a=$(grep -o '"param_checksum": "[0-9a-f]*"' out/demo/3d.json | cut -d'"' -f4)
b=$(grep -o '"param_checksum": "[0-9a-f]*"' out/demo/3d-faults.json | cut -d'"' -f4)
if [ "$a" = "$b" ]; then
  echo "parameters after the faulted run: $b, bitwise equal to the fault-free run"
else
  echo "parameters differ: fault-free $a, faulted $b" >&2
  exit 1
fi
echo "reports: out/demo/*.json; loss curves (incidents marked): out/demo/*-loss.svg"
