#include "launcher/launch.h"

#include <fcntl.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <sodium.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "ckpt/checkpoint_dir_lock.h"
#include "ckpt/persistent_checkpoint.h"
#include "ckpt/snapshot_region.h"
#include "launcher/agent/agent.h"
#include "launcher/await_job_end.h"
#include "launcher/control_plane.h"
#include "launcher/controller/etcd_control_state.h"
#include "launcher/controller_wait.h"
#include "launcher/etcd/etcd_client.h"
#include "launcher/fault_checks.h"
#include "launcher/job_env.h"
#include "launcher/lead.h"
#include "launcher/processes.h"
#include "launcher/recovery_protocol.h"
#include "launcher/timings.h"
#include "parallel/job_key.h"
#include "parallel/net_address.h"
#include "parallel/sealed_channel.h"
#include "parallel/topology.h"
#include "proto/config_loader.h"
#include "proto/control_state.pb.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "robust/fault_spec.h"
#include "runtime/backend.h"
#include "runtime/check.h"
#include "runtime/logging.h"
#include "runtime/text.h"

namespace keel {
namespace {

namespace fs = std::filesystem;

volatile sig_atomic_t g_signal = 0;
// The job's first controller, once forked: a signal is passed on to it at once, also while
// this process still waits for it to say where it listens or that etcd is up (a start that
// waits on an unreachable --etcd must answer SIGTERM).
volatile sig_atomic_t g_controller = 0;
void on_signal(int sig) {
  g_signal = sig;
  if (g_controller > 0) ::kill(pid_t(g_controller), sig);
}

std::string self_dir() {
  return fs::path(self_exe_path()).parent_path().string();
}

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

// The whole buffer through a pipe, across short reads and writes and signals; false at EOF
// or on an error.
bool write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= size_t(w);
  }
  return true;
}
bool read_all(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= size_t(r);
  }
  return true;
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

// The failure domain Slurm's topology gives this machine: the leaf switch of
// SLURM_TOPOLOGY_ADDR ("s0.s2.node7" -> "s0.s2"; set by srun under a topology plugin), or ""
// when Slurm gives none (or only the node itself).
std::string slurm_failure_domain() {
  const char* addr = std::getenv("SLURM_TOPOLOGY_ADDR");
  if (!addr) return "";
  const std::string a = addr;
  const size_t dot = a.rfind('.');
  return dot == std::string::npos ? "" : a.substr(0, dot);
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
  a.failure_domain = o.failure_domain.empty() ? slurm_failure_domain() : o.failure_domain;
  fs::create_directories(a.log_dir);
  Agent agent(a);
  return agent.run(reinterpret_cast<const volatile int*>(&g_signal));
}

// The job as etcd records it and every controller reads it (proto/control_state.proto).
state::JobSpec job_spec(const LaunchOptions& o, const config::JobConfig& cfg, int nslots, int W,
                        const FaultPlan& plan, const std::string& job, const std::string& lineage,
                        double job_start, const fs::path& dir, const std::string& report,
                        const std::vector<std::string>& worker_argv) {
  state::JobSpec s;
  s.set_job(job);
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
  s.set_lineage(lineage);
  s.set_job_start(job_start);
  s.set_run_dir(dir.string());
  s.set_report_path(report);
  for (const auto& a : worker_argv) s.add_worker_argv(a);
  // What a parked standby worker knows before it has a rank (launcher/worker/standby.h); the
  // store, the etcd and the controller's endpoint are added by the controller that starts it.
  char start[32];
  std::snprintf(start, sizeof(start), "%.6f", job_start);
  auto& env = *s.mutable_standby_env();
  env["KEEL_WORLD_SIZE"] = std::to_string(s.world());
  env[env::kJobId] = job;
  env[env::kSupervised] = "1";
  env[env::kJobStart] = start;
  env[env::kLineage] = lineage;
  env["OMP_WAIT_POLICY"] = "PASSIVE";
  s.set_console_progress(!o.quiet);
  return s;
}

// keel-launch's controller process tells keel-launch its endpoint, then where the job's etcd
// runs, over a pipe: a length (4 bytes, little-endian) and a control::Bootstrap.
// The one framing of a Bootstrap, for the pipe and for MPI's broadcast alike.
std::string framed(const control::Bootstrap& b) {
  std::string buf = b.SerializeAsString();
  KEEL_CHECK(buf.size() + 4 <= kBootstrapBytes, "the bootstrap message is too long");
  buf.insert(0, std::string(4, '\0'));
  store_le32(buf.data(), uint32_t(buf.size() - 4));
  return buf;
}

void write_bootstrap(int fd, const control::Bootstrap& b) {
  const std::string buf = framed(b);
  KEEL_CHECK(write_all(fd, buf.data(), buf.size()), "the bootstrap pipe to keel-launch");
}

// nullopt when the controller's process closed the pipe (it ended) before saying it.
std::optional<control::Bootstrap> read_bootstrap(int fd) {
  char len[4];
  if (!read_all(fd, len, 4)) return std::nullopt;
  std::string buf(load_le32(len), '\0');
  control::Bootstrap b;
  if (buf.size() > kBootstrapBytes || !read_all(fd, buf.data(), buf.size()) ||
      !b.ParseFromString(buf))
    return std::nullopt;
  return b;
}

// Under mpirun the controller runs in MPI rank 0's process beside slot 0's agent (a fork after
// MPI_Init is not safe): the job has no controller to fail over to.
int lead_under_mpi(FirstLead f, const LaunchOptions& o, const config::JobConfig& cfg,
                   const std::string& job, const std::string& host) {
  std::thread agent0;
  f.slot0_pid = int(getpid());
  f.on_endpoint = [&](const std::string& endpoint) {
    control::Bootstrap b;
    b.set_controller(endpoint);
    b.set_job(job);
    // MPI's own channel, at start-up only: how the other slots learn the job's key.
    const JobKey::Bytes& key = process_job_key().bytes();
    b.set_job_key(std::string(key.begin(), key.end()));
    std::string buf = framed(b);
    buf.resize(kBootstrapBytes);
    MPI_Bcast(buf.data(), int(buf.size()), MPI_CHAR, 0, MPI_COMM_WORLD);
    MPI_Finalize();  // MPI is for starting only: it cannot survive a dead peer
    agent0 = std::thread([&o, &cfg, endpoint, job, host] {
      pthread_setname_np(pthread_self(), "keel-agent");  // for top -H; the name always fits
      run_agent(o, cfg, 0, endpoint, job, host);
    });
  };
  const int code = lead_first(f);
  g_signal = g_signal ? g_signal : SIGTERM;  // slot 0's agent took the shutdown, or stops now
  if (agent0.joinable()) agent0.join();
  return code;
}

// Waits for the job's controller process; a stop signal that keel-launch alone got (kill
// PID) is passed on to it once.
// keel-launch (not mpirun): the job's first controller runs in a child process, so that it
// can die alone while the slots train on and a candidate takes over. This process starts the
// slots once the controller says where it listens, and waits for the job's end: the
// controller's exit status, or, if it died, the end a later leader writes to etcd.
int supervise(FirstLead f, const LaunchOptions& o, const config::JobConfig& cfg, int nslots,
              bool fork_slots, const std::string& job, const std::string& host) {
  int fds[2];
  KEEL_CHECK_ERRNO(pipe2(fds, O_CLOEXEC));
  std::fflush(nullptr);
  prepare_sealing();  // the controller must not set OpenSSL up after fork (sealed_channel.h)
  const pid_t parent = getpid();
  const pid_t controller = fork();
  KEEL_CHECK_ERRNO(controller);
  if (controller == 0) {
    close(fds[0]);
    // It goes with keel-launch (slot 0's machine): a controller cut loose would lead alone.
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(1);
    set_process_name("keel-controller");
    if (!fork_slots) f.slot0_pid = int(parent);  // --slots: slot 0's agent is keel-launch
    f.on_endpoint = [fd = fds[1], &job](const std::string& endpoint) {
      control::Bootstrap b;
      b.set_controller(endpoint);
      b.set_job(job);
      write_bootstrap(fd, b);
    };
    f.on_etcd = [fd = fds[1]](const std::vector<std::string>& etcd) {
      control::Bootstrap b;
      b.set_etcd_known(true);
      for (const auto& e : etcd) b.add_etcd_endpoints(e);
      write_bootstrap(fd, b);
    };
    int code = 1;
    try {
      code = lead_first(f);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "keel-launch: error: %s\n", e.what());
    }
    std::fflush(nullptr);
    _exit(code);  // not return: this process's copies of keel-launch's objects are not its own
  }
  close(fds[1]);
  g_controller = controller;
  std::vector<pid_t> slots;
  std::thread agent0;
  std::atomic<int> agent0_code{-1};  // slot 0's agent's exit status once it ended
  std::vector<std::string> etcd;
  if (const auto b = read_bootstrap(fds[0])) {
    if (fork_slots) {
      for (int k = 0; k < nslots; ++k) {
        // The real path, not /proc/self/exe: ps shows what each process is.
        std::vector<std::string> argv = {
            self_exe_path(), "--join", b->controller(), "--slot",      std::to_string(k),
            "--job",         job,      "--config",      o.config_path, "--run-dir",
            o.run_dir};
        for (const auto& s : o.overrides) argv.insert(argv.end(), {"--set", s});
        if (o.workers_per_slot > 0)
          argv.insert(argv.end(), {"--workers-per-slot", std::to_string(o.workers_per_slot)});
        // One label for every slot, or slot k's own.
        const std::vector<std::string> domains = split(o.failure_domain, ',', true);
        if (!domains.empty())
          argv.insert(argv.end(),
                      {"--failure-domain", domains.size() == 1 ? domains[0] : domains[size_t(k)]});
        // SIGTERM, not SIGKILL, when keel-launch dies: the slot's agent then stops its workers
        // and removes the job's shared memory before it goes (launcher/agent/agent.h).
        slots.push_back(spawn_child(argv, {}, "", SIGTERM));
      }
    } else {
      agent0 = std::thread([&o, &cfg, &agent0_code, endpoint = b->controller(), &job, &host] {
        pthread_setname_np(pthread_self(), "keel-agent");
        agent0_code = run_agent(o, cfg, 0, endpoint, job, host);
      });
    }
    if (const auto e = read_bootstrap(fds[0]))
      etcd.assign(e->etcd_endpoints().begin(), e->etcd_endpoints().end());
  }
  close(fds[0]);
  std::optional<int> ended_without_it;
  const int st = wait_controller(controller, slots, agent0_code, agent0.joinable(), &g_signal,
                                 &ended_without_it);
  g_controller = 0;  // reaped: its pid may be another process's from now on
  int code = 1;
  const bool died = !WIFEXITED(st) || WEXITSTATUS(st) == kExitDeposed;
  if (ended_without_it) {
    code = *ended_without_it;
  } else if (!died) {
    code = WEXITSTATUS(st);
  } else if (!etcd.empty()) {
    code = await_job_end({.job = job,
                          .etcd = etcd,
                          .signal = WIFEXITED(st) ? 0 : WTERMSIG(st),
                          .slots = &slots,
                          .agent0_code = &agent0_code,
                          .agent0_here = agent0.joinable(),
                          .echo_steps = o.quiet ? 0 : cfg.train().steps(),
                          .stop = &g_signal});
  } else {
    code = WIFEXITED(st) ? 1 : 128 + WTERMSIG(st);
    LOG(ERROR) << "the job's controller (pid " << controller << ") died of signal " << WTERMSIG(st)
               << ", and a job without etcd has no other to take over";
  }
  // The slots' agents took the shutdown and end by themselves; one that has not within the
  // grace is told again by signal.
  const auto grace_end = std::chrono::steady_clock::now() + kShutdownGrace;
  while (!slots.empty() && std::chrono::steady_clock::now() < grace_end) {
    std::erase_if(slots, [](pid_t p) {
      int s = 0;
      return waitpid(p, &s, WNOHANG) == p;
    });
    if (!slots.empty()) std::this_thread::sleep_for(kReapPoll);
  }
  g_signal = g_signal ? g_signal : SIGTERM;
  if (agent0.joinable()) agent0.join();
  for (pid_t p : slots) {
    ::kill(p, SIGTERM);
    int s = 0;
    waitpid(p, &s, 0);
  }
  return code;
}

// Slot 0 of `nslots`: the job's first controller (in a process of its own, so that it can die
// alone and be replaced) and slot 0's agent. Under mpirun the other slots learn the
// controller's address from MPI; with `fork_slots` (--local) this process starts every slot
// on this machine; otherwise (--slots) they are started by hand with --join.
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
  const bool failover = !mpi && (nslots >= 3 || !o.etcd.empty());
  // A setting that cannot apply is said, not silently ignored.
  if (o.etcd_members != 0 && (nslots < 3 || !o.etcd.empty()))
    LOG(WARNING) << "--etcd-members " << o.etcd_members << " has no effect: "
                 << (o.etcd.empty() ? "a job of 1-2 slots starts no etcd members"
                                    : "the job uses the cluster given with --etcd");
  check_faults(plan,
               FaultJob{.world = world,
                        .steps = cfg.train().steps(),
                        .slot_of = [W](int rank) { return rank / W; },
                        .own_interfaces = !JobEnv::get().ifname.empty(),
                        .slot0_losable = fork_slots || failover,
                        .failover = failover},
               0, /*running=*/false);
  // The job's detect.* settings against the control plane's own timings (launcher/timings.h):
  // a slot timeout shorter than the heartbeats, or agents that give up on a dead leader before
  // its successor's lease could lapse, would turn every failover into a lost job.
  if (const std::vector<std::string> bad = timings::check_timings(cfg.detect(), failover);
      !bad.empty()) {
    std::string why;
    for (const std::string& b : bad) why += (why.empty() ? "" : "; ") + b;
    throw InputError(o.config_path + ": the job's timings do not fit keel's control plane: " + why);
  }
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
    // Past train.steps: refused here, before a run directory is made or a slot starts.
    if (const std::string w = check_resume(*resumed, cfg); !w.empty()) LOG(WARNING) << w;
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
  // The job's key: every connection of the job proves it (parallel/job_key.h). Whoever can
  // read the run directory can command the job (keel-ctl reads it there), and no one else;
  // joined slots are given it with --secret-file. Made before any process of the job starts:
  // they inherit it (spawn_child) or get it from MPI's bootstrap.
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace);
  set_process_job_key(JobKey::generate());
  try {
    process_job_key().save((dir / kSecretFile).string());
  } catch (const Error& e) {
    // A full disk costs keel-ctl and --join their way in, not the job: its processes inherit
    // the key from this one.
    LOG(WARNING) << e.what() << "; the job runs, but keel-ctl cannot command it";
  }

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

  FirstLead f;
  f.o = o;
  f.cfg = cfg;
  f.spec = job_spec(o, cfg, nslots, W, plan, job, lineage, recovery::unix_now(), dir, report,
                    worker_argv);
  f.host = host;
  f.fork_slots = fork_slots;
  f.stop = &g_signal;
  const int code = mpi ? lead_under_mpi(f, o, cfg, job, host)
                       : supervise(f, o, cfg, nslots, fork_slots, job, host);
  if (!mpi) unlink_job_segments(job);
  // Each member removed its own data, but not one that died with its slot: the job's members'
  // folder goes whole.
  const bool shm = o.etcd_data == "shm" || (o.etcd_data.empty() && fork_slots);
  std::error_code ec;
  fs::remove_all(shm ? fs::path(etcd_shm_dir(job)) : dir / "etcd", ec);
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
  // The job key a parent handed over (an agent's candidate; KEEL_JOB_SECRET for --join).
  const std::string key_from = adopt_inherited_job_key();
  if (opts.candidate) return lead_as_candidate(opts, &g_signal);
  LaunchOptions o = opts;
  if (!o.resume.empty() && o.join.empty()) resolve_resume(&o);
  if (o.config_path.empty())
    throw InputError("--config FILE is required with --join; run with --help for usage");
  config::JobConfig cfg = load_config(o.config_path, o.overrides);
  if (!o.join.empty()) {
    // The job's key: --secret-file, else KEEL_JOB_SECRET, else the job's run directory here
    // (a run directory on a shared file system, or a slot on slot 0's machine).
    const std::string in_run_dir = (fs::path(o.run_dir) / o.job / kSecretFile).string();
    if (!o.secret_file.empty()) {
      set_process_job_key(JobKey::load(o.secret_file));
    } else if (key_from.empty()) {
      std::error_code ec;
      if (!fs::exists(in_run_dir, ec))
        throw InputError(detail::concat(
            "--join needs the job's secret: --secret-file FILE (a copy of runs/<job>/secret "
            "from slot 0's machine, mode 0600) or KEEL_JOB_SECRET in the environment (",
            in_run_dir, " does not exist)"));
      set_process_job_key(JobKey::load(in_run_dir));
    }
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
    set_process_job_key(JobKey::from_bytes(b.job_key(), "slot 0's bootstrap message"));
    sodium_memzero(buf.data(), buf.size());
    return run_agent(o, cfg, rank, b.controller(), b.job(),
                     reachable_address(endpoint_host(b.controller())));
  }
  throw InputError(
      "say where the slots are: --local N (this machine), under mpirun (one slot "
      "per MPI rank), --slots N (slot 0 here, the others by hand), or --join ENDPOINT --slot K "
      "--job ID");
}

}  // namespace keel
