#include "bench/soak_cluster.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "bench/bench_util.h"
#include "integration/netns.h"
#include "runtime/check.h"

namespace keel::bench {
namespace {

namespace fs = std::filesystem;

// Segments of `job` in directory `dir`, named as `where` + their name.
void job_segments(const std::string& dir, const std::string& job, const std::string& where,
                  std::vector<std::string>* out) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (!job.empty() && n.rfind("keel-" + job + "-", 0) == 0) out->push_back(where + n);
  }
}

}  // namespace

SoakCluster::SoakCluster(bool netns, int slots) : slots_(slots) {
  if (netns) lab_ = std::make_unique<test::NetnsLab>(slots);
}

SoakCluster::~SoakCluster() = default;

std::vector<std::string> SoakCluster::layout_args() const {
  return {netns() ? "--slots" : "--local", std::to_string(slots_)};
}

pid_t SoakCluster::start(int slot, const std::vector<std::string>& args, const std::string& tag,
                         const std::string& log) {
  const std::string bin = exe_dir() + "/keel-launch";
  if (lab_) {
    std::vector<std::string> argv = {bin};
    argv.insert(argv.end(), args.begin(), args.end());
    // KEEL_IFNAME: the interface keel binds to, and the one a partition fault takes down.
    return lab_->spawn(slot, argv, {tag, "KEEL_IFNAME=" + lab_->ifname()}, log);
  }
  KEEL_CHECK(slot == 0 || args.front() == "--join", "slot ", slot, " starts with --join here");
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(bin.c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid;
  KEEL_CHECK_ERRNO(pid = fork());
  if (pid == 0) {
    setsid();
    putenv(const_cast<char*>(tag.c_str()));
    FILE* f = std::fopen(log.c_str(), "w");
    if (f) {
      dup2(fileno(f), 1);
      dup2(fileno(f), 2);
    }
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

void SoakCluster::repair(int slot) {
  if (lab_) lab_->repair(slot);
}

std::vector<std::string> SoakCluster::leftover_shm(const std::string& job) const {
  std::vector<std::string> out;
  job_segments("/dev/shm", job, "", &out);
  if (lab_)
    for (int i = 0; i < lab_->size(); ++i)
      job_segments(lab_->shm_dir(i), job, "machine " + std::to_string(i) + ": ", &out);
  return out;
}

}  // namespace keel::bench
