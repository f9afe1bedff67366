// keel-worker: trains one rank, or with --nproc supervises N local ranks through their
// failures (launcher/controller/supervisor.h). Rank 0 prints a line per step and writes the report,
// the loss curve and llm.c weights on request.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "launcher/controller/supervisor.h"
#include "launcher/job_env.h"
#include "launcher/processes.h"
#include "launcher/recovery_protocol.h"
#include "launcher/worker/diagnose_worker.h"
#include "launcher/worker/input_checks.h"
#include "launcher/worker/recovery_client.h"
#include "launcher/worker/replay_worker.h"
#include "launcher/worker/worker.h"
#include "launcher/worker_options.h"
#include "parallel/comm_error.h"
#include "parallel/job_key.h"
#include "parallel/sealed_channel.h"
#include "proto/config_loader.h"
#include "runtime/cpu/blas_core.h"
#include "runtime/logging.h"

int main(int argc, char** argv) {
  keel::init_logging(argv[0]);
  keel::WorkerOptions o;
  try {
    if (auto rc = keel::parse_worker_options(argc, argv, &o)) return *rc;
    // First, while no thread of keel's runs: OpenBLAS chose its kernels when it loaded, and
    // if they are not the best for this CPU (or not runtime.blas_core's), this executes the
    // binary again with OPENBLAS_CORETYPE set and does not return.
    const keel::config::JobConfig boot = o.config_path.empty()
                                             ? keel::config::JobConfig()
                                             : keel::load_config(o.config_path, o.overrides);
    keel::select_blas_core(boot.runtime().blas_core(), argv);
    // After that re-execution (the key's pipe and variable survive it), before any thread or
    // connection: the job key its launcher handed over, if any (parallel/job_key.h), and
    // which connections are sealed (parallel/sealed_channel.h).
    keel::adopt_inherited_job_key();
    keel::set_seal_policy(keel::seal_policy_of(boot.security()));
    // Before any thread starts, so that every thread of the process carries the name.
    const keel::JobEnv& env = keel::JobEnv::get();
    const bool replay = !env.replay_key.empty();
    const bool diagnose = !env.diagnose_key.empty();
    keel::set_process_name(replay        ? "keel-replay"
                           : diagnose    ? "keel-diagnose"
                           : o.nproc > 0 ? "keel-supervisor"
                                         : "keel-worker");
    // A stop-time SDC replay (launcher/worker/replay_worker.h): one step, one digest, no
    // supervisor.
    if (replay) return keel::run_replay_worker(o);
    // Stop-time diagnostics (launcher/worker/diagnose_worker.h): checks, one answer, no supervisor.
    if (diagnose) return keel::run_diagnose_worker(o);
    if (o.nproc > 0) {
      keel::check_launch(o);
      std::vector<std::string> args;
      for (int i = 0; i < argc; ++i) {
        std::string a = argv[i];
        // Both spellings CLI11 takes: "--nproc N" and "--nproc=N".
        if (a == "--nproc") {
          ++i;
          continue;
        }
        if (a.rfind("--nproc=", 0) == 0) continue;
        args.push_back(a);
      }
      return keel::run_supervisor(o, args);
    }
    // A rank started alone is a job of its own, so it does what a supervisor does first:
    // removes the shared memory of ended jobs (a lone rank killed by SIGKILL leaves its own).
    if (env.job.empty()) keel::remove_stale_segments();
    return keel::run_worker(o);
  } catch (const keel::InputError& e) {
    std::fprintf(stderr, "keel-worker: error: %s\n", e.what());
    return keel::recovery::kExitInputError;
  } catch (const keel::RankSuperseded& e) {
    // Nothing of it is the job's any more; its slot's agent is told the same.
    LOG(WARNING) << e.what() << ": this process ends";
    return keel::recovery::kExitStopped;
  } catch (const keel::CommError& e) {
    std::fprintf(stderr, "keel-worker: rank %d: communication failed: %s\n", o.rank, e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "keel-worker: rank %d: %s\n", o.rank, e.what());
    return 1;
  }
}
