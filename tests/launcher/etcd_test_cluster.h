// A real etcd cluster for one test: members on 127.0.0.1, ports and a folder of its own, so
// that tests run in parallel with each other and with everything else.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "launcher/etcd/etcd_members.h"
#include "test_paths.h"

namespace keel::test {

class EtcdTestCluster {
 public:
  // Starts `n` members and waits until each is healthy.
  explicit EtcdTestCluster(int n, const std::string& tag = "etcd") : dir_(temp_dir(tag)) {
    const std::vector<int> ports = free_tcp_ports("127.0.0.1", 2 * n);
    std::vector<EtcdMemberSpec> specs(n);
    for (int i = 0; i < n; ++i) {
      EtcdMemberSpec& s = specs[i];
      char name[16];  // (not "m" + std::to_string(i): a false -Wrestrict in GCC 12)
      std::snprintf(name, sizeof(name), "m%d", i);
      s.name = name;
      s.host = "127.0.0.1";
      s.client_port = ports[2 * i];
      s.peer_port = ports[2 * i + 1];
      s.data_dir = dir_ + "/" + s.name + ".etcd";
      s.log_path = dir_ + "/" + s.name + ".log";
      s.token = "test-" + std::to_string(::getpid()) + "-" + tag;
    }
    const std::string cluster = etcd_cluster(specs);
    const auto start = std::chrono::steady_clock::now();
    for (auto& s : specs) {
      s.cluster = cluster;
      members_.push_back(std::make_unique<EtcdMember>(s));
    }
    for (auto& m : members_) m->wait_healthy(std::chrono::seconds(30));
    startup_ = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
    std::printf("etcd: %d members healthy after %lld ms\n", n, (long long)startup_.count());
  }

  std::vector<std::string> endpoints() const {
    std::vector<std::string> out;
    for (const auto& m : members_) out.push_back(m->endpoint());
    return out;
  }
  EtcdMember& member(int i) { return *members_.at(i); }
  int size() const { return int(members_.size()); }
  const std::string& dir() const { return dir_; }
  std::chrono::milliseconds startup() const { return startup_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<EtcdMember>> members_;
  std::chrono::milliseconds startup_{0};
};

}  // namespace keel::test
