// The communicators one rank trains with: its TP, PP, DP and embedding groups plus the whole
// world (for step metrics). All are created for one epoch: group names, and so rendezvous
// keys, start with "<epoch>/", so a rebuild for epoch E+1 never meets a connection of E.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "parallel/communicator.h"
#include "parallel/store.h"
#include "parallel/topology.h"
#include "runtime/backend.h"

namespace keel {

struct ProcessGroups {
  // world works on host memory (metrics); the others on the training device's memory.
  std::unique_ptr<Communicator> world, tp, pp, dp, emb;

  // Aborts every communicator (thread-safe); pending calls throw CommAborted.
  void abort_all();
  // Whether any communicator was aborted (thread-safe).
  bool any_aborted() const;
};

struct ProcessGroupOptions {
  int epoch = 0;
  Millis timeout{60000};
  DeviceKind device = DeviceKind::kCpu;  // kCpu: sockets; kCuda: NCCL
  int cuda_device = 0;
  std::string host = "127.0.0.1";  // kCpu: the address each socket group listens on and publishes
  // kCpu: set from another thread to abort the rendezvous (CommAborted), not only time it out.
  const std::atomic<bool>* cancel = nullptr;
};

// Creates the groups of `rank` in a fixed order (world, tp, pp, dp, emb) so that every rank
// meets its peers in the same order. Blocks until all peers of each group have joined or
// the timeout passes (CommTimeout).
ProcessGroups make_process_groups(const Topology& topo, int rank, std::shared_ptr<Store> store,
                                  const ProcessGroupOptions& opts);

}  // namespace keel
