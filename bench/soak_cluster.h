// Where a soak's slots run (bench/soak.h), behind one interface so that the soak starts,
// rejoins and repairs slots the same way on either:
//   - on this machine: one `keel-launch --local N` starts every slot, all on loopback;
//   - one machine per slot: a network namespace each (tests/integration/netns.h), slot 0's
//     launcher (with the controller) in machine 0 with `--slots N`, every other slot joining
//     from its own machine. Only there can one slot's link be cut: a partition.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

namespace keel {
class EtcdMember;
}
namespace keel::test {
class NetnsLab;
}

namespace keel::bench {

class SoakCluster {
 public:
  // `slots` machines in namespaces with `netns` (throws keel::Error naming the `ip` command
  // that failed), else none: everything runs here. With `own_etcd`, 3 etcd members on this
  // host for the job (--etcd); else the job starts its own on its slots.
  SoakCluster(bool netns, int slots, bool own_etcd);
  ~SoakCluster();  // kills whatever still runs in the machines, and removes them
  SoakCluster(const SoakCluster&) = delete;
  SoakCluster& operator=(const SoakCluster&) = delete;

  bool netns() const { return lab_ != nullptr; }
  int slots() const { return slots_; }

  // What tells slot 0's keel-launch how many slots the job has and where they are:
  // `--local N` here, `--slots N` (the rest join) in namespaces; and, with own_etcd, the
  // etcd cluster it keeps its control state in (`--etcd`).
  std::vector<std::string> layout_args() const;
  // The cluster of its own ("host:port,..."), where the soak finds the leader controller to
  // kill; "" when the job runs its own members (their endpoints are in its events).
  std::string etcd_endpoints() const;

  // Starts keel-launch `args` on slot `slot`'s machine in a session of its own, with `tag`
  // ("NAME=value", by which the soak finds the job's processes) in its environment and its
  // output in `log`. Throws keel::Error if it cannot be started.
  pid_t start(int slot, const std::vector<std::string>& args, const std::string& tag,
              const std::string& log);

  // Slot `slot`'s machine back after the job lost it: in namespaces it is repaired
  // (NetnsLab::repair: a partitioned machine's processes live on until then); here nothing
  // is left to do (a lost slot's launcher took its workers and memory with it).
  void repair(int slot);

  // The job's shared-memory segments still there: /dev/shm/keel-<job>-* here and in every
  // machine's own /dev/shm.
  std::vector<std::string> leftover_shm(const std::string& job) const;

 private:
  int slots_;
  std::unique_ptr<test::NetnsLab> lab_;
  // With own_etcd, the job's etcd: 3 members on this host (loopback, or the bridge's address
  // in namespaces), beside the machines the soak fails, as a site runs etcd on its service
  // nodes. Without, none: the job's 5 members run on its slots and go with them.
  std::string etcd_dir_;
  std::vector<std::unique_ptr<EtcdMember>> etcd_;
};

}  // namespace keel::bench
