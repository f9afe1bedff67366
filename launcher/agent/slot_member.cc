#include "launcher/agent/slot_member.h"

#include "runtime/logging.h"

namespace keel {

using Clock = std::chrono::steady_clock;

SlotMember::SlotMember(int slot, std::string host, std::string job)
    : slot_(slot), host_(std::move(host)), job_(std::move(job)) {
  const std::vector<int> ports = free_tcp_ports(host_, 2);
  ports_[0] = ports[0];
  ports_[1] = ports[1];
}

pid_t SlotMember::start(const control::EtcdMemberStart& m) {
  if (member_ && !member_->running()) member_.reset();
  given_up_ = false;
  quick_ends_ = 0;
  if (!member_) {
    EtcdMemberSpec s;
    s.name = m.name();
    s.host = host_;
    s.client_port = ports_[0];
    s.peer_port = ports_[1];
    s.data_dir = m.data_dir();
    s.log_path = m.log_path();
    s.cluster = m.cluster();
    s.token = job_;
    s.join_existing = m.existing();
    member_ = std::make_unique<EtcdMember>(s);
    started_ = Clock::now();
  }
  return member_->pid();
}

void SlotMember::keep() {
  if (!member_ || given_up_ || member_->running()) return;
  // One that ends again within seconds three times (removed from the cluster while this slot
  // was lost, its disk full) is left alone: the leader's upkeep replaces a member that cannot
  // serve.
  if (Clock::now() - started_ < kRestartEvery) return;
  quick_ends_ = Clock::now() - started_ < 5 * kRestartEvery ? quick_ends_ + 1 : 0;
  if (quick_ends_ >= 3) {
    given_up_ = true;
    LOG(ERROR) << "slot " << slot_ << ": etcd member " << member_->spec().name
               << " keeps ending; not started again (see " << member_->spec().log_path << ")";
    return;
  }
  started_ = Clock::now();
  LOG(WARNING) << "slot " << slot_ << ": etcd member " << member_->spec().name
               << " ended; starting it again from its data";
  try {
    member_->restart();
  } catch (const std::exception& e) {
    LOG(ERROR) << "slot " << slot_ << ": etcd member " << member_->spec().name
               << " cannot be started again: " << e.what();
  }
}

}  // namespace keel
