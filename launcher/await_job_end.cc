#include "launcher/await_job_end.h"

#include <sys/wait.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <optional>
#include <thread>

#include "launcher/agent/agent.h"
#include "launcher/etcd/etcd_client.h"
#include "launcher/etcd/etcd_watch.h"
#include "launcher/etcd/leader_election.h"
#include "proto/control_state.pb.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "runtime/logging.h"
#include "runtime/text.h"

namespace keel {
namespace {

// After the controller died: how often keel-launch asks etcd whether a later leader ended
// the job, and each call's deadline.
constexpr std::chrono::milliseconds kEndPoll{100};
constexpr std::chrono::milliseconds kEndPollTimeout{2000};
// How long keel-launch, whose slots were taken as lost, waits for the job's end while no
// controller leads it (etcd's quorum timeout's default): then the job is gone with no end.
constexpr std::chrono::seconds kNoLeaderWait{60};
// How often keel-launch prints the job's progress while a leader it did not start runs it.
constexpr std::chrono::seconds kProgressEchoEvery{5};

// Prints the job's progress as rank 0 records it in the ranks' store (every few seconds): after
// a takeover the progress lines go to the new leader's log, and this console would
// otherwise fall silent for the rest of the job. `steps`: the job's total.
class ProgressEcho {
 public:
  ProgressEcho(const std::string& job, int64_t steps) : job_(job), steps_(steps) {}
  void poll(EtcdClient& client) {
    if (std::chrono::steady_clock::now() < next_) return;
    next_ = std::chrono::steady_clock::now() + kProgressEchoEvery;
    try {
      // One member's own copy: a line a second late costs nothing, a quorum lost costs none.
      const auto kv =
          client.get(keys::state::store_prefix(job_) + keys::kProgress,
                     std::chrono::steady_clock::now() + kEndPollTimeout, EtcdRead::kLocal);
      store::Step s;
      if (!kv || !s.ParseFromString(kv->value) || s.step() <= shown_) return;
      shown_ = s.step();
      std::printf(
          "keel-launch: step %lld/%lld (under the leader that took over; its own "
          "lines are in the run directory's logs/slot<K>-controller.log)\n",
          static_cast<long long>(shown_), static_cast<long long>(steps_));
      std::fflush(stdout);
    } catch (const EtcdUnavailable&) {
      // The end's read below says so.
    }
  }

 private:
  const std::string job_;
  const int64_t steps_;
  int64_t shown_ = -1;
  std::chrono::steady_clock::time_point next_;
};

// The exit status in a state::JobEnd value, if it is one.
std::optional<int> end_code(const std::string& value) {
  state::JobEnd end;
  if (!end.ParseFromString(value)) return std::nullopt;
  return end.code();
}

}  // namespace

int await_job_end(const JobEndWait& w) {
  const std::vector<std::string>& etcd = w.etcd;
  const std::string& job = w.job;
  const int sig = w.signal;
  std::vector<pid_t>* slots = w.slots;
  std::optional<ProgressEcho> progress;
  if (w.echo_steps > 0) progress.emplace(job, w.echo_steps);
  const std::string how = sig ? detail::concat("died (", strsignal(sig), ")")
                              : "was deposed (it lost its lease and another leads)";
  std::printf(
      "keel-launch: the job's controller %s; a candidate on another slot takes over, "
      "training goes on\n",
      how.c_str());
  std::fflush(stdout);
  EtcdClient client(etcd, kEndPollTimeout);
  // The end as etcd pushes it: the leader writes it and then shuts the job down, its etcd
  // members with it, so a poll may find etcd gone before it saw the end (a machine whose
  // slots were taken as lost has nothing else to learn it from). The polls below cover an
  // end written before the watch began.
  std::atomic<int> pushed_end{-1};
  EtcdWatch end_watch(client, keys::state::end(job), /*prefix=*/false,
                      [&pushed_end](const std::vector<EtcdEvent>& events) {
                        for (const EtcdEvent& e : events)
                          if (e.type == EtcdEvent::Type::kPut)
                            if (const auto code = end_code(e.kv.value)) pushed_end = *code;
                      });
  std::optional<int> slot_code;  // the first slot's that ended with the job's status
  bool gone = false;             // a slot here was taken as lost: the job goes on elsewhere
  auto job_status = [&](int code) {
    gone = gone || code == kExitSlotGone;
    if (!slot_code && code != kExitControllerLost && code != kExitSlotGone) slot_code = code;
  };
  auto no_leader_since = std::chrono::steady_clock::now();
  while (true) {
    std::erase_if(*slots, [&](pid_t p) {
      int st = 0;
      if (waitpid(p, &st, WNOHANG) != p) return false;
      if (WIFEXITED(st)) job_status(WEXITSTATUS(st));
      return true;
    });
    // Read once a pass: an agent that ends between two reads would count as ended here
    // without its status (a slot taken as lost), and the wait would end with it.
    const int agent0_code = w.agent0_here ? w.agent0_code->load() : -1;
    if (agent0_code >= 0) job_status(agent0_code);
    if (slot_code) return *slot_code;
    if (pushed_end.load() >= 0) return pushed_end.load();
    if (progress) progress->poll(client);
    try {
      if (auto kv = client.get(keys::state::end(job)))
        if (const auto code = end_code(kv->value)) return *code;
    } catch (const EtcdUnavailable& e) {
      LOG(WARNING) << "etcd: reading the job's end: " << e.what();
    }
    if (w.agent0_here ? agent0_code >= 0 : slots->empty()) {
      // This machine's slots are out of the job (taken as lost while cut off): its end still
      // comes from etcd, as long as someone leads it.
      bool led = false;
      try {
        led = gone && find_leader(client, keys::state::leader_prefix(job)).has_value();
      } catch (const EtcdUnavailable&) {
      }
      if (led) no_leader_since = std::chrono::steady_clock::now();
      if (!gone || std::chrono::steady_clock::now() - no_leader_since > kNoLeaderWait) {
        LOG(ERROR) << "every slot of this machine ended without the job's end from a leader";
        return 1;
      }
    }
    if (w.stop && *w.stop) return 128 + int(*w.stop);
    std::this_thread::sleep_for(kEndPoll);
  }
}

}  // namespace keel
