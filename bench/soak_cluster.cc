#include "bench/soak_cluster.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "bench/bench_util.h"
#include "ckpt/snapshot_region.h"
#include "integration/netns.h"
#include "runtime/check.h"

namespace keel::bench {

namespace fs = std::filesystem;

SoakCluster::SoakCluster(bool netns, int slots) : slots_(slots) {
  if (netns) lab_ = std::make_unique<test::NetnsLab>(slots);
}

SoakCluster::~SoakCluster() = default;

std::vector<std::string> SoakCluster::layout_args() const {
  std::vector<std::string> a = {netns() ? "--slots" : "--local", std::to_string(slots_)};
  // A fault every second or so on any slot: 3 etcd members lose their quorum as soon as two
  // of their slots fail within the seconds it takes to replace the first; 5 ride out two
  // (launcher/controller/etcd_upkeep.h). A real cluster fails hours apart.
  if (slots_ >= 5) a.insert(a.end(), {"--etcd-members", "5"});
  return a;
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
  if (job.empty()) return {};  // the job never started: nothing of it can be left
  std::vector<std::string> out = job_segments(job);
  for (int i = 0; lab_ && i < lab_->size(); ++i) {
    if (!fs::is_directory(lab_->shm_dir(i))) continue;  // nothing ever ran there
    for (const std::string& s : job_segments(job, lab_->shm_dir(i)))
      out.push_back("machine " + std::to_string(i) + ": " + s);
  }
  return out;
}

}  // namespace keel::bench
