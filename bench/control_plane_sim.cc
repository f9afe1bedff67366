// One size of keel-bench control-plane (bench/control_plane_sim.h): a real etcd, the real
// controller taking the job over as a new leader, and the fake slots.
#include "bench/control_plane_sim.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <google/protobuf/text_format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "bench/bench_util.h"
#include "bench/control_plane_fakes.h"
#include "launcher/etcd/etcd_client.h"
#include "launcher/etcd/etcd_members.h"
#include "launcher/etcd/etcd_store.h"
#include "launcher/recovery_protocol.h"
#include "parallel/job_key.h"
#include "proto/config_loader.h"
#include "proto/control_state.pb.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "runtime/check.h"
#include "runtime/text.h"

namespace keel::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The standby slots' self-check generation in the seeded Membership (its keys' name part).
constexpr int kStandbyGen = 1;
// Generous bounds on each phase, so that a size that cannot run on this machine says so
// instead of hanging the ladder: the agents' registration (its own deadline is the slot
// timeout, under the controller), the recovery, the failover.
constexpr std::chrono::seconds kLeaderWait{60};
constexpr std::chrono::seconds kRegisterWait{120};
constexpr std::chrono::seconds kRecoveryWait{300};
constexpr std::chrono::seconds kFailoverWait{120};
// Before the CPU window: the controller's start-up work (the takeover's reads, the first
// progress of every rank) is not steady state.
constexpr std::chrono::seconds kSettle{2};
constexpr std::chrono::milliseconds kPoll{5};

// Waits until `done` or `limit`; false on the limit.
bool wait_for(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(kPoll);
  }
  return true;
}

// utime + stime of a process, in seconds (/proc/<pid>/stat, fields 14 and 15).
double process_cpu_s(pid_t pid) {
  const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  KEEL_CHECK(close != std::string::npos, "/proc/", pid, "/stat: not readable");
  std::istringstream in(stat.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && in >> field; ++i)
    if (i >= 14) ticks += std::stod(field);
  return ticks / double(sysconf(_SC_CLK_TCK));
}

// One counter of etcd's Prometheus endpoint (http://<endpoint>/metrics).
double etcd_metric(const std::string& endpoint, const std::string& name) {
  const size_t colon = endpoint.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(std::stoi(endpoint.substr(colon + 1))));
  KEEL_CHECK(inet_pton(AF_INET, endpoint.substr(0, colon).c_str(), &a.sin_addr) == 1,
             "etcd endpoint ", endpoint, ": not an IPv4 address");
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  KEEL_CHECK(fd >= 0, "socket: ", std::strerror(errno));
  std::string body;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: " + endpoint + "\r\n\r\n";
    if (write(fd, req.data(), req.size()) == ssize_t(req.size())) {
      char buf[1 << 16];
      for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) body.append(buf, size_t(n));
    }
  }
  close(fd);
  const std::string key = "\n" + name + " ";
  const size_t at = body.find(key);
  KEEL_CHECK(at != std::string::npos, "etcd at ", endpoint, ": no metric ", name);
  return std::stod(body.substr(at + key.size()));
}

struct EtcdCounters {
  double puts = 0, put_bytes = 0, ranges = 0;
};

EtcdCounters etcd_counters(const std::string& endpoint) {
  return {etcd_metric(endpoint, "etcd_mvcc_put_total"),
          etcd_metric(endpoint, "etcd_debugging_mvcc_total_put_size_in_bytes"),
          etcd_metric(endpoint, "etcd_mvcc_range_total")};
}

// A controller process: keel-launch --candidate for `slot`, its output in `log`. It dies with
// this process (PR_SET_PDEATHSIG).
pid_t start_candidate(const ControlPlaneOptions& o, const std::string& job, int slot,
                      const std::string& etcd, const std::string& log) {
  const std::vector<std::string> args = {
      o.keel_launch,        "--candidate", "--job",     job,      "--slot",
      std::to_string(slot), "--host",      "127.0.0.1", "--etcd", etcd};
  // The fakes' key (this process's), handed over as a launcher keel does not control would.
  const std::string key = process_job_key().hex();
  const pid_t pid = fork();
  KEEL_CHECK(pid >= 0, "fork: ", std::strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    setenv(kSecretEnv, key.c_str(), 1);
    const int out = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (out >= 0) {
      dup2(out, 1);
      dup2(out, 2);
    }
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

void kill_and_reap(pid_t pid) {
  if (pid <= 0) return;
  ::kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

// The leader's value in the job's election: the candidacy key created first.
std::optional<state::Leader> current_leader(EtcdClient& client, const std::string& job) {
  EtcdRange r;
  r.order = EtcdRange::Order::kCreateAscending;
  r.limit = 1;
  const auto kvs = client.get_prefix(keys::state::leader_prefix(job), r);
  state::Leader l;
  if (kvs.empty() || !l.ParseFromString(kvs[0].value) || l.endpoint().empty()) return std::nullopt;
  return l;
}

// The events of the job's log (events.jsonl) of `kind`, oldest first.
std::vector<events::Event> events_of(const std::string& run_dir, const std::string& kind) {
  std::vector<events::Event> out;
  std::istringstream in(read_text(run_dir + "/events.jsonl"));
  for (std::string line; std::getline(in, line);) {
    events::Event e;
    if (parse_event(line, &e) && e.kind() == kind) out.push_back(e);
  }
  return out;
}

// What the job's first leader would have left in etcd: its spec, the Membership of epoch 0
// (slots 0..active-1 running `per_slot` ranks each, the rest ready standbys), epoch 0's
// Rebuild in the store and the standbys' passed self-checks.
void seed_job(EtcdClient& client, const ControlPlaneOptions& o, const std::string& job, int active,
              const std::string& run_dir, const std::string& store_addr) {
  const int world = active * o.per_slot;
  const int slots = active + o.standby;
  // A TP group a slot and one DP replica a slot, as a large job is laid out: the backup of a
  // slot's ranks is then on the next slot (ckpt/backup_placement.h). The model is never built;
  // its heads only have to split over the TP group.
  const std::string tp = std::to_string(o.per_slot);
  std::vector<std::string> sets = {"parallel.tp=" + tp,
                                   "parallel.pp=1",
                                   "parallel.dp=" + std::to_string(active),
                                   "model.num_heads=" + tp,
                                   "model.hidden_size=" + std::to_string(16 * o.per_slot),
                                   "train.micro_batch_size=1",
                                   "train.global_batch_size=" + std::to_string(active),
                                   "train.steps=1000000",
                                   "train.eval_every=0"};
  if (o.slot_timeout_ms > 0)
    sets.push_back("detect.slot_timeout_ms=" + std::to_string(o.slot_timeout_ms));
  const config::JobConfig cfg = load_config(o.config, sets);
  state::JobSpec spec;
  spec.set_job(job);
  KEEL_CHECK(google::protobuf::TextFormat::PrintToString(cfg, spec.mutable_config()),
             "cannot print the job's config");
  spec.set_world(world);
  spec.set_slots(slots);
  spec.set_standby(o.standby);
  spec.set_workers_per_slot(o.per_slot);
  spec.set_lineage(job);
  spec.set_job_start(recovery::unix_now());
  spec.set_run_dir(run_dir);
  spec.add_worker_argv("keel-worker");  // never started: every worker is a fake
  spec.set_store_addr(store_addr);
  membership::Membership m;
  m.set_epoch(0);
  m.set_tp(o.per_slot);
  m.set_pp(1);
  m.set_dp(active);
  for (int r = 0; r < world; ++r) m.add_rank_slot(r / o.per_slot);
  for (int k = 0; k < slots; ++k) {
    membership::SlotInfo* si = m.add_slots();
    si->set_slot(k);
    si->set_host("127.0.0.1");
    const bool standby = k >= active;
    si->set_state(standby ? membership::SlotInfo::standby : membership::SlotInfo::active);
    si->set_role(standby ? membership::SlotInfo::role_standby : membership::SlotInfo::role_active);
    si->set_ready(standby);
    si->set_standby_gen(standby ? kStandbyGen : 0);
    si->set_initial_standby(standby);
  }
  client.put(keys::state::spec(job), spec.SerializeAsString());
  std::shared_ptr<Store> store = connect_etcd_store(store_addr);
  membership::Rebuild rb;
  *rb.mutable_membership() = m;
  rb.set_restore_step(-2);  // the job's start state (controller_recovery.cc, kStartState)
  // The job's record as a first leader would have left it (state::JobState).
  state::JobState js;
  *js.mutable_membership() = m;
  *js.mutable_transition() = rb;
  client.put(keys::state::job_state(job), js.SerializeAsString());
  set_message(*store, keys::rebuild_key(0), rb);
  store::StandbyCheck ok;
  ok.set_ok(true);
  ok.set_checks("control-plane simulation: a fake parked worker");
  for (int k = active; k < slots; ++k)
    for (int i = 0; i < o.per_slot; ++i)
      set_message(*store, keys::standby_ready_key(k, i, kStandbyGen), ok);
}

// Whether `rb` is what the loss of `lost` must give: the next epoch, every rank of `lost` on
// the first standby slot, every other rank where it was.
bool rebuild_moves(const membership::Rebuild& rb, int epoch, int lost, int standby_slot,
                   int per_slot, int world) {
  const membership::Membership& m = rb.membership();
  if (m.epoch() != epoch || m.rank_slot_size() != world) return false;
  for (int r = 0; r < world; ++r) {
    const int want = r / per_slot == lost ? standby_slot : r / per_slot;
    if (m.rank_slot(r) != want) return false;
  }
  return true;
}

void say(const ControlPlaneOptions& o, const std::string& line) {
  if (o.quiet) return;
  std::printf("keel-bench control-plane: %s\n", line.c_str());
  std::fflush(stdout);
}

void measure(const ControlPlaneOptions& o, int ranks, const std::string& dir,
             ControlPlaneRow* row) {
  const int active = ranks / o.per_slot;
  const int slots = active + o.standby;
  const std::string job = "cpsim" + std::to_string(ranks);
  const std::string run_dir = dir + "/run";
  fs::create_directories(run_dir + "/logs");

  const std::vector<int> ports = free_tcp_ports("127.0.0.1", 2);
  EtcdMemberSpec es;
  es.name = "m0";
  es.host = "127.0.0.1";
  es.client_port = ports[0];
  es.peer_port = ports[1];
  es.data_dir = dir + "/etcd";
  es.log_path = dir + "/etcd.log";
  es.token = job;
  // Plain: its Prometheus metrics are read over HTTP (scrape_metric), and the simulation
  // measures the control plane's scaling, not TLS.
  es.tls = false;
  es.cluster = etcd_cluster({es});
  EtcdMember etcd(es);
  etcd.wait_healthy(std::chrono::seconds(30));
  const std::string ep = etcd.endpoint();
  EtcdClient client({ep}, std::chrono::seconds(5));
  const std::string store_addr = etcd_store_address({ep}, keys::state::store_prefix(job));
  seed_job(client, o, job, active, run_dir, store_addr);

  FakeClusterOptions fo;
  fo.job = job;
  fo.active_slots = active;
  fo.standby_slots = o.standby;
  fo.per_slot = o.per_slot;
  fo.store_addr = store_addr;
  fo.heartbeat = std::chrono::milliseconds(o.heartbeat_ms);
  fo.progress = std::chrono::milliseconds(o.progress_ms);
  fo.step = std::chrono::milliseconds(o.step_ms);
  FakeCluster fakes(fo);

  pid_t leader = start_candidate(o, job, 0, ep, run_dir + "/logs/slot0-controller.log");
  pid_t second = -1;
  struct Reap {
    pid_t* a;
    pid_t* b;
    ~Reap() {
      kill_and_reap(*a);
      kill_and_reap(*b);
    }
  } reap{&leader, &second};
  std::optional<state::Leader> lead;
  KEEL_CHECK(wait_for([&] { return bool(lead = current_leader(client, job)); }, kLeaderWait),
             "the controller did not win the job's election within ", kLeaderWait.count(),
             " s (see ", run_dir, "/logs/slot0-controller.log)");
  KEEL_CHECK(lead->pid() == leader, "the job's leader is pid ", lead->pid(), ", not ", leader);
  // The second candidate waits in line behind the leader from now on.
  if (o.failover) second = start_candidate(o, job, 1, ep, run_dir + "/logs/slot1-controller.log");
  fakes.follow(lead->endpoint());
  KEEL_CHECK(wait_for([&] { return !events_of(run_dir, "takeover").empty(); }, kRegisterWait),
             "the controller did not take the job over within ", kRegisterWait.count(), " s (",
             fakes.welcomed(), " of ", slots, " agents welcomed)");
  const events::Event takeover = events_of(run_dir, "takeover").front();
  row->register_s = event_number(takeover, "rejoin_s");
  KEEL_CHECK(event_number(takeover, "slots_lost") == 0, "the takeover lost ",
             event_number(takeover, "slots_lost"),
             " slot(s): the fakes could not register in time ", fakes.error());
  KEEL_CHECK(wait_for([&] { return fakes.welcomed() == slots; }, kRegisterWait), fakes.welcomed(),
             " of ", slots, " agents welcomed");
  say(o, detail::concat(ranks, " ranks: ", slots, " agents registered in ", row->register_s, " s"));

  // Steady state.
  std::this_thread::sleep_for(kSettle);
  const double cpu0 = process_cpu_s(leader);
  const int64_t msgs0 = fakes.progress_sent() + fakes.heartbeats_sent();
  const int64_t rx0 = fakes.received_bytes();
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(o.steady_s));
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  row->cpu_per_s = (process_cpu_s(leader) - cpu0) / wall;
  row->msgs_per_s = double(fakes.progress_sent() + fakes.heartbeats_sent() - msgs0) / wall;
  row->ctl_kb_per_s = double(fakes.received_bytes() - rx0) / 1e3 / wall;
  say(o, detail::concat(ranks, " ranks: controller CPU ", row->cpu_per_s, " s/s at ",
                        int64_t(row->msgs_per_s), " messages/s"));

  // A slot's loss: the middle active slot's machine dies.
  const int lost = active / 2;
  const EtcdCounters before = etcd_counters(ep);
  const double lost_at = fakes.lose_slot(lost);
  std::shared_ptr<Store> store = connect_etcd_store(store_addr);
  double rebuilt_at = 0;
  std::string stopped;  // why the controller stopped the job instead
  KEEL_CHECK(wait_for(
                 [&] {
                   if (store->try_get(keys::rebuild_key(1))) {
                     rebuilt_at = recovery::unix_now();
                     return true;
                   }
                   const auto stop = events_of(run_dir, "stop_decision");
                   if (!stop.empty())
                     stopped = stop.front().data().fields().at("why").string_value();
                   return !stopped.empty();
                 },
                 kRecoveryWait) &&
                 stopped.empty(),
             "no rebuild/1 within ", kRecoveryWait.count(), " s of slot ", lost,
             "'s loss (the fakes answered ", fakes.surveys(), " survey(s))",
             stopped.empty() ? "" : ": the controller stopped the job: " + stopped.substr(0, 300));
  KEEL_CHECK(fakes.surprises() == 0, "the fakes met ", fakes.surprises(),
             " message(s) they could not take");
  // The controller's own clock for the decision; the poll above bounds it from above.
  const std::vector<events::Event> rebuilds = events_of(run_dir, "rebuild");
  row->rebuild_s = (rebuilds.empty() ? rebuilt_at : rebuilds.front().t()) - lost_at;
  const std::vector<events::Event> losses = events_of(run_dir, "slot_lost");
  if (!losses.empty()) row->detect_s = losses.front().t() - lost_at;
  KEEL_CHECK(wait_for([&] { return fakes.restored_epoch() >= 1; }, kRecoveryWait),
             "the fake ranks did not take up epoch 1: ", fakes.error());
  KEEL_CHECK(wait_for([&] { return !events_of(run_dir, "recovered").empty(); }, kRecoveryWait),
             "no recovered event");
  const EtcdCounters after = etcd_counters(ep);
  row->etcd_writes = after.puts - before.puts;
  row->etcd_bytes = after.put_bytes - before.put_bytes;
  row->etcd_reads = after.ranges - before.ranges;
  row->ctl_etcd_writes = event_number(events_of(run_dir, "recovered").front(), "etcd_writes");
  const std::optional<membership::Rebuild> rb = fakes.rebuild(1);
  row->rebuild_ok = rb && rebuild_moves(*rb, 1, lost, active, o.per_slot, ranks);
  say(o, detail::concat(ranks, " ranks: slot ", lost, " lost, rebuild in ", row->rebuild_s, " s, ",
                        int64_t(row->etcd_writes), " etcd writes"));

  if (o.failover) {
    // The leader's process dies alone; the second candidate takes over, and the agents, which
    // follow the election, register with it.
    const std::string old = lead->endpoint();
    kill_and_reap(leader);
    leader = -1;
    const auto killed = Clock::now();
    KEEL_CHECK(wait_for(
                   [&] {
                     lead = current_leader(client, job);
                     return lead && lead->endpoint() != old;
                   },
                   kFailoverWait),
               "no new leader within ", kFailoverWait.count(), " s of the leader's kill");
    fakes.follow(lead->endpoint());
    const int live = fakes.live_slots();
    KEEL_CHECK(wait_for([&] { return fakes.welcomed() == live; }, kFailoverWait),
               "the new leader welcomed ", fakes.welcomed(), " of ", live, " agents");
    row->failover_s = std::chrono::duration<double>(Clock::now() - killed).count();
    say(o, detail::concat(ranks, " ranks: failover in ", row->failover_s, " s"));
  }
  row->incidents = int(events_of(run_dir, "recovered").size());
  KEEL_CHECK(fakes.error().empty(), "the fakes: ", fakes.error());
}

}  // namespace

ControlPlaneRow run_control_plane_size(const ControlPlaneOptions& o, int ranks) {
  ControlPlaneRow row;
  row.ranks = ranks;
  row.slots = ranks / std::max(1, o.per_slot) + o.standby;
  const std::string root = o.work_dir.empty() ? "/dev/shm" : o.work_dir;
  const std::string dir =
      root + "/keel-cp-" + std::to_string(getpid()) + "-" + std::to_string(ranks);
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir);
  try {
    KEEL_CHECK(o.per_slot > 0 && ranks % o.per_slot == 0 && ranks / o.per_slot >= 2, ranks,
               " ranks: need at least 2 slots of ", o.per_slot);
    KEEL_CHECK(o.standby >= 1, "a slot's loss needs a standby to move to");
    measure(o, ranks, dir, &row);
  } catch (const std::exception& e) {
    row.error = e.what();
  }
  // A size that failed keeps its logs (the controller's, etcd's) for a look.
  if (row.error.empty())
    fs::remove_all(dir, ec);
  else
    row.error += " (its logs: " + dir + ")";
  return row;
}

}  // namespace keel::bench
