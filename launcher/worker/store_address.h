// The job's store as KEEL_STORE_ADDR (or --store) names it: a TcpStore at "host:port" (a job
// without etcd: the controller's process serves it), or an EtcdStore at "etcd://..." (a job
// with etcd: it outlives any controller; launcher/etcd/etcd_store.h).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "parallel/store.h"

namespace keel {

struct StoreAddress {
  // A new client of the store (each thread that blocks in it takes its own).
  std::function<std::shared_ptr<Store>()> connect;
  // A client for what a rank reads and writes on its step's path (runtime faults, rank 0's
  // records): with etcd, each call's deadline is short, so that etcd without quorum slows a
  // step by that much at most and never stalls the training.
  std::function<std::shared_ptr<Store>()> connect_step_path;
  // A host on the way to the store: this process's own sockets listen on the address that
  // reaches it (parallel/net_address.h, reachable_address).
  std::string toward_host;
};

// Throws InputError naming the address when it is neither form.
StoreAddress store_at(const std::string& address);

}  // namespace keel
