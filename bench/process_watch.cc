#include "bench/process_watch.h"

#include "bench/bench_util.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <sstream>

namespace keel::bench {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// /proc/<pid>/comm without its newline ("" once the process is gone).
std::string comm_of(pid_t pid) {
  std::string comm = read_text("/proc/" + std::to_string(pid) + "/comm");
  while (!comm.empty() && comm.back() == '\n') comm.pop_back();
  return comm;
}

}  // namespace

ProcessWatch::ProcessWatch(std::string tag) : tag_(std::move(tag)), t0_(now_s()) {}

std::vector<pid_t> ProcessWatch::tagged() const {
  std::vector<pid_t> out;
  // environ holds NUL-terminated NAME=VALUE entries: the tag is a whole one.
  std::string entry(1, '\0');
  entry.append(tag_).push_back('\0');
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    // A leading NUL makes the first entry findable like the rest; a process gone meanwhile
    // reads as "".
    std::string env(1, '\0');
    env += read_text(e.path().string() + "/environ");
    if (env.find(entry) != std::string::npos) out.push_back(pid_t(std::atoi(name.c_str())));
  }
  return out;
}

int ProcessWatch::sample() {
  const double t = now_s() - t0_;
  int n = 0;
  for (pid_t pid : tagged()) {
    // Anonymous resident memory only: what a leak grows. Mapped libraries and the shared
    // memory of snapshots are resident too, but neither grows with faults.
    const std::string status = read_text("/proc/" + std::to_string(pid) + "/status");
    const size_t at = status.find("RssAnon:");
    if (at == std::string::npos) continue;  // exited between the scan and now
    const int64_t anon_kib = std::atoll(status.c_str() + at + 8);
    const std::string comm = comm_of(pid);
    // Field 22 of stat, the start time in clock ticks since boot; the name before it is in
    // parentheses and may hold spaces, so count from its closing one.
    const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 2));
    std::string skipped;
    for (int field = 3; field < 22; ++field) fields >> skipped;
    unsigned long long start = 0;
    if (!(fields >> start)) continue;
    Process& p = seen_[{pid, start}];
    // A process that takes another name takes another role (a parked standby promoted to a
    // rank: keel-standby, then keel-worker, a rank's size): its life is counted from then.
    if (!p.name.empty() && !comm.empty() && p.name != comm) p.samples.clear();
    p.pid = pid;
    p.name = comm;
    p.samples.push_back({t, anon_kib * 1024});
    ++n;
  }
  return n;
}

std::vector<std::string> ProcessWatch::alive() const {
  std::vector<std::string> out;
  for (pid_t pid : tagged()) out.push_back(comm_of(pid) + " (" + std::to_string(pid) + ")");
  return out;
}

}  // namespace keel::bench
