#include "launcher/controller/supervisor.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <random>

#include "ckpt/checkpoint_dir_lock.h"
#include "ckpt/persistent_checkpoint.h"
#include "launcher/control_plane.h"
#include "launcher/controller/controller.h"
#include "launcher/controller/local_host.h"
#include "launcher/job_env.h"
#include "launcher/recovery_protocol.h"
#include "parallel/tcp_store.h"
#include "proto/config_loader.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {
namespace {

volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) {
  g_signal = sig;
}

}  // namespace

int run_supervisor(const WorkerOptions& o, const std::vector<std::string>& argv) {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  // SIGHUP too: a closed terminal stops the job like Ctrl-C, with its report and without
  // leaving the job's shared memory behind.
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) KEEL_CHECK_ERRNO(sigaction(sig, &sa, nullptr));
  remove_stale_segments();

  ControllerOptions co;
  co.cfg = load_config(o.config_path, o.overrides);
  // Local ranks have no standby slots: a policy that needs them is said, not silently ignored.
  if (co.cfg.recovery().on_no_standby() != config::RecoveryConfig::fail)
    LOG(WARNING) << o.config_path << ": recovery.on_no_standby = "
                 << config::RecoveryConfig::OnNoStandby_Name(co.cfg.recovery().on_no_standby())
                 << " has no effect under --nproc (no standby slots: a failed rank restarts in "
                    "place); keel-launch --standby K gives a job standbys";
  co.job = make_job_id();
  std::optional<ResumePoint> resumed;
  if (!o.resume_dir.empty()) {
    CheckpointLayout layout;
    layout.tp = co.cfg.parallel().tp();
    layout.pp = co.cfg.parallel().pp();
    layout.dp = co.cfg.parallel().dp();
    layout.zero1 = co.cfg.parallel().zero1();
    try {
      resumed = find_resume_point(o.resume_dir, layout);
    } catch (const InputError&) {
      // The ranks say what is wrong with it, each loading it.
    }
  }
  co.lineage = checkpoint_lineage(co.job, resumed ? &*resumed : nullptr);
  std::optional<CheckpointDirLock> ckpt_lock;
  if (co.cfg.checkpoint().persistent_every_steps() > 0)
    ckpt_lock.emplace(co.cfg.checkpoint().dir(), co.job, co.lineage);
  co.job_start = recovery::unix_now();
  co.stop_signal = &g_signal;
  co.report_path = o.report_path;
  TcpStoreServer store_server("127.0.0.1", 0);
  co.store_addr = "127.0.0.1:" + std::to_string(store_server.port());
  // The ranks report their progress here, which is how a hang is found without waiting
  // for the communicator timeout.
  ControlServer control("127.0.0.1", 0);
  co.controller_endpoint = control.endpoint();
  auto store = std::make_shared<TcpStore>("127.0.0.1", store_server.port());
  LocalHost host(argv, o.nproc, co.job);
  Controller controller(co, &host, store, &control);
  const int code = controller.run();
  host.stop_all(SIGKILL, std::chrono::milliseconds(0));
  host.finish();
  return code;
}

}  // namespace keel
