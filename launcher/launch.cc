#include "launcher/launch.h"

#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "ckpt/backup_placement.h"
#include "ckpt/checkpoint_dir_lock.h"
#include "ckpt/persistent_checkpoint.h"
#include "ckpt/snapshot_region.h"
#include "launcher/agent/agent.h"
#include "launcher/control_plane.h"
#include "launcher/controller/agent_host.h"
#include "launcher/controller/controller.h"
#include "launcher/controller/event_log.h"
#include "launcher/controller/job_etcd.h"
#include "launcher/controller/local_host.h"
#include "launcher/fault_checks.h"
#include "launcher/job_env.h"
#include "launcher/recovery_protocol.h"
#include "parallel/net_address.h"
#include "parallel/tcp_store.h"
#include "proto/config_loader.h"
#include "robust/fault_spec.h"
#include "runtime/backend.h"
#include "runtime/check.h"
#include "runtime/logging.h"
#include "runtime/text.h"

namespace keel {
namespace {

namespace fs = std::filesystem;

volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) {
  g_signal = sig;
}

std::string self_dir() {
  return fs::path(self_exe_path()).parent_path().string();
}

// How long slot 0 waits for every slot to register: machines of a cluster start their
// launchers within seconds of each other; a minute means one will not come.
constexpr std::chrono::seconds kRegisterWait{60};
// At the end: how long the forked slots' agents get to stop on the shutdown command before
// they are signalled, and how often they are looked at meanwhile.
constexpr std::chrono::milliseconds kShutdownGrace{1000};
constexpr std::chrono::milliseconds kReapPoll{5};

// The bootstrap message's buffer under mpirun: a length and the message (a fixed size, as
// every rank must pass MPI_Bcast the same count).
constexpr size_t kBootstrapBytes = 1024;

void store_le32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = char((v >> (8 * i)) & 0xff);
}
uint32_t load_le32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(p[i])) << (8 * i);
  return v;
}

// --workers-per-slot, else one worker per GPU of this machine on CUDA, else 1. Every slot
// of a job is taken to be the same kind of machine as slot 0.
int workers_per_slot(const LaunchOptions& o, const config::JobConfig& cfg) {
  if (o.workers_per_slot > 0) return o.workers_per_slot;
  if (cfg.runtime().device() == config::RuntimeConfig::cuda)
    return std::max(1, cuda_device_count());
  return 1;
}

// --resume DIR is a job's run directory (it holds config.pbtxt) or a checkpoint directory.
// Makes o->resume the checkpoint directory every worker resumes from (absolute: a worker's
// working directory may differ) and, for a run directory without --config, takes its config.
void resolve_resume(LaunchOptions* o) {
  const std::string given = o->resume;
  std::error_code ec;
  if (!fs::is_directory(given, ec))
    throw InputError("--resume " + given +
                     ": no such directory (expected a checkpoint directory, or a job's run "
                     "directory runs/<job>/ holding its config.pbtxt)");
  const fs::path run_cfg = fs::path(given) / "config.pbtxt";
  if (!fs::exists(run_cfg, ec)) {
    o->resume = fs::absolute(given).string();
    return;
  }
  if (o->config_path.empty()) o->config_path = run_cfg.string();
  const config::JobConfig run = load_config(run_cfg.string(), {});
  const std::string ck = run.checkpoint().dir();
  if (!fs::is_directory(ck, ec))
    throw InputError(detail::concat("--resume ", given, ": the job's checkpoint directory ", ck,
                                    " (checkpoint.dir in ", run_cfg.string(),
                                    ", relative to this directory) does not exist",
                                    run.checkpoint().persistent_every_steps() > 0
                                        ? ""
                                        : ": the job wrote no persistent checkpoints "
                                          "(checkpoint.persistent_every_steps is 0)"));
  o->resume = fs::absolute(ck).string();
}

// The job's etcd as launcher/controller/job_etcd.h sets it up, with the job spec it writes.
JobEtcdOptions etcd_options(const LaunchOptions& o, const config::JobConfig& cfg,
                            const ControllerOptions& co, int nslots, int W,
                            const std::string& data_root, const FaultPlan& plan) {
  JobEtcdOptions e;
  e.slots = nslots;
  e.members = o.etcd_members;
  e.endpoints = o.etcd;
  e.data_root = data_root;
  e.log_dir = (fs::path(co.run_dir) / "logs").string();
  e.quorum_timeout = std::chrono::milliseconds(cfg.detect().quorum_timeout_ms());
  e.leader.set_endpoint(co.controller_endpoint);
  e.leader.set_slot(0);
  e.leader.set_pid(int(getpid()));
  state::JobSpec& s = e.spec;
  s.set_job(co.job);
  s.set_config(config_to_text(cfg));
  char hash[17];
  std::snprintf(hash, sizeof(hash), "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(s.config().data(), s.config().size())));
  s.set_config_hash(hash);
  s.set_world(cfg.parallel().tp() * cfg.parallel().pp() * cfg.parallel().dp());
  s.set_slots(nslots);
  s.set_standby(o.standby);
  s.set_workers_per_slot(W);
  *s.mutable_faults() = plan.schedule;
  s.set_lineage(co.lineage);
  s.set_job_start(co.job_start);
  s.set_run_dir(co.run_dir);
  s.set_report_path(co.report_path);
  return e;
}

int run_agent(const LaunchOptions& o, const config::JobConfig& cfg, int slot,
              const std::string& endpoint, const std::string& job, const std::string& host) {
  AgentOptions a;
  a.slot = slot;
  a.workers = workers_per_slot(o, cfg);
  a.host = host;
  a.controller = endpoint;
  a.log_dir = (fs::path(o.run_dir) / job / "logs").string();
  a.zero1 = cfg.parallel().zero1();
  a.job = job;
  a.controller_timeout = std::chrono::milliseconds(cfg.detect().controller_timeout_ms());
  fs::create_directories(a.log_dir);
  Agent agent(a);
  return agent.run(reinterpret_cast<const volatile int*>(&g_signal));
}

// Slot 0 of `nslots`: the controller and slot 0's agent. Under mpirun the other slots learn
// the controller's address from MPI; with `fork_slots` (--local) this process starts them on
// this machine; otherwise (--slots) they are started by hand with --join.
int run_slot0(const LaunchOptions& o, const config::JobConfig& cfg, int nslots, bool mpi,
              bool fork_slots) {
  const Topology topo(cfg.parallel().tp(), cfg.parallel().pp(), cfg.parallel().dp());
  const int world = topo.world_size(), W = workers_per_slot(o, cfg);
  if (world % W != 0)
    throw InputError(detail::concat("--workers-per-slot ", W, " does not divide the job's ", world,
                                    " ranks (parallel.tp·pp·dp)"));
  if (nslots - o.standby != world / W)
    throw InputError(detail::concat("the job needs ", world / W, " slot(s) (", world, " ranks, ", W,
                                    " per slot) plus --standby ", o.standby,
                                    " but was started with ", nslots, "; start it with ",
                                    mpi          ? "mpirun -np "
                                    : fork_slots ? "--local "
                                                 : "--slots ",
                                    world / W + o.standby));
  // The job's faults, checked as keel-ctl inject's are at run time (launcher/fault_checks.h).
  FaultPlan plan;
  for (size_t i = 0; i + 1 < o.worker_args.size(); ++i) {
    if (o.worker_args[i] == "--fault") add_fault_flag(&plan, o.worker_args[i + 1]);
    if (o.worker_args[i] == "--inject") add_fault_file(&plan, o.worker_args[i + 1]);
  }
  check_faults(plan,
               FaultJob{.world = world,
                        .steps = cfg.train().steps(),
                        .slot_of = [W](int rank) { return rank / W; },
                        .own_interfaces = !JobEnv::get().ifname.empty()},
               0, /*running=*/false);
  std::optional<ResumePoint> resumed;
  if (!o.resume.empty()) {
    // Checked here, so that a missing or unusable checkpoint is said once, before any slot
    // starts; every worker then loads the same step (nothing writes checkpoints meanwhile).
    CheckpointLayout layout;
    layout.tp = topo.tp();
    layout.pp = topo.pp();
    layout.dp = topo.dp();
    layout.zero1 = cfg.parallel().zero1();
    std::vector<std::string> skipped;
    resumed = find_resume_point(o.resume, layout, &skipped);
    for (const auto& s : skipped) LOG(WARNING) << "skipped checkpoint " << s;
    std::printf("keel-launch: resuming from checkpoint step %lld (%s)\n",
                static_cast<long long>(resumed->step), resumed->dir.c_str());
    std::fflush(stdout);
  }
  const std::string job = make_job_id();
  const std::string lineage = checkpoint_lineage(job, resumed ? &*resumed : nullptr);
  std::optional<CheckpointDirLock> ckpt_lock;
  if (cfg.checkpoint().persistent_every_steps() > 0)
    ckpt_lock.emplace(cfg.checkpoint().dir(), job, lineage);
  const fs::path dir = fs::path(o.run_dir) / job;
  fs::create_directories(dir / "logs");
  std::ofstream(dir / "config.pbtxt") << config_to_text(cfg);
  EventLog events((dir / "events.jsonl").string());

  // Every slot on this machine: loopback; across machines (KEEL_IFNAME names the interface
  // they share): this machine's reachable address.
  // Under mpirun across machines without KEEL_IFNAME: the first interface that is not
  // loopback (the MPI launcher placed ranks on other hosts, which must reach this one).
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const bool spans_hosts = mpi && local && std::atoi(local) < nslots;
  std::string host = "127.0.0.1";
  if (!JobEnv::get().ifname.empty()) {
    host = reachable_address("127.0.0.1");
  } else if (spans_hosts) {
    for (const auto& [ifname, addr] : ipv4_interfaces())
      if (addr.rfind("127.", 0) != 0) {
        host = addr;
        break;
      }
  }
  remove_stale_segments();
  TcpStoreServer store_server(host, 0);
  ControlServer control(host, 0);
  const std::string store_addr = host + ":" + std::to_string(store_server.port());
  std::ofstream(dir / "controller") << control.endpoint() << "\n" << job << "\n";
  events.write("launch", EventFields().add("job", job).add("slots", nslots).add("world", world));

  std::vector<pid_t> children;
  if (mpi) {
    control::Bootstrap b;
    b.set_controller(control.endpoint());
    b.set_job(job);
    std::string buf = b.SerializeAsString();
    KEEL_CHECK(buf.size() + 4 <= kBootstrapBytes, "the bootstrap message is too long");
    buf.insert(0, std::string(4, '\0'));
    store_le32(buf.data(), uint32_t(buf.size() - 4));
    buf.resize(kBootstrapBytes);
    MPI_Bcast(buf.data(), int(buf.size()), MPI_CHAR, 0, MPI_COMM_WORLD);
    MPI_Finalize();  // MPI is for starting only: it cannot survive a dead peer
  } else if (fork_slots) {
    for (int k = 1; k < nslots; ++k) {
      // The real path, not /proc/self/exe: ps shows what each process is.
      std::vector<std::string> argv = {
          self_exe_path(), "--join", control.endpoint(), "--slot",      std::to_string(k),
          "--job",         job,      "--config",         o.config_path, "--run-dir",
          o.run_dir};
      for (const auto& s : o.overrides) argv.insert(argv.end(), {"--set", s});
      if (o.workers_per_slot > 0)
        argv.insert(argv.end(), {"--workers-per-slot", std::to_string(o.workers_per_slot)});
      // SIGTERM, not SIGKILL, when slot 0 dies: the slot's agent then stops its workers and
      // removes the job's shared memory before it goes (launcher/agent/agent.h).
      children.push_back(spawn_child(argv, {}, "", SIGTERM));
    }
  }
  std::thread agent0([&] {
    pthread_setname_np(pthread_self(), "keel-agent");  // for top -H; the name always fits
    run_agent(o, cfg, 0, control.endpoint(), job, host);
  });

  std::vector<std::string> worker_argv = {self_dir() + "/keel-worker", "--config",
                                          fs::absolute(o.config_path).string()};
  for (const auto& s : o.overrides) worker_argv.insert(worker_argv.end(), {"--set", s});
  std::string report = fs::absolute(dir / "report.json").string();
  for (size_t i = 0; i + 1 < o.worker_args.size(); ++i)
    if (o.worker_args[i] == "--report") report = o.worker_args[i + 1];
  worker_argv.insert(worker_argv.end(), o.worker_args.begin(), o.worker_args.end());
  if (!o.resume.empty()) worker_argv.insert(worker_argv.end(), {"--resume", o.resume});
  if (report == fs::absolute(dir / "report.json").string())
    worker_argv.insert(worker_argv.end(), {"--report", report});

  const double job_start = recovery::unix_now();
  auto store = std::make_shared<TcpStore>(host, store_server.port());
  // What a parked standby worker knows before it has a rank (launcher/worker/standby.h).
  char start[32];
  std::snprintf(start, sizeof(start), "%.6f", job_start);
  const std::map<std::string, std::string> standby_env = {
      {"KEEL_WORLD_SIZE", std::to_string(world)},
      {"KEEL_STORE_ADDR", store_addr},
      {"KEEL_JOB_ID", job},
      {"KEEL_SUPERVISED", "1"},
      {"KEEL_CONTROLLER", control.endpoint()},
      {"KEEL_JOB_START", start},
      {"KEEL_LINEAGE", lineage},
      {"OMP_WAIT_POLICY", "PASSIVE"}};
  AgentHost agents(&control, store, world, W, nslots, o.standby, worker_argv, standby_env,
                   std::chrono::milliseconds(cfg.detect().slot_timeout_ms()));
  agents.set_job(job);  // a --join with another job's id is refused, not taken
  ControllerOptions co;
  co.cfg = cfg;
  co.job = job;
  co.lineage = lineage;
  co.job_start = job_start;
  co.store_addr = store_addr;
  co.controller_endpoint = control.endpoint();
  co.run_dir = dir.string();
  co.report_path = report;
  co.faults = plan.schedule;
  co.console_progress = !o.quiet;
  co.stop_signal = &g_signal;
  co.on_event = [&](const std::string& k, const EventFields& f) { events.write(k, f); };
  Controller controller(co, &agents, store, &control);
  controller.set_agent_handler(
      [&](const std::string& id, const control::Envelope& m) { agents.on_message(id, m); });
  agents.set_pump([&] { controller.pump(); });
  int code = 0;
  JobEtcd etcd;
  // Under --local every member shares one machine: its disk buys no durability that /dev/shm
  // does not have, and costs fsyncs (the first election takes seconds longer on disk).
  const bool etcd_shm = o.etcd_data == "shm" || (o.etcd_data.empty() && fork_slots);
  const std::string etcd_data = etcd_shm ? etcd_shm_dir(job) : (dir / "etcd").string();
  if (!agents.wait_for_slots(kRegisterWait, reinterpret_cast<const volatile int*>(&g_signal))) {
    LOG(ERROR) << "not every slot registered with the controller within " << kRegisterWait.count()
               << " s";
    code = 1;
  } else {
    if (!o.quiet)
      std::printf("keel-launch: job %s: %d slot(s) x %d worker(s), run directory %s\n", job.c_str(),
                  nslots, W, dir.c_str());
    try {
      etcd =
          start_job_etcd(agents, etcd_options(o, cfg, co, nslots, W, etcd_data, plan), co.on_event);
    } catch (const std::exception& e) {
      LOG(ERROR) << "the job's etcd: " << e.what();
      code = 1;
    }
    if (!etcd.summary.empty()) {
      if (!o.quiet) std::printf("keel-launch: %s\n", etcd.summary.c_str());
      events.write("etcd", EventFields()
                               .add("summary", etcd.summary)
                               .add("endpoints", join(etcd.client->endpoints(), ',')));
    }
    std::fflush(stdout);
    controller.set_control_state(etcd.state.get(), etcd.upkeep.get());
    if (code == 0) code = controller.run();
  }
  // The etcd writes of the whole job: with those of each recovery (the `recovered` events),
  // they show that nothing on the step path writes to etcd.
  events.write("end", EventFields()
                          .add("code", code)
                          .add("etcd_writes", etcd.client ? int64_t(etcd.client->writes()) : 0));
  agents.stop_all(SIGKILL, std::chrono::milliseconds(0));
  etcd.state.reset();  // resigns, while the members still run
  agents.finish();
  // The forked slots' agents took the shutdown and end by themselves; one that has not within
  // the grace is told again by signal.
  const auto grace_end = std::chrono::steady_clock::now() + kShutdownGrace;
  std::vector<pid_t> left = children;
  while (!left.empty() && std::chrono::steady_clock::now() < grace_end) {
    std::erase_if(left, [](pid_t p) {
      int st = 0;
      return waitpid(p, &st, WNOHANG) == p;
    });
    if (!left.empty()) std::this_thread::sleep_for(kReapPoll);
  }
  g_signal = g_signal ? g_signal : SIGTERM;
  agent0.join();
  for (pid_t p : left) {
    kill(p, SIGTERM);
    int st = 0;
    waitpid(p, &st, 0);
  }
  if (!mpi) unlink_job_segments(job);
  // Each member removed its own data; the folder they shared goes too.
  std::error_code ec;
  fs::remove(etcd_data, ec);
  if (!o.quiet && code == 0) std::printf("keel-launch: done; report %s\n", report.c_str());
  if (code != 0 && fs::exists(report, ec))
    std::fprintf(stderr, "keel-launch: the job was stopped (exit %d); report %s\n", code,
                 report.c_str());
  return code;
}

}  // namespace

int run_launch(const LaunchOptions& opts) {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  // SIGHUP too: a closed terminal stops the job like Ctrl-C, with its report, not silently.
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) KEEL_CHECK_ERRNO(sigaction(sig, &sa, nullptr));
  // ps and top tell the processes apart: "keel-launch" runs slot 0 (the controller),
  // "keel-agent" any other slot.
  set_process_name(opts.join.empty() ? "keel-launch" : "keel-agent");
  LaunchOptions o = opts;
  if (!o.resume.empty() && o.join.empty()) resolve_resume(&o);
  if (o.config_path.empty())
    throw InputError("--config FILE is required with --join; run with --help for usage");
  config::JobConfig cfg = load_config(o.config_path, o.overrides);
  if (!o.join.empty()) {
    const std::string host = reachable_address(endpoint_host(o.join));
    return run_agent(o, cfg, o.slot, o.join, o.job, host);
  }
  if (o.local > 0) return run_slot0(o, cfg, o.local, /*mpi=*/false, /*fork_slots=*/true);
  if (o.slots > 0) return run_slot0(o, cfg, o.slots, /*mpi=*/false, /*fork_slots=*/false);
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE")) {
    int argc = 0;
    char** argv = nullptr;
    MPI_Init(&argc, &argv);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank == 0) return run_slot0(o, cfg, size, /*mpi=*/true, /*fork_slots=*/false);
    set_process_name("keel-agent");
    std::string buf(kBootstrapBytes, '\0');
    MPI_Bcast(buf.data(), int(buf.size()), MPI_CHAR, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    const uint32_t n = load_le32(buf.data());
    control::Bootstrap b;
    KEEL_CHECK(n + 4 <= kBootstrapBytes && b.ParseFromArray(buf.data() + 4, int(n)),
               "slot 0's bootstrap message does not parse");
    return run_agent(o, cfg, rank, b.controller(), b.job(),
                     reachable_address(endpoint_host(b.controller())));
  }
  throw InputError(
      "say where the slots are: --local N (this machine), under mpirun (one slot "
      "per MPI rank), --slots N (slot 0 here, the others by hand), or --join ENDPOINT --slot K "
      "--job ID");
}

}  // namespace keel
