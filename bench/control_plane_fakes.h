// keel-bench control-plane's fake slots (bench/control_plane_sim.h): thousands of agents and
// their ranks in one process, speaking the real control plane (proto/control.proto Envelopes
// on ZeroMQ DEALER sockets) and the real recovery keys of the job's store (launcher/
// recovery_protocol.h), with no worker process and no training. What each fake says is what a
// keel-launch agent (launcher/agent/agent.cc) and a keel-worker (launcher/worker/) say:
//   agent: Register (rejoin, its workers "running", a new leader's way in), a Heartbeat every
//          200 ms, Event snapshots to a survey, worker_exit to a kill, worker_started to a spawn
//          (a parked worker adopting a promoted rank);
//   rank:  a WorkerProgress every 200 ms (step, times, three collective groups, alive_at), and
//          in an epoch transition ack/<E>/<rank> once abort/<E> is set, then, once rebuild/<E>
//          is, restored/<E>/<rank> and progress under the new epoch.
// What is cheaper than the real thing, so that 16,384 ranks fit on a few cores: one thread
// drives every socket; a slot's ranks share one DEALER ("worker/<slot>", one message per rank
// as each worker sends its own), so the controller holds 2 connections a slot, not 1 + 8; the
// abort and rebuild keys are watched by one poller for all ranks, and acks are written by a
// few threads. Steps advance on a clock (every rank at the same step) and stop while the job
// is in a transition.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "proto/membership.pb.h"

namespace keel::bench {

struct FakeClusterOptions {
  std::string job;         // Register.job
  int active_slots = 0;    // slots 0..active_slots-1 run ranks, per_slot each, in order
  int standby_slots = 0;   // the next ones are ready standbys with per_slot parked workers
  int per_slot = 8;        // ranks (workers) a slot
  std::string store_addr;  // the job's store (etcd_store_address)
  std::chrono::milliseconds heartbeat{200};  // the agent's period (launcher/agent/agent.h)
  std::chrono::milliseconds progress{200};   // the worker's reporter period
  std::chrono::milliseconds step{1000};      // how long a fake step takes
  int store_threads = 4;                     // acks and restored keys written in parallel
};

class FakeCluster {
 public:
  explicit FakeCluster(FakeClusterOptions o);
  ~FakeCluster();  // stops its threads and closes every socket
  FakeCluster(const FakeCluster&) = delete;
  FakeCluster& operator=(const FakeCluster&) = delete;

  // Points every live slot at the leader controller at `endpoint` (new sockets: a new
  // leader's agents connect again) and registers it there with rejoin.
  void follow(const std::string& endpoint);
  // How many live slots the leader at the endpoint last followed has welcomed.
  int welcomed() const { return welcomed_.load(); }
  int live_slots() const;
  // The slot's machine dies: its agent's and its workers' sockets close at once (linger 0),
  // as the kernel closes a dead process's connections. Returns the unix time it happened.
  // Throws keel::Error if the plane thread has stopped (error() says why).
  double lose_slot(int slot);

  // The newest epoch whose rebuild every fake rank has taken up (restored/<E> written).
  int restored_epoch() const { return restored_epoch_.load(); }
  // That epoch's Rebuild as the fakes read it from the store.
  std::optional<membership::Rebuild> rebuild(int epoch) const;

  // Counters since the start: WorkerProgress and Heartbeat messages sent, messages received
  // from the controller, and what the fakes got that they could not take (a malformed
  // message, a refuse, a command for a rank they do not run).
  int64_t progress_sent() const { return progress_sent_.load(); }
  int64_t heartbeats_sent() const { return heartbeats_sent_.load(); }
  int64_t received() const { return received_.load(); }
  int64_t received_bytes() const { return received_bytes_.load(); }
  int64_t surveys() const { return surveys_.load(); }  // surveys answered
  int64_t surprises() const { return surprises_.load(); }
  // Why the plane or the store thread stopped early ("" while they run, or after a clean
  // stop).
  std::string error() const;

 private:
  struct Slot;
  void plane_loop();
  void store_loop();
  void handle(int slot, const std::string& bytes);
  void send_progress(int slot, double now);
  int64_t step_now() const;

  FakeClusterOptions o_;
  struct Zmq;
  std::unique_ptr<Zmq> zmq_;
  std::vector<std::unique_ptr<Slot>> slots_;
  mutable std::mutex mu_;  // guards what the plane and the store thread share (below)
  int epoch_ = 0;
  bool in_transition_ = false;
  int64_t frozen_step_ = 0;  // the step while in a transition
  std::chrono::steady_clock::time_point step_origin_;
  int64_t step_base_ = 0;
  std::string endpoint_;  // follow(): the plane thread connects every slot anew
  int64_t follow_gen_ = 0;
  std::set<int> lose_;  // lose_slot(): slots whose sockets the plane thread must close
  std::vector<membership::Rebuild> rebuilds_;
  std::string error_;
  std::atomic<int> welcomed_{0};
  std::atomic<int> restored_epoch_{0};
  std::atomic<int64_t> progress_sent_{0}, heartbeats_sent_{0}, received_{0}, received_bytes_{0},
      surprises_{0}, surveys_{0};
  std::atomic<bool> stop_{false};
  std::thread plane_, store_;
};

}  // namespace keel::bench
