// What the integration tests read of a keel-launch job from outside, as an operator would:
// its event log, its processes (found in /proc by command line or environment), its ranks'
// own logs, and its leader as the election in its etcd names it.
#pragma once

#include <google/protobuf/util/json_util.h>
#include <sys/types.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "launcher/etcd/etcd_client.h"
#include "launcher/etcd/leader_election.h"
#include "launcher/job_env.h"
#include "parallel/job_key.h"
#include "proto/control_state.pb.h"
#include "proto/events.pb.h"
#include "proto/store_keys.h"
#include "runtime/text.h"
#include "worker_harness.h"

namespace keel::test {

// The first event of `kind` in the job's event log.
inline std::optional<events::Event> find_event(const std::string& job_dir,
                                               const std::string& kind) {
  std::ifstream in(job_dir + "/events.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    events::Event e;
    if (google::protobuf::util::JsonStringToMessage(line, &e).ok() && e.kind() == kind) return e;
  }
  return std::nullopt;
}

inline double number(const events::Event& e, const std::string& field) {
  auto it = e.data().fields().find(field);
  return it == e.data().fields().end() ? -1 : it->second.number_value();
}

// The pid of the job's etcd member `name` ("slot1"), found from outside as an operator would:
// the etcd process whose command line names it and the job (its cluster token).
inline pid_t member_pid(const std::string& job, const std::string& name) {
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string pid = e.path().filename();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = read_text(e.path().string() + "/cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (contains(cmd, "--name=" + name + " ") && contains(cmd, "--initial-cluster-token=" + job))
      return pid_t(std::stoi(pid));
  }
  return -1;
}

// The last step rank `rank` logged ("step N/M" in logs/rank<R>.log), -1 before its first:
// its own progress, whether or not etcd takes the job's records.
inline int logged_step(const std::string& job_dir, int rank) {
  std::ifstream in(job_dir + "/logs/rank" + std::to_string(rank) + ".log");
  int step = -1, n = 0;
  for (std::string line; std::getline(in, line);)
    if (std::sscanf(line.c_str(), "step %d/", &n) == 1) step = n;
  return step;
}

// The pid of the job's rank `rank`, found from outside: the process whose environment names
// the job and the rank (a standby's names no rank until it is promoted).
inline pid_t rank_pid(const std::string& job, int rank) {
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string pid = e.path().filename();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string vars = read_text(e.path().string() + "/environ");
    auto has = [&](const std::string& var) {
      return vars.find(std::string(1, '\0') + var + std::string(1, '\0')) != std::string::npos ||
             vars.starts_with(var + std::string(1, '\0'));
    };
    if (has(std::string(env::kJobId) + "=" + job) && has("KEEL_RANK=" + std::to_string(rank)))
      return pid_t(std::stoi(pid));
  }
  return -1;
}

// The pid of the job's leader controller, as the election names it.
inline pid_t leader_pid(const std::string& job_dir) {
  const auto etcd = find_event(job_dir, "etcd");
  if (!etcd) return -1;
  EtcdClient c(split(etcd->data().fields().at("endpoints").string_value(), ','),
               std::chrono::seconds(5), JobKey::load(job_dir + "/secret"));
  const auto leader =
      find_leader(c, keys::state::leader_prefix(std::filesystem::path(job_dir).filename()));
  state::Leader l;
  return leader && l.ParseFromString(leader->value) ? pid_t(l.pid()) : -1;
}

}  // namespace keel::test
