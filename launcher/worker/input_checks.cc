#include "launcher/worker/input_checks.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "ckpt/persistent_checkpoint.h"
#include "model/memory_estimate.h"
#include "proto/config_loader.h"
#include "runtime/check.h"

namespace keel {
namespace {

namespace fs = std::filesystem;

// More local ranks than this is a typo, whatever the machine: each is a process with its own
// threads and sockets, and a TCP store serving 4096 clients is already far past any node.
constexpr int kMaxLocalRanks = 4096;

// Whether `dir` takes a new file, found by making one: access(2) says yes to root on a
// read-only file system and knows nothing of quotas or ACLs. "" or the reason.
std::string cannot_write_into(const std::string& dir) {
  std::string probe = detail::concat(dir, "/.keel-write-check.", ::getpid());
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return std::strerror(errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return "";
}

// An output file (`flag` value `path`) that is written at the end of the run: its directory
// must exist and take files, and the path must not be a directory. Checked before the first
// step so that a typo costs seconds, not the trained weights.
void check_output_file(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  auto fail = [&](const std::string& why) {
    throw InputError(detail::concat(flag, " ", path, ": ", why));
  };
  std::error_code ec;
  if (fs::is_directory(path, ec)) fail("is a directory, expected a file to write");
  const fs::path parent = fs::path(path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  if (!fs::exists(dir, ec)) fail("directory " + dir + " does not exist");
  if (!fs::is_directory(dir, ec)) fail(dir + " is not a directory");
  if (std::string why = cannot_write_into(dir); !why.empty())
    fail("cannot write into directory " + dir + ": " + why);
}

// checkpoint.dir: the persistent checkpointer creates it (and missing parents), so it need
// not exist; the nearest part of it that does must be a directory that takes files.
void check_checkpoint_dir(const std::string& config_path, const config::JobConfig& cfg) {
  const auto& c = cfg.checkpoint();
  if (c.persistent_every_steps() <= 0 || c.dir().empty()) return;
  auto fail = [&](const std::string& why) {
    throw InputError(detail::concat(config_path, ": checkpoint.dir = \"", c.dir(), "\": ", why));
  };
  std::error_code ec;
  fs::path p = fs::absolute(c.dir(), ec);
  if (ec) fail("cannot resolve: " + ec.message());
  fs::path existing = p;
  while (!fs::exists(existing, ec) && existing.has_relative_path())
    existing = existing.parent_path();
  if (!fs::is_directory(existing, ec)) {
    fail(existing == p ? std::string("is not a directory")
                       : existing.string() + " is not a directory, so it cannot be created");
  }
  if (std::string why = cannot_write_into(existing.string()); !why.empty())
    fail("cannot write into directory " + existing.string() + ": " + why);
}

// Host memory for `num_ranks` ranks of the job starting at `first_rank`, all on this machine.
void check_memory(const config::JobConfig& cfg, int first_rank, int num_ranks) {
  check_memory_fits(cfg, first_rank, num_ranks, available_host_memory());
}

}  // namespace

void check_launch(const WorkerOptions& o) {
  if (o.nproc > kMaxLocalRanks) {
    throw InputError(
        detail::concat("--nproc ", o.nproc, ": at most ", kMaxLocalRanks, " local ranks"));
  }
  // The config is read here, once, so that a bad one is reported once instead of by every
  // rank, and so that N can be compared with the layout before anything is started.
  config::JobConfig cfg = load_config(o.config_path, o.overrides);
  const auto& p = cfg.parallel();
  const int64_t world = int64_t(p.tp()) * p.pp() * p.dp();
  if (world != o.nproc) {
    throw InputError(detail::concat(o.config_path, ": parallel.tp·pp·dp = ", p.tp(), "·", p.pp(),
                                    "·", p.dp(), " = ", world, " but --nproc ", o.nproc,
                                    "; start it with --nproc ", world,
                                    " or change parallel.tp, parallel.pp or parallel.dp"));
  }
  check_output_file("--report", o.report_path);
  check_output_file("--loss-svg", o.loss_svg_path);
  check_output_file("--export-llmc", o.export_llmc_path);
  check_checkpoint_dir(o.config_path, cfg);
  if (!o.resume_dir.empty()) {
    // The checkpoint each rank will load, and whether anything is left to train: said once
    // here rather than by every rank (the plugin is compared by each rank, which loads it).
    CheckpointLayout layout;
    layout.tp = p.tp();
    layout.pp = p.pp();
    layout.dp = p.dp();
    layout.zero1 = p.zero1();
    layout.model = describe_model(cfg);
    check_resume(find_resume_point(o.resume_dir, layout), cfg);
  }
  // Every rank of --nproc runs on this machine.
  check_memory(cfg, 0, o.nproc);
}

void check_job_inputs(const WorkerOptions& o, const config::JobConfig& cfg) {
  // Rank 0 writes the report, the loss curve and the weights; every rank may write
  // checkpoints.
  if (o.rank == 0) {
    check_output_file("--report", o.report_path);
    check_output_file("--loss-svg", o.loss_svg_path);
    check_output_file("--export-llmc", o.export_llmc_path);
  }
  check_checkpoint_dir(o.config_path, cfg);
  // The ranks sharing this machine (KEEL_LOCAL_WORLD_SIZE) are taken to be consecutive, as
  // --nproc and the launcher place them; each rank checks the whole group, so the check holds
  // whichever rank gets there first, before any of them allocates.
  const int local = std::max(1, std::min(o.local_world_size, o.world_size));
  const int first = o.rank / local * local;
  check_memory(cfg, first, std::min(local, o.world_size - first));
}

}  // namespace keel
