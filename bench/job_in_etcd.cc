#include "bench/job_in_etcd.h"

#include "launcher/etcd/etcd_client.h"
#include "launcher/etcd/leader_election.h"
#include "proto/control_state.pb.h"
#include "proto/store_keys.h"
#include "runtime/logging.h"
#include "runtime/text.h"

namespace keel::bench {
namespace {

// A client of the job's etcd: with the job's key, as its members require it.
EtcdClient job_client(const std::string& endpoints, const std::string& job_dir) {
  return EtcdClient(split(endpoints, ',', /*skip_empty=*/true), std::chrono::seconds(5),
                    JobKey::load(job_dir + "/" + kSecretFile));
}

}  // namespace

pid_t leader_pid(const std::string& endpoints, const std::string& job, const std::string& job_dir) {
  try {
    EtcdClient c = job_client(endpoints, job_dir);
    const auto l = find_leader(c, keys::state::leader_prefix(job));
    state::Leader leader;
    return l && leader.ParseFromString(l->value) ? pid_t(leader.pid()) : 0;
  } catch (const std::exception& e) {
    LOG(WARNING) << "the leader of job " << job << ": " << e.what();
    return 0;
  }
}

std::optional<int> job_end_code(const std::string& endpoints, const std::string& job,
                                const std::string& job_dir) {
  try {
    EtcdClient c = job_client(endpoints, job_dir);
    const auto kv = c.get(keys::state::end(job));
    state::JobEnd end;
    if (kv && end.ParseFromString(kv->value)) return end.code();
  } catch (const std::exception& e) {
    LOG_EVERY_N(WARNING, 20) << "the end of job " << job << ": " << e.what();
  }
  return std::nullopt;
}

std::optional<int64_t> faults_fired(const std::string& endpoints, const std::string& job,
                                    const std::string& job_dir) {
  try {
    EtcdClient c = job_client(endpoints, job_dir);
    const auto kv = c.get(keys::state::store_prefix(job) + keys::kInjectCount);
    if (!kv) return std::nullopt;  // gone with the job's store: not known
    return std::stoll(kv->value);
  } catch (const std::exception& e) {
    LOG(WARNING) << "the faults job " << job << " injected: " << e.what();
  }
  return std::nullopt;
}

}  // namespace keel::bench
