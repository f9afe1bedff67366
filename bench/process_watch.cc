#include "bench/process_watch.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace keel::bench {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

}  // namespace

ProcessWatch::ProcessWatch(std::string tag) : tag_(std::move(tag)), t0_(now_s()) {}

std::vector<pid_t> ProcessWatch::tagged() const {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    // environ is NUL-separated; a process gone meanwhile reads as empty.
    const std::string env = read_all(e.path().string() + "/environ");
    size_t at = 0;
    while (at < env.size()) {
      const size_t end = env.find('\0', at);
      if (env.compare(at, (end == std::string::npos ? env.size() : end) - at, tag_) == 0) {
        out.push_back(pid_t(std::atoi(name.c_str())));
        break;
      }
      if (end == std::string::npos) break;
      at = end + 1;
    }
  }
  return out;
}

int ProcessWatch::sample() {
  const double t = now_s() - t0_;
  int n = 0;
  for (pid_t pid : tagged()) {
    // Anonymous resident memory only: what a leak grows. Mapped libraries and the shared
    // memory of snapshots are resident too, but neither grows with faults.
    const std::string status = read_all("/proc/" + std::to_string(pid) + "/status");
    const size_t at = status.find("RssAnon:");
    if (at == std::string::npos) continue;  // exited between the scan and now
    const int64_t anon_kib = std::atoll(status.c_str() + at + 8);
    std::string comm = read_all("/proc/" + std::to_string(pid) + "/comm");
    while (!comm.empty() && comm.back() == '\n') comm.pop_back();
    // Field 22 of stat, the start time in clock ticks since boot; the name before it is in
    // parentheses and may hold spaces, so count from its closing one.
    const std::string stat = read_all("/proc/" + std::to_string(pid) + "/stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 2));
    std::string f;
    for (int i = 3; i < 22 && fields >> f; ++i) {
    }
    unsigned long long start = 0;
    if (!(fields >> start)) continue;
    Process& p = seen_[{pid, start}];
    p.pid = pid;
    p.name = comm;
    p.samples.push_back({t, anon_kib * 1024});
    ++n;
  }
  return n;
}

std::vector<std::string> ProcessWatch::alive() const {
  std::vector<std::string> out;
  for (pid_t pid : tagged()) {
    std::string comm = read_all("/proc/" + std::to_string(pid) + "/comm");
    while (!comm.empty() && comm.back() == '\n') comm.pop_back();
    out.push_back(comm + " (" + std::to_string(pid) + ")");
  }
  return out;
}

}  // namespace keel::bench
