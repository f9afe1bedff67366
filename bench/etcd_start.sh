#!/usr/bin/env bash
# The etcd start-up cost of keel-launch jobs (bench/RESULTS.md, "The job's control state in
# etcd"): five jobs each with 3 members on disk, 3 on /dev/shm and 5 on disk, each printing
# keel-launch's "up and led in S s". Run from the project root after scripts/build.sh and
# scripts/make-demo-data.sh; KEEL_BUILD_DIR names the build (default: build).
set -euo pipefail
bin="${KEEL_BUILD_DIR:-build}/bin"
runs=$(mktemp -d)
trap 'rm -rf "$runs"' EXIT
for spec in "3 run" "3 shm" "5 run"; do
  read -r members data <<<"$spec"
  slots=$((members > 3 ? members : 3))
  for _ in 1 2 3 4 5; do
    "$bin/keel-launch" --local "$slots" --standby $((slots - 2)) --etcd-members "$members" \
      --etcd-data "$data" --run-dir "$runs" --config examples/configs/tiny-gpt.pbtxt \
      --set parallel.dp=2 --set train.steps=5 --set train.eval_every=0 \
      --set "data.train_files=data/demo/train_*.bin" --set "data.val_files=data/demo/val_*.bin" \
      2>/dev/null | grep -o "up and led in [0-9.]* s" | sed "s/^/$members members, $data: /"
  done
done
