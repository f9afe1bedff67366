#include "launcher/launch_options.h"

#include <cstdlib>
#include <iostream>

#include "runtime/check.h"

namespace keel {

std::string launch_usage() {
  return R"(usage: keel-launch --config FILE [--local N] [options]
  --config FILE           job config (text protobuf, see proto/config.proto)
  --set PATH=VALUE        override a config field (repeatable)
  --local N               run N slots (machines) on this machine; without it, under mpirun,
                          each MPI rank is a slot
  --slots N               this process is slot 0 of N (controller and agent) on this
                          machine; slots 1..N-1 are started by hand on their machines with
                          --join (endpoint and job id appear in runs/<job>/controller)
  --workers-per-slot W    ranks per slot (default: one per GPU, or 1 on CPU); ranks fill
                          slots in Megatron order, so a TP group stays inside a slot
                          where it fits
  --standby K             the last K slots are warm standbys: their workers load the model,
                          check themselves and wait to replace a lost or evicted slot
  --run-dir DIR           where runs/<job>/ goes (default: runs): logs, events.jsonl, config
  --resume DIR            restart a job from its newest complete persistent checkpoint: DIR
                          is a checkpoint directory (checkpoint.dir) or the run directory
                          runs/<job>/ of the job (its config.pbtxt names the checkpoint
                          directory, and is the config unless --config is given)
  --report FILE           the final report (JSON; default: runs/<job>/report.json)
  --loss-svg FILE         the loss curve, incidents marked
  --fault KIND@step=S,rank=R   inject a fault (repeatable; also slot_loss, partition)
  --inject FILE           a fault schedule (text protobuf, proto/faults.proto)
  --join ENDPOINT --slot K --job ID
                          start slot K's launcher by hand and join a running job (to bring
                          back a lost machine); ENDPOINT and ID are in runs/<job>/controller
  --quiet                 no per-step lines
)";
}

bool parse_launch_options(int argc, char** argv, LaunchOptions* o) {
  auto number = [](const std::string& flag, const std::string& v, int min) {
    char* end = nullptr;
    long x = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || x < min || x > 4096)
      throw InputError(
          detail::concat(flag, " = '", v, "': expected an integer in [", min, ", 4096]"));
    return int(x);
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw InputError(a + " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::cout << launch_usage();
      return false;
    } else if (a == "--config") {
      o->config_path = value();
    } else if (a == "--set") {
      o->overrides.push_back(value());
    } else if (a == "--local") {
      o->local = number(a, value(), 1);
    } else if (a == "--slots") {
      o->slots = number(a, value(), 1);
    } else if (a == "--standby") {
      o->standby = number(a, value(), 0);
    } else if (a == "--workers-per-slot") {
      o->workers_per_slot = number(a, value(), 1);
    } else if (a == "--run-dir") {
      o->run_dir = value();
    } else if (a == "--join") {
      o->join = value();
    } else if (a == "--slot") {
      o->slot = number(a, value(), 0);
    } else if (a == "--job") {
      o->job = value();
    } else if (a == "--report" || a == "--loss-svg" || a == "--fault" || a == "--inject" ||
               a == "--export-llmc") {
      o->worker_args.push_back(a);
      o->worker_args.push_back(value());
    } else if (a == "--resume") {
      o->resume = value();
    } else if (a == "--quiet") {
      o->quiet = true;
    } else {
      throw InputError("unknown argument '" + a + "'\n" + launch_usage());
    }
  }
  if (o->config_path.empty() && o->resume.empty())
    throw InputError("--config FILE is required (or --resume runs/<job>)\n" + launch_usage());
  if (o->slots > 0 && (o->local > 0 || !o->join.empty()))
    throw InputError("--slots N cannot be combined with --local or --join");
  if (!o->join.empty() && (o->slot < 0 || o->job.empty()))
    throw InputError("--join needs --slot K and --job ID");
  return true;
}

}  // namespace keel
