// keel-bench cpu --speed: the CPU-speed report of issue 14 in one invocation (see
// cpu_speed.cc); --sgemm-child is its helper process.
#pragma once

namespace keel::bench {

// SGEMM by OpenBLAS core type, the medium GPT with nothing set against forced cores,
// then keel-bench recovery's snapshot section and keel-bench restore, printed in turn.
int cpu_speed_report(int threads);
// One 2-thread 2048³ SGEMM rate under whatever OPENBLAS_CORETYPE this process got;
// prints "<core> <GFLOP/s>".
int sgemm_child(int threads);

}  // namespace keel::bench
