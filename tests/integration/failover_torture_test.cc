// The failover torture (issue 42): random faults at the leader and around it for a bounded
// time, on machines made of network namespaces, the invariants checked from a watch on etcd
// kept from outside the job and from the event log.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "integration/net_job.h"
#include "launcher/etcd/etcd_client.h"
#include "launcher/etcd/etcd_watch.h"
#include "launcher/etcd/leader_election.h"
#include "parallel/job_key.h"
#include "proto/control_state.pb.h"
#include "proto/membership.pb.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "runtime/text.h"

namespace keel::test {
namespace {

// What etcd recorded while the torture ran, as a watch from outside the job saw it, in
// revision order: each write of the job's record (its term and epoch) and each Rebuild the
// ranks' store got (its epoch and what it decided).
class EtcdHistory {
 public:
  EtcdHistory(const std::vector<std::string>& endpoints, const std::string& job,
              const std::string& key_file)
      : client_(endpoints, std::chrono::seconds(5), JobKey::load(key_file)),
        job_(job),
        watch_(client_, keys::state::root(job), true,
               [this](const std::vector<EtcdEvent>& events) { on(events); }) {}

  // Every violation seen: a record of an older term written after a newer one (a deposed
  // leader's write landed), an epoch going back, an epoch decided twice differently.
  std::vector<std::string> violations() {
    std::lock_guard lock(mu_);
    return violations_;
  }
  int64_t records() {
    std::lock_guard lock(mu_);
    return records_;
  }
  std::set<int64_t> terms() {
    std::lock_guard lock(mu_);
    return terms_;
  }
  // The epochs past the first whose Rebuild the watch saw.
  int epochs_decided() {
    std::lock_guard lock(mu_);
    return int(rebuilds_.size()) - int(rebuilds_.count(0));
  }
  // The job's newest step as rank 0 recorded it (-1: none yet).
  int64_t step() {
    std::lock_guard lock(mu_);
    return step_;
  }
  EtcdClient& client() { return client_; }

 private:
  void on(const std::vector<EtcdEvent>& events) {
    std::lock_guard lock(mu_);
    for (const EtcdEvent& e : events) {
      if (e.type != EtcdEvent::Type::kPut) continue;
      const std::string& k = e.kv.key;
      if (k == keys::state::job_state(job_)) {
        state::JobState js;
        if (!js.ParseFromString(e.kv.value)) continue;
        ++records_;
        terms_.insert(js.term());
        const int epoch = js.membership().epoch();
        if (js.term() < term_)
          violations_.push_back(detail::concat("rev ", e.kv.mod_revision, ": a record of term ",
                                               js.term(), " after one of term ", term_));
        if (epoch < epoch_)
          violations_.push_back(detail::concat("rev ", e.kv.mod_revision, ": epoch ", epoch,
                                               " after epoch ", epoch_));
        term_ = std::max(term_, js.term());
        epoch_ = std::max(epoch_, epoch);
      } else if (k.starts_with(keys::state::store_prefix(job_) + "rebuild/")) {
        membership::Rebuild rb;
        if (!rb.ParseFromString(e.kv.value)) continue;
        // What was decided: the restore point and who runs each rank.
        std::string decided = detail::concat(rb.restore_step(), ":");
        for (int s : rb.membership().rank_slot()) decided += detail::concat(s, ",");
        const int epoch = rb.membership().epoch();
        auto [it, fresh] = rebuilds_.emplace(epoch, decided);
        if (!fresh && it->second != decided)
          violations_.push_back(
              detail::concat("epoch ", epoch, " decided twice: ", it->second, " then ", decided));
      } else if (k == keys::state::store_prefix(job_) + keys::kProgress) {
        store::Step st;
        if (st.ParseFromString(e.kv.value)) step_ = std::max(step_, st.step());
      }
    }
  }

  EtcdClient client_;
  const std::string job_;
  std::mutex mu_;
  std::vector<std::string> violations_;
  int64_t records_ = 0, term_ = 0, step_ = -1;
  int epoch_ = 0;
  std::set<int64_t> terms_;
  std::map<int, std::string> rebuilds_;
  EtcdWatch watch_;  // last: its thread ends before the members above go
};

// The pid of the job's process on machine `m` whose environment names rank `rank`.
pid_t rank_pid_on(const NetnsLab& lab, int m, int rank) {
  for (pid_t p : lab.processes_in(m)) {
    const std::string vars = read_text("/proc/" + std::to_string(p) + "/environ");
    if (vars.find(std::string(1, '\0') + "KEEL_RANK=" + std::to_string(rank) +
                  std::string(1, '\0')) != std::string::npos)
      return p;
  }
  return -1;
}

// The pid of machine m's etcd member (its command line names the job), -1 if none runs.
pid_t member_pid_on(const NetnsLab& lab, int m, const std::string& job) {
  for (pid_t p : lab.processes_in(m)) {
    std::string cmd = read_text("/proc/" + std::to_string(p) + "/cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd.find("--initial-cluster-token=" + job) != std::string::npos) return p;
  }
  return -1;
}

// For a bounded time, random faults at the leader and around it while a TP2xDP3 job trains
// over five machines (two standbys): the leader killed (-9), frozen (-STOP) for longer than
// its lease and thawed after another took over, its machine cut off and healed; a worker
// killed; an etcd member killed. Whatever the timing, what must always hold is checked from a
// watch on etcd kept from outside the job and from the event log: no record of an older term
// lands after a newer one (a deposed leader's write), no epoch goes back or is decided twice,
// and the job ends every step done, bitwise equal to its fault-free run, nothing left behind.
// The seed is printed: KEEL_TORTURE_SEED replays a schedule.
TEST_F(LaunchNetns, FailoverTortureKeepsOneLeaderPerTermAndTheResultBitwise) {
  constexpr int kTortureSteps = 700;
  const std::string steps = "train.steps=" + std::to_string(kTortureSteps);
  const std::string ref_dir = temp_dir("netns-torture-ref");
  LaunchRun ref = run_launch(ref_dir, launch_cmd(ref_dir, job_config(ref_dir, kTp2Dp3),
                                                 "--local 3 --workers-per-slot 2 --set " + steps));
  ASSERT_EQ(ref.exit_code, 0) << ref.output;

  const char* given = std::getenv("KEEL_TORTURE_SEED");
  const uint64_t seed = given ? std::stoull(given) : uint64_t(std::random_device{}());
  std::printf("torture seed %llu (KEEL_TORTURE_SEED replays it)\n", (unsigned long long)seed);
  std::mt19937_64 rng(seed);
  auto pick = [&](int n) { return int(rng() % uint64_t(n)); };

  NetnsLab lab(5);
  const std::string dir = temp_dir("netns-torture");
  // Paced by a slow rank (150 ms a step, numbers unchanged): some 100 s of training.
  NetJob job(&lab, dir,
             {"--standby", "2", "--set", steps, "--set", "detect.slot_timeout_ms=1000", "--fault",
              "slow@step=1,rank=2,delay_ms=150", "--set", "detect.slow_round_steps=0"},
             5);
  std::unique_ptr<EtcdHistory> history;
  std::vector<std::string> schedule;  // what was done, when: printed on failure
  // kSettle: training again after the last fault; kFailover: a leader killed or thawed,
  // until another leads; kFrozen: a leader stopped for longer than its lease; kCut: the
  // leader's machine cut off until another leads.
  enum class Phase { kSettle, kFailover, kFrozen, kCut };
  Phase phase = Phase::kSettle;
  const auto start = Clock::now();
  auto last_fault = Clock::now();
  int64_t step_at_fault = 0;
  pid_t frozen = -1;
  int cut = -1, partitions = 1;  // a cut-off machine leaves the job: one, of two standbys
  int64_t term_at_fault = 0;
  auto leader = [&]() -> std::optional<std::pair<state::Leader, int64_t>> {
    std::optional<LeaderInfo> l;
    try {
      l = find_leader(history->client(), keys::state::leader_prefix(job.job()));
    } catch (const std::exception&) {
      return std::nullopt;
    }
    state::Leader v;
    if (!l || !v.ParseFromString(l->value)) return std::nullopt;
    return std::make_pair(v, l->term);
  };
  auto say = [&](const std::string& what) {
    schedule.push_back(
        detail::concat(int(seconds_since(start)), " s, step ", history->step(), ": ", what));
  };
  const int code = job.wait(
      [&] {
        if (!history) {
          const std::string jd = job_dir_in(job.run_dir());
          if (jd.empty()) return;
          const std::string etcd = event_data(slurp(jd + "/events.jsonl"), "etcd");
          if (etcd.empty()) return;
          history = std::make_unique<EtcdHistory>(split(json_string_field(etcd, "endpoints"), ','),
                                                  job.job(), jd + "/secret");
          return;
        }
        const int64_t step = history->step();
        if (phase == Phase::kFrozen && seconds_since(last_fault) > 7) {
          kill(frozen, SIGCONT);
          say(detail::concat("leader ", frozen, " thawed"));
          phase = Phase::kFailover;
          step_at_fault = step;
          return;
        }
        if (phase == Phase::kFailover) {
          // Until another leads (a bounded wait: a thawed leader may still lead if etcd was
          // out of reach meanwhile and nobody could win).
          const auto l = leader();
          if ((!l || l->second == term_at_fault) && seconds_since(last_fault) < 30) return;
          phase = Phase::kSettle;
          last_fault = Clock::now();
          return;
        }
        if (phase == Phase::kCut) {
          const auto l = leader();
          if (seconds_since(last_fault) < 4 || !l || l->second == term_at_fault) return;
          lab.heal(cut);
          say(detail::concat("machine ", cut, " healed (term ", l->second, " leads)"));
          phase = Phase::kSettle;
          last_fault = Clock::now();
          step_at_fault = step;
          return;
        }
        // The next fault once the job trains again (10 steps past the last one, a leader in
        // place), for 100 s; then the job runs to its end.
        if (phase != Phase::kSettle || seconds_since(start) > 100 || step < step_at_fault + 10 ||
            step >= kTortureSteps - 60 || seconds_since(last_fault) < 2)
          return;
        const auto l = leader();
        if (!l) return;
        const int slot = l->first.slot();
        term_at_fault = l->second;
        last_fault = Clock::now();
        step_at_fault = step;
        // 0 leader killed, 1 leader frozen, 2 worker killed (twice as likely: each costs an
        // epoch transition), 3 member killed, 4 leader's machine cut off (once).
        std::vector<int> choices = {0, 1, 2, 2, 3};
        if (partitions > 0) choices.push_back(4);
        switch (choices[size_t(pick(int(choices.size())))]) {
          case 0:
            kill(l->first.pid(), SIGKILL);
            say(detail::concat("leader ", l->first.pid(), " (slot ", slot, ", term ", l->second,
                               ") killed"));
            phase = Phase::kFailover;
            break;
          case 1:
            frozen = l->first.pid();
            kill(frozen, SIGSTOP);
            say(detail::concat("leader ", frozen, " (slot ", slot, ", term ", l->second,
                               ") frozen"));
            phase = Phase::kFrozen;
            break;
          case 2: {
            const int rank = pick(6);
            for (int m = 0; m < lab.size(); ++m)
              if (m != slot)
                if (pid_t p = rank_pid_on(lab, m, rank); p > 0) {
                  kill(p, SIGKILL);
                  say(detail::concat("rank ", rank, " (pid ", p, ", machine ", m, ") killed"));
                  break;
                }
            break;
          }
          case 3: {
            // A member on another machine than the leader's.
            for (int tries = 0; tries < lab.size(); ++tries) {
              const int m = pick(lab.size());
              if (m == slot || m == cut) continue;
              if (pid_t p = member_pid_on(lab, m, job.job()); p > 0) {
                kill(p, SIGKILL);
                say(detail::concat("etcd member on machine ", m, " (pid ", p, ") killed"));
                break;
              }
            }
            break;
          }
          case 4:
            cut = slot;
            --partitions;
            lab.cut(cut);
            say(detail::concat("leader's machine ", cut, " (term ", l->second, ") cut off"));
            phase = Phase::kCut;
            break;
        }
      },
      400);
  if (frozen > 0) kill(frozen, SIGCONT);
  if (cut >= 0) lab.heal(cut);
  std::string plan;
  for (const auto& s : schedule) plan += "  " + s + "\n";
  const std::string jd = job_dir_in(job.run_dir());
  const std::string events = slurp(jd + "/events.jsonl");
  ASSERT_TRUE(history) << job.output(0);
  std::printf("torture: %zu faults, %lld records in %zu terms, %d epochs decided\n%s",
              schedule.size(), (long long)history->records(), history->terms().size(),
              history->epochs_decided(), plan.c_str());
  // The watch saw every transition the event log has, so the checks above saw every write.
  EXPECT_EQ(history->epochs_decided(), count_events(events, "rebuild")) << plan << events;
  EXPECT_EQ(code, 0) << plan << job.output(0) << "\n" << events;
  for (const std::string& v : history->violations()) ADD_FAILURE() << v << "\n" << plan;
  EXPECT_GE(schedule.size(), 5u) << plan;
  LaunchRun r;
  collect(&r, job.run_dir());
  EXPECT_EQ(json_number_field(r.report, "steps_completed"), kTortureSteps) << plan << r.report;
  EXPECT_EQ(json_string_field(r.report, "param_checksum"),
            json_string_field(ref.report, "param_checksum"))
      << plan;
  history.reset();
  for (int i = 0; i < lab.size(); ++i)
    EXPECT_TRUE(machine_empties(lab, i, 15s)) << "machine " << i << "\n" << plan;
  expect_no_shm_left(&r);
}

}  // namespace
}  // namespace keel::test
