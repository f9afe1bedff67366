// KEEL_CHECK_NCCL(call): throws keel::Error naming file:line, the call's text, NCCL's name for
// the result and NCCL's last error message (which says what actually went wrong).
//
// This is for calls whose failure is a bug or a broken installation. Failures the runtime is
// built to survive (a dead peer, a timeout, an abort) surface from the NCCL communicator as
// CommError types instead (parallel/comm_error.h).
#pragma once

#include <nccl.h>

#include "runtime/check.h"

namespace keel::detail {

[[noreturn]] inline void throw_nccl(const char* file, int line, const char* expr,
                                    ncclResult_t result) {
  // ncclGetLastError reports the calling thread's last error whatever communicator is given.
  const char* last = ncclGetLastError(nullptr);
  throw_check(file, line, expr,
              concat(ncclGetErrorString(result), (last != nullptr && *last) ? ": " : "",
                     last != nullptr ? last : ""));
}

}  // namespace keel::detail

#define KEEL_CHECK_NCCL(call)                                                   \
  do {                                                                          \
    ncclResult_t keel_nccl_result_ = (call);                                    \
    if (keel_nccl_result_ != ncclSuccess) {                                     \
      ::keel::detail::throw_nccl(__FILE__, __LINE__, #call, keel_nccl_result_); \
    }                                                                           \
  } while (0)
