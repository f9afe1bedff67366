#!/bin/bash
# Builds bench/bench_gemm_backends.cc (OpenBLAS + oneDNN in one binary, BLIS apart: it exports
# the same symbols as OpenBLAS; none of them is built by CMake, as BLIS and oneDNN are not keel
# dependencies) and runs it for every OpenBLAS core type ROUNDS times, then numpy's 2048³
# reference (peers/sgemm_peak.py) per core. Take the best of the rounds: on a shared machine
# the best is the run that had the cores. Needs libblis-dev and libdnnl-dev.
#   bench/bench_gemm_backends.sh [rounds=2] [threads=2]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
threads=${2:-2}
out=${TMPDIR:-/tmp}/keel-gemm-bench
mkdir -p "$out"
I=/usr/include/x86_64-linux-gnu
F="-O2 -fopenmp bench/bench_gemm_backends.cc"
g++ $F -DHAVE_OPENBLAS -DHAVE_DNNL -I$I/openblas-pthread -o "$out/gemm" -lopenblas -ldnnl
g++ $F -DHAVE_BLIS -I$I/blis-openmp -o "$out/gemm-blis" -lblis
unset OPENBLAS_CORETYPE OPENBLAS_NUM_THREADS OMP_NUM_THREADS
peer=/work/shared/acceptance/peers/sgemm_peak.py
for r in $(seq "$rounds"); do
  echo "=== round $r ($(uptime | sed 's/.*load/load/'))"
  echo "OpenBLAS picks by itself: $(python3 -c 'import ctypes; f = ctypes.CDLL("libopenblas.so.0").openblas_get_corename; f.restype = ctypes.c_char_p; print(f().decode())')"
  for core in Cooperlake SkylakeX Haswell Zen Prescott; do
    OPENBLAS_CORETYPE=$core "$out/gemm" "$threads"
  done
  "$out/gemm-blis" "$threads"
  if [ -f $peer ]; then
    for core in auto Cooperlake SkylakeX Haswell; do
      e=OPENBLAS_CORETYPE=$core
      [ $core = auto ] && e=KEEL_UNUSED=1
      g=$(env $e /usr/bin/python3 $peer --backends numpy --threads "$threads" |
        python3 -c 'import json,sys; print(json.loads(sys.stdin.read().splitlines()[-1])["gflops_best"])')
      echo "numpy 2048^3 ($core): $g GFLOP/s"
    done
  fi
done
