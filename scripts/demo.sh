#!/usr/bin/env bash
# The demo: installs what keel needs, builds it, makes the demo corpus from Debian's fortunes
# text, then trains the tiny GPT (examples/configs/tiny-gpt.pbtxt) on one rank, and the same
# model as TP=2 × PP=2 × DP=2 under keel-launch on 4 local slots (machines) of 2 workers,
# plus warm standby slots, twice: once without faults, once with the injected faults of
# examples/faults/mixed.pbtxt (a crash, an exit, a hang, a NaN loss, a rank that silently
# computes wrong and a lost snapshot), and the controller's process killed at step 150 and slot 0
# (its agent, workers and etcd member) lost at step 350, which it survives without restarting
# the healthy ranks
# (the hung slot and the silently wrong one are evicted and standbys take their ranks; the
# corruption is rolled back to the newest verified step), ending with the same parameters bit
# for bit. Progress lines
# show step, loss, tokens/s and each incident; the loss curves are drawn to out/demo/*.svg;
# each job's logs and event log are in runs/<job>/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KEEL_BUILD_DIR:-$root/build}
cd "$root"
KEEL_BUILD_DIR="$build" scripts/build.sh keel-worker keel-launch keel-ctl keel_gpt keel-prepare-data
KEEL_BUILD_DIR="$build" scripts/make-demo-data.sh data/demo
mkdir -p out/demo
echo "== one rank =="
"$build/bin/keel-worker" --config examples/configs/tiny-gpt.pbtxt \
  --report out/demo/single.json --loss-svg out/demo/single-loss.svg --set train.log_every=50 "$@"
echo "== TP=2 x PP=2 x DP=2 under keel-launch: 4 local slots of 2 workers and a standby, no faults =="
"$build/bin/keel-launch" --local 5 --standby 1 --workers-per-slot 2 \
  --config examples/configs/tiny-gpt-3d.pbtxt --set train.log_every=100 \
  --report "$PWD/out/demo/3d.json" --loss-svg "$PWD/out/demo/3d-loss.svg" "$@"
echo "== the same job with injected faults (examples/faults/mixed.pbtxt), two standbys =="
"$build/bin/keel-launch" --local 6 --standby 2 --workers-per-slot 2 \
  --config examples/configs/tiny-gpt-3d.pbtxt --set train.log_every=100 \
  --inject examples/faults/mixed.pbtxt --set parallel.comm_timeout_ms=5000 \
  --fault controller_crash@step=150,rank=0 --fault slot_loss@step=350,rank=0 \
  --report "$PWD/out/demo/3d-faults.json" --loss-svg "$PWD/out/demo/3d-faults-loss.svg" "$@"
a=$(grep -o '"param_checksum": "[0-9a-f]*"' out/demo/3d.json | cut -d'"' -f4)
b=$(grep -o '"param_checksum": "[0-9a-f]*"' out/demo/3d-faults.json | cut -d'"' -f4)
echo "incidents survived:"
grep -o '"action": "[^"]*"' out/demo/3d-faults.json | sed 's/"action": /  /'
if [ "$a" = "$b" ]; then
  echo "parameters: fault-free $a, faulted $b: bitwise equal"
else
  echo "parameters differ: fault-free $a, faulted $b" >&2
  exit 1
fi
# Every step's record survived the faults (a step without one would be null), and each loss
# is the one the fault-free run computed at that step.
losses() { sed -n '/"losses": \[/,/\]/p' "$1"; }
if losses out/demo/3d.json | cmp -s - <(losses out/demo/3d-faults.json); then
  echo "losses: every step's record kept, each equal to the fault-free run's"
else
  echo "losses differ from the fault-free run's, or steps lost their records:" \
    "$(grep -o '"steps_without_record_why": "[^"]*"' out/demo/3d-faults.json)" >&2
  exit 1
fi
echo "reports: out/demo/*.json; loss curves (incidents marked): out/demo/*-loss.svg; logs: runs/"
