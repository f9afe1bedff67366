#include "bench/soak_cluster.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "bench/bench_util.h"
#include "ckpt/snapshot_region.h"
#include "integration/netns.h"
#include "launcher/etcd/etcd_members.h"
#include "runtime/check.h"
#include "runtime/text.h"

namespace keel::bench {

namespace fs = std::filesystem;

// How long the soak's etcd gets to elect its first leader.
constexpr std::chrono::seconds kEtcdStartWait{30};

SoakCluster::SoakCluster(bool netns, int slots, bool own_etcd) : slots_(slots) {
  if (netns) lab_ = std::make_unique<test::NetnsLab>(slots);
  if (!own_etcd) return;
  const std::string host = lab_ ? lab_->bridge_address() : "127.0.0.1";
  // On /dev/shm, as a job's own members under --local: the ranks' store lives in this etcd,
  // and a disk's fsync on each of its writes would be the soak's bottleneck.
  // (Not named keel-*: the tests count those as a job's leftovers.)
  std::string tmp = "/dev/shm/etcd-soak-XXXXXX";
  KEEL_CHECK(::mkdtemp(tmp.data()) != nullptr, "mkdtemp ", tmp, ": ", std::strerror(errno));
  etcd_dir_ = tmp;
  const std::vector<int> ports = free_tcp_ports(host, 6);
  std::vector<EtcdMemberSpec> specs(3);
  for (size_t i = 0; i < specs.size(); ++i) {
    EtcdMemberSpec& s = specs[i];
    s.name = "soak" + std::to_string(i);
    s.host = host;
    s.client_port = ports[2 * i];
    s.peer_port = ports[2 * i + 1];
    s.data_dir = etcd_dir_ + "/" + s.name;
    s.log_path = etcd_dir_ + "/" + s.name + ".log";
    s.token = fs::path(etcd_dir_).filename();
    // An existing cluster, given with --etcd: the operator's, which keel reaches with plain
    // gRPC (it holds no certificate of the operator's CA).
    s.tls = false;
  }
  for (auto& s : specs) s.cluster = etcd_cluster(specs);
  for (const auto& s : specs) etcd_.push_back(std::make_unique<EtcdMember>(s));
  for (const auto& m : etcd_) m->wait_healthy(kEtcdStartWait);
}

SoakCluster::~SoakCluster() {
  etcd_.clear();  // each member stops and removes its data
  std::error_code ec;
  if (!etcd_dir_.empty()) fs::remove_all(etcd_dir_, ec);
}

std::vector<std::string> SoakCluster::layout_args() const {
  std::vector<std::string> a = {netns() ? "--slots" : "--local", std::to_string(slots_)};
  if (!etcd_.empty()) a.insert(a.end(), {"--etcd", etcd_endpoints()});
  return a;
}

std::string SoakCluster::etcd_endpoints() const {
  std::vector<std::string> endpoints;
  for (const auto& m : etcd_) endpoints.push_back(m->endpoint());
  return join(endpoints, ',');
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
