#include "launcher/job_env.h"

#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "runtime/check.h"
#include "runtime/text.h"

namespace keel {
namespace {

std::optional<std::string> var(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

std::string text(const char* name) {
  return var(name).value_or("");
}

// The whole value must be an integer in [lo, hi]; unset or empty: `fallback`.
int integer(const char* name, int fallback, int lo, int hi) {
  const std::string v = text(name);
  if (v.empty()) return fallback;
  int x = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || end != v.data() + v.size() || x < lo || x > hi)
    throw InputError(
        detail::concat(name, " = '", v, "': expected an integer in [", lo, ", ", hi, "]"));
  return x;
}

bool flag(const char* name) {
  const std::string v = text(name);
  if (v.empty() || v == "0") return false;
  if (v == "1") return true;
  throw InputError(detail::concat(name, " = '", v, "': expected 0 or 1"));
}

double seconds(const char* name) {
  const std::string v = text(name);
  if (v.empty()) return 0;
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (*end != '\0' || !(x >= 0))
    throw InputError(detail::concat(name, " = '", v, "': expected unix seconds"));
  return x;
}

constexpr int kMaxInt = 1 << 30;

}  // namespace

JobEnv JobEnv::read() {
  JobEnv e;
  e.job = text(env::kJobId);
  e.supervised = flag(env::kSupervised);
  e.epoch = integer(env::kEpoch, 0, 0, kMaxInt);
  e.restarted = flag(env::kRestarted);
  e.job_start = seconds(env::kJobStart);
  e.resume_latest = text(env::kResumeLatest);
  e.lineage = var(env::kLineage);
  e.controller = text(env::kController);
  e.etcd = split(text(env::kEtcd), ',', /*skip_empty=*/true);
  e.slot = integer(env::kSlot, -1, 0, kMaxInt);
  e.local_world_size = integer(env::kLocalWorldSize, 0, 1, kMaxInt);
  e.ifname = text(env::kIfname);
  e.standby = flag(env::kStandby);
  e.standby_index = integer(env::kStandbyIndex, 0, 0, kMaxInt);
  e.standby_gen = integer(env::kStandbyGen, 0, 0, kMaxInt);
  e.standby_group = text(env::kStandbyGroup);
  e.standby_group_size = integer(env::kStandbyGroupSize, 1, 1, kMaxInt);
  e.standby_group_rank = integer(env::kStandbyGroupRank, 0, 0, e.standby_group_size - 1);
  e.diagnose_key = text(env::kDiagnose);
  e.replay_key = text(env::kReplay);
  return e;
}

const JobEnv& JobEnv::get() {
  static const JobEnv e = read();
  return e;
}

std::string make_job_id() {
  std::random_device rd;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%d-%08x", int(getpid()), unsigned(rd()));
  return buf;
}

std::optional<int> job_owner_pid(const std::string& job) {
  int pid = 0;
  auto [end, ec] = std::from_chars(job.data(), job.data() + job.size(), pid);
  if (ec != std::errc() || end == job.data() + job.size() || *end != '-' || pid <= 0)
    return std::nullopt;
  return pid;
}

std::string checkpoint_lineage(const std::string& job, const ResumePoint* resumed) {
  return resumed ? resumed->manifest.lineage() : job;
}

}  // namespace keel
