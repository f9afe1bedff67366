#include "launcher/worker/diagnose_worker.h"
#include "launcher/worker/store_address.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "launcher/job_env.h"
#include "launcher/worker/rank_backend.h"
#include "parallel/net_address.h"
#include "parallel/socket_communicator.h"
#include "parallel/tcp_store.h"
#include "parallel/topology.h"
#include "proto/config_loader.h"
#include "proto/membership.pb.h"
#include "proto/report.pb.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "robust/fault_injector.h"
#include "robust/golden_check.h"
#include "robust/self_check.h"
#include "runtime/logging.h"

namespace keel {
namespace {

using Clock = std::chrono::steady_clock;

// How long a stand-in waits for its task and for the layout of the task's epoch: the
// controller wrote both before it started the stand-ins, so only a loaded store is slow.
constexpr Millis kTaskWait(10000);
// A diagnosis's budget when the config gives none (recovery.diagnostics_timeout_ms).
constexpr int kDefaultBudgetMs = 30000;
// A collective call of a group test: over a healthy link 1 MiB moves in milliseconds.
constexpr Millis kCallTimeout(5000);
// A group test's least share of the budget.
constexpr Millis kLeastGroupTimeout(1000);

// What this stand-in checks: the job rank it stands in for, the job's layout in the task's
// epoch, and the suspects.
struct DiagnoseTask {
  std::string key;
  int rank = 0;  // the job rank this process stands in for
  int epoch = 0;
  membership::Membership layout;
  std::set<int> suspects;  // empty: every group
};

// The task (store::DiagnoseTask at keys::diagnose_task_key(K)): stand-in `index` stands in
// for job rank job_ranks[index]; the layout is the Membership of the epoch's Rebuild.
DiagnoseTask read_task(Store& store, const std::string& key, int index) {
  const auto t = get_message<store::DiagnoseTask>(store, keys::diagnose_task_key(key), kTaskWait);
  if (index < 0 || index >= t.job_ranks_size())
    throw InputError(detail::concat(keys::diagnose_task_key(key), " names ", t.job_ranks_size(),
                                    " job rank(s), none for stand-in ", index));
  DiagnoseTask d;
  d.key = key;
  d.rank = t.job_ranks(index);
  d.epoch = t.epoch();
  d.suspects.insert(t.suspects().begin(), t.suspects().end());
  d.layout =
      get_message<membership::Rebuild>(store, keys::rebuild_key(t.epoch()), kTaskWait).membership();
  return d;
}

// The test buffer: member m holds (m + 1)·(i mod 13 + 1) at i, small integers whose sums are
// exact in float in any order, so a wrong bit anywhere is a wrong result, not rounding.
constexpr size_t kFloats = size_t(256) * 1024;
// A link is judged by its best repetition; on 2 cores shared by 4 members (and another job),
// 12 repetitions 10 ms apart were too few for a healthy link to get the cores once in every
// round (1 false slow link in ~10 rounds), and 24 still missed now and then: 24 spread over
// about a second.
constexpr int kWarmups = 1, kRepeats = 24;
constexpr Millis kPause(40);

float pattern(int member, size_t i) {
  return float(member + 1) * float(i % 13 + 1);
}

struct GroupSpec {
  const char* kind;
  std::vector<int> members;  // job ranks, by rank within the group
  std::string name;          // the topology's, e.g. "tp.dp1.pp0"
};

// One group test: meet the peers' stand-ins, all-reduce the buffer a few times and check it.
// One function from meeting to parting: every step uses the one communicator and fills the
// one result, and each early return is a verdict.
report::DiagnosticGroup test_group(const std::shared_ptr<Store>& store, const std::string& key,
                                   const GroupSpec& g, int job_rank, bool broken_links,
                                   const std::string& host, Millis timeout) {
  report::DiagnosticGroup r;
  r.set_group(g.name);
  r.set_blamed_rank(-1);
  const int me = int(std::find(g.members.begin(), g.members.end(), job_rank) - g.members.begin());
  const int n = int(g.members.size());
  const auto t0 = Clock::now();
  try {
    SocketCommOptions so;
    so.name = detail::concat(key, "/", g.kind, "/", g.name);
    so.rank = me;
    so.size = n;
    so.timeout = timeout;
    so.host = host;
    auto comm = make_socket_communicator(store, so);
    // Calls get a few seconds at most: over a healthy link 1 MiB moves in milliseconds.
    const Millis call = std::min(timeout, kCallTimeout);
    // Every member is connected once the barrier is through, so a peer's failure is seen as
    // that peer's (a PeerFailure naming it), not as a rendezvous that went wrong.
    comm->barrier(call);
    if (broken_links) {
      // A defective NIC, as the job recorded it: the links go down under the test.
      comm->abort();
      r.set_blamed_rank(job_rank);
      r.set_error("this machine's links are recorded defective: broke them, as its network would");
      r.set_seconds(std::chrono::duration<double>(Clock::now() - t0).count());
      return r;
    }
    // What the communicator has sent so far, summed over its peers.
    auto sent = [&comm] {
      std::pair<uint64_t, double> s{0, 0.0};
      for (const LinkStats& l : comm->link_stats()) {
        s.first += l.bytes_sent;
        s.second += l.send_s;
      }
      return s;
    };
    std::vector<float> buf(kFloats);
    double best = 0;  // bytes per second of the fastest repetition
    for (int rep = 0; rep < kWarmups + kRepeats; ++rep) {
      for (size_t i = 0; i < kFloats; ++i) buf[i] = pattern(me, i);
      // Spread over a few scheduler slices: on a loaded machine one preempted peer would
      // otherwise slow every repetition of a burst a few milliseconds long.
      std::this_thread::sleep_for(kPause);
      // A send waits for its peer to read: members that enter at different times (one still
      // checking the last result) would measure each other's lateness, not the link.
      comm->barrier(call);
      const auto before = sent();
      comm->all_reduce(buf.data(), kFloats, ReduceOp::kSum, call);
      const auto after = sent();
      // The best repetition: a healthy link reaches its speed in one of them when the
      // machine's other processes leave it the cores; a degraded one is slow in all.
      if (rep >= kWarmups && after.second > before.second)
        best = std::max(best, double(after.first - before.first) / (after.second - before.second));
      const float sum = float(n) * float(n + 1) / 2;
      for (size_t i = 0; i < kFloats; ++i)
        if (buf[i] != sum * float(i % 13 + 1)) {
          r.set_error(detail::concat("all-reduce of ", kFloats, " floats over ", n,
                                     " members: element ", i, " is ", buf[i], ", expected ",
                                     sum * float(i % 13 + 1)));
          r.set_seconds(std::chrono::duration<double>(Clock::now() - t0).count());
          return r;
        }
    }
    r.set_bytes_per_s(best);
    r.set_ok(true);
    // Nobody leaves before every peer has its result: a peer still receiving would see this
    // member's close as a failure.
    comm->barrier(call);
  } catch (const PeerFailure& e) {
    r.set_ok(false);
    if (e.peer() >= 0 && e.peer() < n) r.set_blamed_rank(g.members[size_t(e.peer())]);
    r.set_error(e.what());
  } catch (const std::exception& e) {
    r.set_ok(false);
    r.set_error(e.what());
  }
  r.set_seconds(std::chrono::duration<double>(Clock::now() - t0).count());
  return r;
}

// The checks; throws what keeps them from running (the caller publishes it).
void diagnose(const WorkerOptions& o, const DiagnoseTask& de, const std::shared_ptr<Store>& store,
              const std::string& store_host, report::Diagnostic* d) {
  const auto start = Clock::now();
  const config::JobConfig cfg = load_config(o.config_path, o.overrides);
  const membership::Membership& m = de.layout;
  if (m.tp() < 1 || m.pp() < 1 || m.dp() < 1)
    throw Error(detail::concat(keys::rebuild_key(de.epoch), ": a layout of tp", m.tp(), " pp",
                               m.pp(), " dp", m.dp()));
  const Topology topo(m.tp(), m.pp(), m.dp());
  if (de.rank < 0 || de.rank >= topo.world_size())
    throw InputError(detail::concat(keys::diagnose_task_key(de.key), " names job rank ", de.rank,
                                    ", but the job (tp", topo.tp(), " pp", topo.pp(), " dp",
                                    topo.dp(), ") has ", topo.world_size(), " ranks"));
  const int budget_ms = cfg.recovery().diagnostics_timeout_ms() > 0
                            ? cfg.recovery().diagnostics_timeout_ms()
                            : kDefaultBudgetMs;
  const auto groups_deadline = start + Millis(budget_ms * 3 / 4);

  const Precision precision = config_precision(cfg);
  // The device the rank itself uses.
  std::unique_ptr<Backend> backend = make_rank_backend(cfg, de.rank, o.local_world_size);

  const SelfCheckResult gemm = gemm_self_check(*backend, precision);
  d->set_gemm_ok(gemm.ok);
  d->set_gemm_max_rel_error(gemm.max_rel_error);

  // The machine's recorded defect is armed, so a machine that computes wrong fails here as
  // it would in training; on CPU with one thread, as the golden digests were recorded. Keel's
  // GPT, whatever the job trains: the check is of the machine (robust/golden_check.h).
  FaultInjector defect(faults::FaultSchedule{}, de.rank, store);
  const int slot = JobEnv::get().slot;
  TrainerHooks hooks;
  if (slot >= 0 && defect.arm_machine_defects(slot))
    hooks.computed = [&defect](int64_t s, TensorClass c, float* p, size_t n, bool again) {
      defect.on_computed(s, c, p, n, again);
    };
  std::unique_ptr<Backend> one_thread;
  if (backend->kind() == DeviceKind::kCpu) one_thread = make_cpu_backend(1);
  const GoldenCheckResult golden =
      golden_check(one_thread ? *one_thread : *backend, hooks, std::nullopt, precision);
  one_thread.reset();
  d->set_golden_ok(golden.ok);

  const bool broken_links = slot >= 0 && FaultInjector::machine_link_defective(*store, slot);
  std::vector<GroupSpec> specs;
  const std::pair<const char*, std::vector<int>> kinds[] = {{"tp", topo.tp_group(de.rank)},
                                                            {"pp", topo.pp_group(de.rank)},
                                                            {"dp", topo.dp_group(de.rank)}};
  for (const auto& [kind, members] : kinds) {
    if (members.size() <= 1) continue;
    // Only groups whose every member has a stand-in: those of a suspect.
    const bool suspect =
        de.suspects.empty() || std::any_of(members.begin(), members.end(),
                                           [&](int r) { return de.suspects.count(r) > 0; });
    if (!suspect) continue;
    const std::string name = std::string(kind) == "tp"   ? topo.tp_group_name(de.rank)
                             : std::string(kind) == "pp" ? topo.pp_group_name(de.rank)
                                                         : topo.dp_group_name(de.rank);
    specs.push_back({kind, members, name});
  }
  const std::string host = reachable_address(store_host);
  std::string text = gemm.message + "; " + golden.message;
  for (size_t i = 0; i < specs.size(); ++i) {
    // Its share of what is left, so that a peer that never comes costs one group's time.
    const auto left = std::chrono::duration_cast<Millis>(groups_deadline - Clock::now());
    const Millis timeout = std::max(kLeastGroupTimeout, left / int(specs.size() - i));
    *d->add_groups() = test_group(store, de.key, specs[i], de.rank, broken_links, host, timeout);
    const report::DiagnosticGroup& g = d->groups(int(i));
    char rate[32];
    std::snprintf(rate, sizeof(rate), "%.1f MB/s", g.bytes_per_s() / 1e6);
    text += detail::concat("; ", g.group(), g.ok() ? " all-reduce ok, " : " failed: ",
                           g.ok() ? std::string(rate) : g.error());
  }
  d->set_message(text);
}

}  // namespace

int run_diagnose_worker(const WorkerOptions& o) {
  const std::string key = JobEnv::get().diagnose_key;
  KEEL_CHECK(!key.empty(), env::kDiagnose, " is not set");
  const StoreAddress at = store_at(o.store_addr);
  const std::string host = at.toward_host;
  std::shared_ptr<Store> store = at.connect();
  // Without its task the stand-in does not know whom it answers for: main() reports that and
  // exits non-zero, and the controller counts this process as silent.
  const DiagnoseTask de = read_task(*store, key, o.rank);
  report::Diagnostic d;
  d.set_rank(de.rank);
  d.set_slot(JobEnv::get().slot);
  d.set_answered(true);
  int code = 0;
  try {
    diagnose(o, de, store, host, &d);
  } catch (const std::exception& e) {
    d.set_error(e.what());
    code = 1;
  }
  LOG(INFO) << de.key << " job rank " << de.rank << " (slot " << d.slot() << "): "
            << (d.error().empty() ? d.message() : "could not run its checks: " + d.error());
  // Without the store the answer cannot be given: main() reports that and exits non-zero,
  // and the controller counts this process as silent.
  set_message(*store, keys::diagnose_result_key(de.key, de.rank), d);
  return code;
}

}  // namespace keel
