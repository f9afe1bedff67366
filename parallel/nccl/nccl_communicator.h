// A Communicator over NCCL, for buffers in CUDA device memory (parallel/communicator.h has the
// contract: every call completes or throws CommTimeout / PeerFailure / CommAborted, abort()
// works from any thread, reductions are deterministic).
//
// How it keeps that contract on top of NCCL:
// - The communicator is created non-blocking (config.blocking = 0), so no NCCL call can stall
//   the caller; initialisation and every operation are waited for by polling
//   ncclCommGetAsyncError and a CUDA event against the call's deadline.
// - Work runs on the communicator's own stream. Each call first makes that stream wait for the
//   work already queued on the device's blocking streams (the CUDA backend's compute stream is
//   one), so the caller need not synchronize, and returns only once the operation has finished,
//   so the result is ready for whatever the caller queues next.
// - abort() revokes and aborts the NCCL communicator, which ends kernels stuck on a dead peer;
//   a timeout does the same before throwing. A communicator that threw a CommError is broken
//   for good (a bad argument, e.g. a peer outside the group, is a keel::Error and is not).
// - Floats are reduced by NCCL's fixed algorithms for a fixed group, so results are the same on
//   every run and every rank (don't vary NCCL_ALGO/NCCL_PROTO between runs of one job).
//
// Point-to-point: NCCL has no tags and undefined behaviour on a size mismatch, so send and
// recv first exchange a 16-byte header (tag, size) and check it, then move the payload. That
// costs one extra small round trip per message and turns a protocol bug into a CommError
// instead of a hang or corrupt data.
#pragma once

#include <memory>
#include <string>

#include "parallel/communicator.h"
#include "parallel/store.h"

namespace keel {

struct NcclCommOptions {
  std::string name;  // group name, e.g. "3/tp/1": messages, and the store key "<name>/nccl_id"
  int rank = 0, size = 1;
  int device = 0;         // CUDA device of this rank
  Millis timeout{60000};  // creation, and every call that passes no timeout
};

// Rendezvous through `store` (rank 0 publishes the NCCL unique id under "<name>/nccl_id", the
// others wait for it) and create the communicator; collective over the group. Throws
// CommTimeout if the group does not form within opts.timeout, PeerFailure or CommError if NCCL
// fails, keel::Error on bad options.
std::unique_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Store> store,
                                                     const NcclCommOptions& opts);

}  // namespace keel
