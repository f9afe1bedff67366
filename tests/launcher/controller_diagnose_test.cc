// The controller's side of stop-time diagnostics (launcher/controller/diagnose_coordinator.h),
// through its public interface, against a RankHost that starts its "extra" processes as real
// keel-worker processes on this machine:
// which stand-ins it starts (the suspects' ranks and their groups' peers, nobody else), what
// it does without slots or budget, and how the incident and the event log carry the verdict.
#include <fcntl.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "launcher/controller/context.h"
#include "launcher/controller/diagnose_coordinator.h"
#include "launcher/controller/membership.h"
#include "parallel/job_key.h"
#include "parallel/tcp_store.h"
#include "proto/config_loader.h"
#include "proto/store_keys.h"
#include "robust/fault_injector.h"
#include "robust/fault_spec.h"
#include "test_paths.h"

extern char** environ;

namespace keel {
namespace {

// Four slots, rank r on slot r; extras are keel-worker processes started here.
class LocalSlots : public RankHost {
 public:
  LocalSlots(std::string config, std::string log_dir)
      : config_(std::move(config)), log_dir_(std::move(log_dir)) {}
  ~LocalSlots() override {
    for (auto& [key, pid] : extras_) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  void spawn(int, const std::map<std::string, std::string>&) override {}
  void kill(int) override {}
  std::optional<RankExit> poll_exit() override { return std::nullopt; }
  void stop_all(int, std::chrono::milliseconds) override {}
  std::map<int, policy::Holdings> survey(const Topology&, bool) override { return {}; }
  void finish() override {}
  int slot_of(int rank) const override { return rank; }
  std::vector<int> ranks_on(int slot) const override { return {slot}; }

  bool spawn_extra(int slot, int id, const std::map<std::string, std::string>& env) override {
    if (no_slots) return false;
    started.emplace_back(slot, id);
    if (lost_slots.count(slot)) return true;  // accepted, and never runs
    std::vector<std::string> e, args = {test::bin_dir() + "/keel-worker", "--config", config_};
    for (char** p = environ; *p; ++p) e.push_back(*p);
    for (const auto& [k, v] : env) e.push_back(k + "=" + v);
    e.push_back(detail::concat("KEEL_SLOT=", slot));  // what the agent adds
    e.push_back("KEEL_LOCAL_WORLD_SIZE=1");
    e.push_back("KEEL_JOB_SECRET=" + process_job_key().hex());  // the job's key, as env
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& x : e) envp.push_back(x.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    const std::string log = detail::concat(log_dir_, "/extra-", slot, ".log");
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) return false;
    extras_[{slot, id}] = pid;
    return true;
  }
  void kill_extra(int slot, int id) override {
    ++killed;
    auto it = extras_.find({slot, id});
    if (it == extras_.end()) return;
    ::kill(it->second, SIGKILL);
    ::waitpid(it->second, nullptr, 0);
    extras_.erase(it);
  }

  bool no_slots = false;
  std::set<int> lost_slots;
  std::vector<std::pair<int, int>> started;  // (slot, id)
  int killed = 0;

 private:
  std::string config_, log_dir_;
  std::map<std::pair<int, int>, pid_t> extras_;
};

class ControllerDiagnoseTest : public testing::Test {
 protected:
  // A TP2×PP1×DP2 job of the test GPT: TP groups {0,1} {2,3}, DP groups {0,2} {1,3}. The
  // coordinator runs for incident 0 in epoch 0.
  std::unique_ptr<DiagnoseCoordinator> controller(int budget_ms) {
    const std::string cfg = dir + "/job.pbtxt";
    std::ofstream(cfg) << "model { plugin: \"" << test::bin_dir()
                       << "/libkeel_gpt.so\" num_layers: 2 hidden_size: 32 num_heads: 4 "
                          "seq_len: 32 vocab_size: 256 }\n"
                       << "train { micro_batch_size: 2 global_batch_size: 8 steps: 10 }\n"
                       << "data { train_files: \"" << dir << "/train_*.bin\" }\n"
                       << "parallel { tp: 2 dp: 2 }\n"
                       << "runtime { threads: 1 }\n"
                       << "recovery { diagnostics_timeout_ms: " << budget_ms << " }\n";
    host = std::make_unique<LocalSlots>(cfg, dir);
    options = std::make_unique<ControllerOptions>();
    options->cfg = load_config(cfg, {});
    options->job = detail::concat("diagctl", ::getpid());
    options->store_addr = detail::concat("127.0.0.1:", server.port());
    options->on_event = [this](const std::string& kind, const EventFields& fields) {
      std::string json;
      (void)google::protobuf::util::MessageToJsonString(fields.fields(), &json);
      events.emplace_back(kind, json);
    };
    members = std::make_unique<JobMembership>(Topology(2, 1, 2), 2, SlotLayout{});
    // What the controller writes when the job starts: the stand-ins read their layout there.
    membership::Rebuild rb;
    *rb.mutable_membership() = members->to_proto();
    rb.set_restore_step(-2);
    set_message(*store, keys::rebuild_key(0), rb);
    ctx = std::make_unique<ControllerContext>();
    ctx->o = options.get();
    ctx->host = host.get();
    ctx->store = store;
    ctx->members = members.get();
    return std::make_unique<DiagnoseCoordinator>(*ctx);
  }

  std::string event(const std::string& kind) const {
    for (const auto& [k, json] : events)
      if (k == kind) return json;
    return "";
  }

  std::string dir = test::temp_dir("controller-diagnose");
  TcpStoreServer server{"127.0.0.1", 0};
  std::shared_ptr<TcpStore> store = std::make_shared<TcpStore>("127.0.0.1", server.port());
  std::unique_ptr<LocalSlots> host;
  std::unique_ptr<ControllerOptions> options;
  std::unique_ptr<JobMembership> members;
  std::unique_ptr<ControllerContext> ctx;
  std::vector<std::pair<std::string, std::string>> events;
};

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Slot 1's network is recorded defective. Its rank 1 and the peers of its groups (0 in TP,
// 3 in DP) are checked, rank 2 is not; slot 1 fails, slots 0 and 3 are only peers.
TEST_F(ControllerDiagnoseTest, StartsTheSuspectsAndTheirPeersAndFailsTheBrokenSlot) {
  FaultInjector::record_machine(*store, keys::machine_link_defect_key(1),
                                parse_fault_flag("link_error@step=5,rank=1"));
  auto c = controller(30000);
  report::Incident inc;
  const std::vector<int> failed = c->run({1}, 0, &inc);
  EXPECT_EQ(failed, std::vector<int>{1}) << inc.diagnostics_summary();
  std::set<int> slots;
  for (const auto& [slot, id] : host->started) {
    slots.insert(slot);
    EXPECT_GE(id, 1 << 24);  // no rank's id on its slot
  }
  EXPECT_EQ(slots, (std::set<int>{0, 1, 3}));
  EXPECT_EQ(host->killed, 3);
  ASSERT_EQ(inc.diagnostics_size(), 3);
  for (const auto& d : inc.diagnostics()) {
    EXPECT_TRUE(d.answered()) << d.rank();
    EXPECT_EQ(d.slot(), d.rank());
    EXPECT_TRUE(d.gemm_ok() && d.golden_ok()) << d.message();
  }
  EXPECT_TRUE(has(inc.diagnostics_summary(), "slot 1 fails (rank 1 broke its links"))
      << inc.diagnostics_summary();
  EXPECT_GT(inc.diagnosed_at(), 0);
  EXPECT_TRUE(has(event("diagnostics"), "\"failed_slots\":\"1\"")) << event("diagnostics");
}

// A stand-in that never runs (its slot accepted the start and lost it) is silent: it fails
// nothing when its slot is no suspect, and its peer's timeout blames nobody; it is waited
// for until the budget.
TEST_F(ControllerDiagnoseTest, ASilentPeerFailsNoSuspectAndTheBudgetHolds) {
  auto c = controller(6000);
  host->lost_slots = {1};
  report::Incident inc;
  const std::vector<int> failed = c->run({0}, 0, &inc);
  EXPECT_TRUE(failed.empty()) << inc.diagnostics_summary();
  // The silent stand-in was waited for until the budget, and no longer: its row says so.
  bool silent_seen = false;
  for (const auto& d : inc.diagnostics()) {
    if (d.rank() != 1) continue;
    silent_seen = true;
    EXPECT_FALSE(d.answered());
    EXPECT_EQ(d.error(), "no answer within 6000 ms");
  }
  EXPECT_TRUE(silent_seen);
  const std::string s = inc.diagnostics_summary();
  EXPECT_TRUE(has(s, "suspect slot 0 passed")) << s;
  EXPECT_TRUE(has(s, "not suspect: slot 1 rank 1 did not answer")) << s;
  EXPECT_TRUE(has(s, "tp.dp0.pp0 failed for 1 member without a culprit")) << s;
}

TEST_F(ControllerDiagnoseTest, NoBudgetOrNoSlotsRunsNothingAndSaysWhy) {
  auto c = controller(0);
  report::Incident inc;
  EXPECT_TRUE(c->run({1}, 0, &inc).empty());
  EXPECT_EQ(inc.diagnostics_summary(), "no diagnostics: recovery.diagnostics_timeout_ms is 0");
  EXPECT_TRUE(host->started.empty());
  EXPECT_EQ(inc.diagnosed_at(), 0);

  c = controller(5000);
  host->no_slots = true;
  report::Incident inc2;
  EXPECT_TRUE(c->run({1}, 0, &inc2).empty());
  EXPECT_EQ(inc2.diagnostics_summary(),
            "no diagnostics: this host cannot start processes on slots");
  EXPECT_EQ(inc2.diagnostics_size(), 0);
}

}  // namespace
}  // namespace keel
