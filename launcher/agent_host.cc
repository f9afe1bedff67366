#include "launcher/agent_host.h"

#include <signal.h>

#include <cstdio>
#include <thread>

#include "launcher/control_plane.h"
#include "runtime/check.h"

namespace keel {
namespace {

using Clock = std::chrono::steady_clock;

// A wait status as waitpid() would give it, from what the agent saw.
int wait_status(int exit_code, int signal) {
  return signal ? signal : (exit_code & 0xff) << 8;
}

}  // namespace

AgentHost::AgentHost(ControlServer* server, int world, int workers_per_slot, int slots,
                     std::vector<std::string> worker_argv, std::chrono::milliseconds slot_timeout)
    : server_(server),
      world_(world),
      workers_per_slot_(workers_per_slot),
      slots_(size_t(slots)),
      worker_argv_(std::move(worker_argv)),
      slot_timeout_(slot_timeout),
      alive_(size_t(world), false) {}

void AgentHost::on_message(const std::string& identity, const control::Envelope& m) {
  if (m.has_registration()) {
    const auto& reg = m.registration();
    if (reg.slot() < 0 || reg.slot() >= int(slots_.size())) {
      std::fprintf(stderr, "keel-launch: slot %d registered, but the job has slots 0..%d\n",
                   reg.slot(), int(slots_.size()) - 1);
      return;
    }
    Slot& s = slots_[size_t(reg.slot())];
    const bool back = s.state == State::kLost;
    s.identity = identity;
    s.host = reg.host();
    s.pid = reg.pid();
    s.state = State::kActive;
    s.last_heartbeat = Clock::now();
    control::Envelope w = make_envelope(epoch_);
    w.mutable_command()->set_kind(control::Command::welcome);
    server_->send(identity, w);
    if (back)
      std::fprintf(stderr, "keel-launch: slot %d (%s) rejoined\n", reg.slot(), reg.host().c_str());
    return;
  }
  if (m.has_heartbeat()) {
    const int k = m.heartbeat().slot();
    if (k < 0 || k >= int(slots_.size())) return;
    Slot& s = slots_[size_t(k)];
    if (s.state == State::kLost) {
      // Its network came back, but its ranks were given up: their workers are stale.
      control::Envelope r = make_envelope(epoch_);
      r.mutable_command()->set_kind(control::Command::reset);
      server_->send(identity, r);
      return;
    }
    s.last_heartbeat = Clock::now();
    return;
  }
  if (m.has_event()) {
    const control::Event& e = m.event();
    if (e.kind() == control::Event::snapshots) {
      survey_replies_[e.slot()] = e;
    } else if (e.kind() == control::Event::worker_exit) {
      if (e.rank() < 0 || e.rank() >= world_) return;
      alive_[size_t(e.rank())] = false;
      if (killing_.erase(e.rank())) return;  // we asked for it
      RankExit x;
      x.rank = e.rank();
      x.slot = e.slot();
      x.status = wait_status(e.exit_code(), e.signal());
      x.detail = e.last_lines();
      exits_.push_back(x);
    } else if (e.kind() == control::Event::slot_error) {
      std::fprintf(stderr, "keel-launch: slot %d: %s\n", e.slot(), e.message().c_str());
    }
  }
}

bool AgentHost::wait_for_slots(std::chrono::milliseconds timeout, const volatile int* stop) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (stop && *stop) return false;
    if (pump_) pump_();
    bool all = true;
    for (const Slot& s : slots_) all = all && s.state == State::kActive;
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

void AgentHost::send(int slot, const control::Envelope& msg) {
  const Slot& s = slots_[size_t(slot)];
  if (s.state == State::kActive) server_->send(s.identity, msg);
}

void AgentHost::spawn(int rank, const std::map<std::string, std::string>& env) {
  control::Envelope m = make_envelope(epoch_);
  control::Command* c = m.mutable_command();
  c->set_kind(control::Command::spawn);
  c->set_rank(rank);
  c->set_world(world_);
  for (const auto& a : worker_argv_) c->add_args(a);
  for (const auto& [k, v] : env) (*c->mutable_env())[k] = v;
  (*c->mutable_env())["KEEL_LOCAL_WORLD_SIZE"] = std::to_string(workers_per_slot_);
  (*c->mutable_env())["KEEL_SLOT"] = std::to_string(slot_of(rank));
  std::string ranks;
  for (int r = slot_of(rank) * workers_per_slot_; r < (slot_of(rank) + 1) * workers_per_slot_;
       ++r) {
    if (!ranks.empty()) ranks += ',';
    ranks += std::to_string(r);
  }
  (*c->mutable_env())["KEEL_SLOT_RANKS"] = ranks;
  alive_[size_t(rank)] = true;
  send(slot_of(rank), m);
}

void AgentHost::kill(int rank) {
  if (!alive_[size_t(rank)]) return;
  killing_.insert(rank);
  control::Envelope m = make_envelope(epoch_);
  m.mutable_command()->set_kind(control::Command::kill);
  m.mutable_command()->set_rank(rank);
  send(slot_of(rank), m);
  // Returns once the agent says the worker is gone, or its slot is lost (then it is gone
  // with it, as far as the job is concerned).
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (alive_[size_t(rank)] && Clock::now() < deadline) {
    if (pump_) pump_();
    check_heartbeats();
    if (slots_[size_t(slot_of(rank))].state != State::kActive) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  alive_[size_t(rank)] = false;
  killing_.erase(rank);
}

void AgentHost::check_heartbeats() {
  const auto now = Clock::now();
  for (size_t k = 0; k < slots_.size(); ++k) {
    Slot& s = slots_[k];
    if (s.state != State::kActive || now - s.last_heartbeat < slot_timeout_) continue;
    s.state = State::kLost;
    const double silent = std::chrono::duration<double>(now - s.last_heartbeat).count();
    for (int r = int(k) * workers_per_slot_; r < int(k + 1) * workers_per_slot_ && r < world_;
         ++r) {
      if (!alive_[size_t(r)] && !killing_.count(r)) continue;
      alive_[size_t(r)] = false;
      killing_.erase(r);
      RankExit x;
      x.rank = r;
      x.slot = int(k);
      x.slot_lost = true;
      char buf[96];
      std::snprintf(buf, sizeof(buf), "no heartbeat from %s for %.2f s", s.host.c_str(), silent);
      x.detail = buf;
      exits_.push_back(x);
    }
  }
}

std::optional<RankExit> AgentHost::poll_exit() {
  check_heartbeats();
  if (exits_.empty()) return std::nullopt;
  RankExit x = exits_.front();
  exits_.pop_front();
  return x;
}

void AgentHost::stop_all(int sig, std::chrono::milliseconds grace) {
  (void)sig;
  (void)grace;
  for (int r = 0; r < world_; ++r) kill(r);
  exits_.clear();
}

std::map<int, std::set<int64_t>> AgentHost::survey(const Topology& topo) {
  (void)topo;
  survey_replies_.clear();
  control::Envelope m = make_envelope(epoch_);
  m.mutable_command()->set_kind(control::Command::survey);
  int asked = 0;
  for (size_t k = 0; k < slots_.size(); ++k)
    if (slots_[k].state == State::kActive) {
      send(int(k), m);
      ++asked;
    }
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (int(survey_replies_.size()) < asked && Clock::now() < deadline) {
    if (pump_) pump_();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::map<int, std::set<int64_t>> out;
  for (const auto& [slot, e] : survey_replies_)
    for (const auto& h : e.holdings())
      for (int64_t s : h.steps()) out[h.owner_rank()].insert(s);
  return out;
}

void AgentHost::finish() {
  control::Envelope m = make_envelope(epoch_);
  m.mutable_command()->set_kind(control::Command::shutdown);
  for (size_t k = 0; k < slots_.size(); ++k) send(int(k), m);
}

bool AgentHost::can_spawn(int rank) const {
  return slots_[size_t(slot_of(rank))].state == State::kActive;
}

std::vector<int> AgentHost::lost_slots() const {
  std::vector<int> out;
  for (size_t k = 0; k < slots_.size(); ++k)
    if (slots_[k].state == State::kLost) out.push_back(int(k));
  return out;
}

void AgentHost::fill_status(control::StatusReply* reply) const {
  const auto now = Clock::now();
  for (size_t k = 0; k < slots_.size(); ++k) {
    const Slot& s = slots_[k];
    control::SlotStatus* ss = reply->add_slots();
    ss->set_slot(int(k));
    ss->set_host(s.host);
    ss->set_state(s.state == State::kActive ? "active"
                  : s.state == State::kLost ? "lost"
                                            : "pending");
    ss->set_last_heartbeat_age_s(std::chrono::duration<double>(now - s.last_heartbeat).count());
    for (int r = int(k) * workers_per_slot_; r < int(k + 1) * workers_per_slot_ && r < world_; ++r)
      ss->add_ranks(r);
  }
}

}  // namespace keel
