#include "launcher/worker_options.h"

#include <cstdlib>
#include <iostream>

#include "runtime/check.h"

namespace keel {
namespace {

int parse_int(const std::string& flag, const std::string& v, int min) {
  char* end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x < min || x > 1 << 20)
    throw InputError(
        detail::concat("keel-worker: ", flag, " = '", v, "': expected an integer >= ", min));
  return int(x);
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

}  // namespace

std::string worker_usage() {
  return R"(usage: keel-worker --config FILE [options]
  --config FILE         job config (text protobuf, see proto/config.proto)
  --set PATH=VALUE      override a config field, e.g. --set train.steps=20 (repeatable)
  --report FILE         write a JSON report (rank 0)
  --export-llmc FILE    write the trained weights as an llm.c checkpoint (rank 0)
  --loss-svg FILE       draw the loss curve as an SVG (rank 0)
  --nproc N             start N local ranks (N = tp·pp·dp) with a store, and supervise them
  --rank R --world N --store HOST:PORT
                        run as one rank of N that meet through a TCP store
                        (or KEEL_RANK, KEEL_WORLD_SIZE, KEEL_STORE_ADDR)
  --fault KIND@step=S,rank=R[,code=C][,message=TEXT][,delay_ms=D]
                        inject a fault (crash, exit, hang, slow, nan, corrupt_snapshot,
                        lose_snapshot, slot_loss, partition, freeze, hang_in_collective,
                        spin); repeatable
  --inject FILE         inject the faults of a schedule (text protobuf, proto/faults.proto)
  --resume DIR          continue from the newest complete persistent checkpoint in DIR
  --quiet               no per-step progress lines
)";
}

bool parse_worker_options(int argc, char** argv, WorkerOptions* o) {
  if (const char* v = env("KEEL_RANK")) o->rank = parse_int("KEEL_RANK", v, 0);
  if (const char* v = env("KEEL_WORLD_SIZE")) o->world_size = parse_int("KEEL_WORLD_SIZE", v, 1);
  if (const char* v = env("KEEL_STORE_ADDR")) o->store_addr = v;
  if (const char* v = env("KEEL_LOCAL_WORLD_SIZE"))
    o->local_world_size = parse_int("KEEL_LOCAL_WORLD_SIZE", v, 1);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw InputError("keel-worker: " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::cout << worker_usage();
      return false;
    } else if (a == "--config") {
      o->config_path = value();
    } else if (a == "--set") {
      o->overrides.push_back(value());
    } else if (a == "--report") {
      o->report_path = value();
    } else if (a == "--export-llmc") {
      o->export_llmc_path = value();
    } else if (a == "--loss-svg") {
      o->loss_svg_path = value();
    } else if (a == "--nproc") {
      o->nproc = parse_int(a, value(), 1);
    } else if (a == "--rank") {
      o->rank = parse_int(a, value(), 0);
    } else if (a == "--world") {
      o->world_size = parse_int(a, value(), 1);
    } else if (a == "--store") {
      o->store_addr = value();
    } else if (a == "--fault") {
      o->faults.push_back(value());
    } else if (a == "--inject") {
      o->inject_path = value();
    } else if (a == "--resume") {
      o->resume_dir = value();
    } else if (a == "--quiet") {
      o->quiet = true;
    } else {
      throw InputError("keel-worker: unknown argument '" + a + "'\n" + worker_usage());
    }
  }
  if (o->config_path.empty())
    throw InputError("keel-worker: --config FILE is required\n" + worker_usage());
  if (o->rank >= o->world_size)
    throw InputError(
        detail::concat("keel-worker: rank ", o->rank, " is not below world size ", o->world_size));
  if (o->world_size > 1 && o->store_addr.empty() && o->nproc == 0)
    throw InputError("keel-worker: world size > 1 needs --store HOST:PORT (or KEEL_STORE_ADDR)");
  return true;
}

}  // namespace keel
