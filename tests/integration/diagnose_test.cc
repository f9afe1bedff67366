// Stop-time diagnostics (launcher/worker/diagnose_worker.h, robust/diagnostics.h) as real
// keel-worker processes, without a controller: the test starts the stand-ins of a TP2×PP1×DP2
// job itself, one per machine (slot 10 + rank), as the controller would, and judges their
// answers. A machine whose network the job recorded as defective breaks its links and is
// named by itself and its peers; a machine with a recorded sdc defect fails the golden
// mini-GPT; a stand-in that never comes fails its slot alone, and its peers' timeouts blame
// nobody.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "parallel/job_key.h"
#include "parallel/tcp_store.h"
#include "proto/config_loader.h"
#include "proto/membership.pb.h"
#include "proto/report.pb.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "robust/diagnostics.h"
#include "robust/fault_injector.h"
#include "robust/fault_spec.h"
#include "test_paths.h"
#include "worker_harness.h"

extern char** environ;

namespace keel::test {
namespace {

using namespace std::chrono_literals;

constexpr int kSlotBase = 10;  // rank r runs on slot 10 + r
constexpr int kEpoch = 3;      // the job's epoch the stand-ins diagnose

class DiagnoseTest : public testing::Test {
 protected:
  void TearDown() override {
    for (pid_t p : pids) ::kill(p, SIGKILL);
    for (pid_t p : pids) ::waitpid(p, nullptr, 0);
  }

  // Starts the stand-in of job rank `rank` (index `index` of `n`) as the controller and the
  // agent would: the task (and the job's layout in its epoch, the Rebuild's Membership) in
  // the store, the task's key in the stand-in's environment.
  void start(const std::string& key, int rank, int index, int n, const std::vector<int>& suspects,
             int budget_ms, const std::string& config = "") {
    const config::JobConfig cfg = load_config(config.empty() ? cfg_path : config, {});
    membership::Rebuild rb;
    rb.mutable_membership()->set_epoch(kEpoch);
    rb.mutable_membership()->set_tp(cfg.parallel().tp());
    rb.mutable_membership()->set_pp(cfg.parallel().pp());
    rb.mutable_membership()->set_dp(cfg.parallel().dp());
    set_message(*store, keys::rebuild_key(kEpoch), rb);
    store::DiagnoseTask task =
        try_get_message<store::DiagnoseTask>(*store, keys::diagnose_task_key(key))
            .value_or(store::DiagnoseTask{});
    task.set_epoch(kEpoch);
    while (task.job_ranks_size() <= index) task.add_job_ranks(-1);
    task.set_job_ranks(index, rank);
    task.clear_suspects();
    for (int r : suspects) task.add_suspects(r);
    set_message(*store, keys::diagnose_task_key(key), task);
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) env.push_back(*e);
    env.push_back("KEEL_DIAGNOSE=" + key);
    env.push_back(detail::concat("KEEL_RANK=", index));
    env.push_back(detail::concat("KEEL_WORLD_SIZE=", n));
    env.push_back("KEEL_LOCAL_WORLD_SIZE=1");
    env.push_back(detail::concat("KEEL_STORE_ADDR=127.0.0.1:", server.port()));
    env.push_back(detail::concat("KEEL_JOB_ID=diagtest", ::getpid()));
    env.push_back(detail::concat("KEEL_SLOT=", kSlotBase + rank));
    env.push_back("KEEL_SUPERVISED=1");  // what the controller sets; a stand-in ignores it
    // The job key, as a launcher keel does not control hands it over (read and unset at once).
    env.push_back("KEEL_JOB_SECRET=" + process_job_key().hex());
    std::vector<std::string> args = {bin_dir() + "/keel-worker", "--config",
                                     config.empty() ? cfg_path : config, "--set",
                                     detail::concat("recovery.diagnostics_timeout_ms=", budget_ms)};
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    const std::string log = log_path(rank);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid = -1;
    EXPECT_EQ(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data()), 0);
    posix_spawn_file_actions_destroy(&fa);
    pids.push_back(pid);
  }

  std::string log_path(int rank) const { return detail::concat(dir, "/diag-", rank, ".log"); }
  std::string logs() const {
    std::string s;
    for (int r = 0; r < 4; ++r) s += read_text(log_path(r));
    return s;
  }

  // Waits (deadline) for every started process; their exit codes in start order.
  std::vector<int> wait_all(std::chrono::seconds deadline) {
    std::map<pid_t, int> codes;
    const std::vector<pid_t> order = pids;
    const auto end = std::chrono::steady_clock::now() + deadline;
    while (!pids.empty() && std::chrono::steady_clock::now() < end) {
      int status = 0;
      const pid_t p = ::waitpid(-1, &status, WNOHANG);
      if (p <= 0) {
        ::usleep(20000);  // poll: a child exiting does not wake us otherwise
        continue;
      }
      codes[p] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      std::erase(pids, p);
    }
    std::vector<int> out;
    for (pid_t p : order) out.push_back(codes.count(p) ? codes[p] : -1);  // -1: still running
    return out;
  }

  // Rank r's answer; answered = false if there is none.
  report::Diagnostic answer(const std::string& key, int r) {
    report::Diagnostic d;
    d.set_rank(r);
    d.set_slot(kSlotBase + r);
    if (auto a = try_get_message<report::Diagnostic>(*store, keys::diagnose_result_key(key, r)))
      return *a;
    d.set_answered(false);
    return d;
  }

  const report::DiagnosticGroup* group(const report::Diagnostic& d, const std::string& name) {
    for (const auto& g : d.groups())
      if (g.group() == name) return &g;
    return nullptr;
  }

  std::string dir = temp_dir("diagnose");
  std::string cfg_path = write_config(dir, {{"parallel", "tp: 2 dp: 2"}});
  std::string dp4_path = write_config(temp_dir("diagnose-dp4"), {{"parallel", "dp: 4"}});
  TcpStoreServer server{"127.0.0.1", 0};
  std::shared_ptr<TcpStore> store = std::make_shared<TcpStore>("127.0.0.1", server.port());
  std::vector<pid_t> pids;
};

// Rank 1's machine has a defective network, rank 3's a persistent gradient flip. Every rank is
// a suspect: TP groups {0,1} {2,3}, DP groups {0,2} {1,3}, all tested.
TEST_F(DiagnoseTest, BrokenLinksAndSdcDefectFailTheirMachinesOnly) {
  FaultInjector::record_machine(*store, keys::machine_link_defect_key(kSlotBase + 1),
                                parse_fault_flag("link_error@step=5,rank=1"));
  FaultInjector::record_machine(*store, keys::machine_defect_key(kSlotBase + 3),
                                parse_fault_flag("sdc@step=1,rank=3,target=grad"));
  const std::string key = "diag/1/3";
  for (int r = 0; r < 4; ++r) start(key, r, r, 4, {0, 1, 2, 3}, 30000);
  const std::vector<int> codes = wait_all(120s);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(codes[size_t(r)], 0) << "rank " << r << "\n" << logs();

  std::vector<report::Diagnostic> rows;
  for (int r = 0; r < 4; ++r) rows.push_back(answer(key, r));
  for (const auto& d : rows) {
    ASSERT_TRUE(d.answered()) << "rank " << d.rank() << "\n" << logs();
    EXPECT_EQ(d.error(), "") << d.rank();
    EXPECT_TRUE(d.gemm_ok()) << d.message();
    EXPECT_EQ(d.slot(), kSlotBase + d.rank());
    EXPECT_EQ(d.groups_size(), 2) << d.message();
  }
  // The sdc defect shows in the golden mini-GPT only, on its machine only.
  EXPECT_TRUE(rows[0].golden_ok() && rows[1].golden_ok() && rows[2].golden_ok()) << logs();
  EXPECT_FALSE(rows[3].golden_ok()) << rows[3].message();
  // Rank 1 names itself in both its groups, its peers name rank 1.
  for (const char* name : {"tp.dp0.pp0", "dp.pp0.tp1"}) {
    const auto* g = group(rows[1], name);
    ASSERT_NE(g, nullptr) << name;
    EXPECT_FALSE(g->ok());
    EXPECT_EQ(g->blamed_rank(), 1) << g->error();
  }
  const auto* g0 = group(rows[0], "tp.dp0.pp0");
  const auto* g3 = group(rows[3], "dp.pp0.tp1");
  ASSERT_TRUE(g0 && g3);
  EXPECT_FALSE(g0->ok());
  EXPECT_EQ(g0->blamed_rank(), 1) << g0->error();
  EXPECT_FALSE(g3->ok());
  EXPECT_EQ(g3->blamed_rank(), 1) << g3->error();
  // The groups without rank 1 passed, exactly, and measured their send rate.
  for (auto [r, name] :
       {std::pair{0, "dp.pp0.tp0"}, {2, "dp.pp0.tp0"}, {2, "tp.dp1.pp0"}, {3, "tp.dp1.pp0"}}) {
    const auto* g = group(rows[size_t(r)], name);
    ASSERT_NE(g, nullptr) << r << " " << name;
    EXPECT_TRUE(g->ok()) << r << " " << name << ": " << g->error();
    EXPECT_GT(g->bytes_per_s(), 0) << r << " " << name;
    EXPECT_EQ(g->blamed_rank(), -1);
  }

  const diag::Verdict v = diag::judge(rows, {10, 11, 12, 13});
  EXPECT_EQ(v.failed_slots, (std::vector<int>{11, 13})) << v.summary;
  EXPECT_TRUE(contains(
      v.summary,
      "slot 11 fails (rank 1 broke its links in dp.pp0.tp1; rank 1 broke its links in tp.dp0.pp0)"))
      << v.summary;
  EXPECT_TRUE(contains(v.summary, "slot 13 fails (rank 3: golden mini-GPT differs)")) << v.summary;
  EXPECT_TRUE(contains(v.summary, "slots 10, 12 passed")) << v.summary;
}

// Rank 2's stand-in never comes (its slot is gone): its peers' group tests time out within
// their share of the budget, name nobody, and only rank 2's slot fails. Rank 1 shares no group
// with rank 2 (the controller would not start it): it tests no group at all.
TEST_F(DiagnoseTest, AMissingStandInFailsItsSlotAndTimeoutsBlameNobody) {
  const std::string key = "diag/2/3";
  constexpr int kBudgetMs = 8000;
  for (int r : {0, 1, 3}) start(key, r, r, 4, {2}, kBudgetMs);
  const std::vector<int> codes = wait_all(120s);
  for (size_t i = 0; i < codes.size(); ++i) EXPECT_EQ(codes[i], 0) << i << "\n" << logs();

  std::vector<report::Diagnostic> rows;
  for (int r = 0; r < 4; ++r) rows.push_back(answer(key, r));
  EXPECT_FALSE(rows[2].answered());
  // Rank 0 meets rank 2 in DP group dp.pp0.tp0, rank 3 in TP group tp.dp1.pp0; rank 1 has no
  // group with rank 2 and tests nothing.
  ASSERT_TRUE(rows[0].answered() && rows[1].answered() && rows[3].answered()) << logs();
  EXPECT_EQ(rows[1].groups_size(), 0) << rows[1].message();
  ASSERT_EQ(rows[0].groups_size(), 1) << rows[0].message();
  EXPECT_EQ(rows[0].groups(0).group(), "dp.pp0.tp0");
  ASSERT_EQ(rows[3].groups_size(), 1) << rows[3].message();
  EXPECT_EQ(rows[3].groups(0).group(), "tp.dp1.pp0");
  for (int r : {0, 3}) {
    EXPECT_FALSE(rows[size_t(r)].groups(0).ok());
    EXPECT_EQ(rows[size_t(r)].groups(0).blamed_rank(), -1) << rows[size_t(r)].groups(0).error();
    // Its test ended on its own timeout (its share of the budget), not on a peer's answer.
    EXPECT_TRUE(contains(rows[size_t(r)].groups(0).error(), "timed out"))
        << rows[size_t(r)].groups(0).error();
  }
  const diag::Verdict v = diag::judge(rows, {12});
  EXPECT_EQ(v.failed_slots, std::vector<int>{12}) << v.summary;
  EXPECT_TRUE(contains(v.summary, "slot 12 fails (rank 2 did not answer)")) << v.summary;
}

// Healthy machines on a loaded two-core host: a DP group of four passes exactly, and nobody's
// send rate is below the median by the factor the controller judges with (a false slow link
// evicts a healthy machine). Each member keeps its best repetition, spread over a few
// scheduler slices, so a moment without a core is forgiven.
TEST_F(DiagnoseTest, HealthyLinksFlagNobody) {
  for (int round = 0; round < 3; ++round) {
    const std::string key = detail::concat("diag/", 10 + round, "/0");
    for (int r = 0; r < 4; ++r) start(key, r, r, 4, {0, 1, 2, 3}, 30000, dp4_path);
    const std::vector<int> codes = wait_all(120s);
    for (int r = 0; r < 4; ++r) EXPECT_EQ(codes[size_t(r)], 0) << "rank " << r << "\n" << logs();
    std::vector<report::Diagnostic> rows;
    std::string rates;
    for (int r = 0; r < 4; ++r) {
      rows.push_back(answer(key, r));
      ASSERT_EQ(rows.back().groups_size(), 1) << logs();
      EXPECT_TRUE(rows.back().groups(0).ok()) << rows.back().groups(0).error();
      rates += detail::concat(" ", rows.back().groups(0).bytes_per_s() / 1e6);
    }
    // The factor the controller judges with (detect.slow_factor's default, with the margin).
    const diag::Verdict v = diag::judge(rows, {10, 11, 12, 13}, 1.5 * diag::kOneShotSlowMargin);
    EXPECT_TRUE(v.failed_slots.empty()) << v.summary;
    std::printf("round %d: MB/s%s\n", round, rates.c_str());
  }
}

}  // namespace
}  // namespace keel::test
