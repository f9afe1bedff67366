#!/usr/bin/env bash
# The GPU checks, as one script for a lent GPU machine (see the device tool): the CUDA and
# NCCL tests, then the GPT-2 124M bf16 MFU benchmark. Prepare on the build machine:
#   scripts/build.sh && mkdir -p .device && echo /.device/ >> .git/info/exclude
#   ../shared/tools/device-bundle build .device/keel.tar.xz && cp -r data/demo .device/
# then run `bash bench/gpu/device-check.sh` there with carry [".device"]. Results land in
# $OUT (gpu-tests.log, gpt2-124m.json, gpt2-124m.log); record them in bench/RESULTS.md.
set -uo pipefail
out=${OUT:-/tmp/keel-device-out}
mkdir -p "$out"
cd .device && tar xJf keel.tar.xz && source bundle/env.sh && cd ..
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
{
  keel_runtime_test --gtest_filter='Cuda*:Caching*'
  keel_parallel_test --gtest_filter='Nccl*'
} 2>&1 | tee "$out/gpu-tests.log"
mkdir -p data && ln -sfn "$PWD/.device/demo" data/demo
timeout 300 keel-worker --config examples/configs/gpt2-124m.pbtxt \
  --set model.plugin="$PWD/.device/bundle/lib/libkeel_gpt.so" \
  --report "$out/gpt2-124m.json" 2>&1 | tee "$out/gpt2-124m.log"
