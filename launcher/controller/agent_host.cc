#include "launcher/controller/agent_host.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "launcher/control_plane.h"
#include "launcher/worker/standby.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {
namespace {

using Clock = std::chrono::steady_clock;

// A wait status as waitpid() would give it, from what the agent saw.
int wait_status(int exit_code, int signal) {
  return signal ? signal : (exit_code & 0xff) << 8;
}

}  // namespace

AgentHost::AgentHost(ControlServer* server, std::shared_ptr<Store> store, int world,
                     int workers_per_slot, int slots, int standby_slots,
                     std::vector<std::string> worker_argv,
                     std::map<std::string, std::string> worker_env,
                     std::chrono::milliseconds slot_timeout)
    : server_(server),
      store_(std::move(store)),
      world_(world),
      workers_per_slot_(workers_per_slot),
      slots_(size_t(slots)),
      worker_argv_(std::move(worker_argv)),
      worker_env_(std::move(worker_env)),
      slot_timeout_(slot_timeout),
      rank_slot_(size_t(world)),
      alive_(size_t(world), false) {
  for (int r = 0; r < world; ++r) rank_slot_[size_t(r)] = r / workers_per_slot;
  for (int k = slots - standby_slots; k < slots; ++k) {
    slots_[size_t(k)].role = Role::kStandby;
    slots_[size_t(k)].initial_standby = true;
  }
  initial_standbys_ = standby_slots;
}

std::vector<int> AgentHost::ranks_on(int slot) const {
  std::vector<int> out;
  for (int r = 0; r < world_; ++r)
    if (rank_slot_[size_t(r)] == slot) out.push_back(r);
  return out;
}

void AgentHost::on_message(const std::string& identity, const control::Envelope& m) {
  if (m.has_registration()) {
    const auto& reg = m.registration();
    if (const std::string why = refusal(identity, reg); !why.empty()) {
      LOG(WARNING) << "refused keel-launch --join from " << reg.host() << " (pid " << reg.pid()
                   << "): " << why;
      control::Envelope no = make_envelope(0);
      no.mutable_command()->set_kind(control::Command::refuse);
      no.mutable_command()->set_message(why);
      server_->send(identity, no);
      return;
    }
    Slot& s = slots_[size_t(reg.slot())];
    ++s.registrations;
    const bool back = s.state == State::kLost || s.role == Role::kEvicted;
    s.identity = identity;
    s.host = reg.host();
    s.pid = reg.pid();
    s.state = State::kActive;
    s.last_heartbeat = Clock::now();
    control::Envelope w = make_envelope(0);
    w.mutable_command()->set_kind(control::Command::welcome);
    server_->send(identity, w);
    // A slot whose ranks moved elsewhere comes back as a standby, after its self-check.
    if (s.role == Role::kEvicted || (back && ranks_on(reg.slot()).empty())) s.role = Role::kStandby;
    if (back)
      LOG(INFO) << "slot " << reg.slot() << " (" << reg.host() << ") rejoined"
                << (s.role == Role::kStandby ? " as a standby" : "");
    if (s.role == Role::kStandby) start_standby(reg.slot(), s.initial_standby && s.gen == 0);
    return;
  }
  if (m.has_heartbeat()) {
    const int k = m.heartbeat().slot();
    if (k < 0 || k >= int(slots_.size())) return;
    Slot& s = slots_[size_t(k)];
    // Another agent that claims the slot (refused, or replaced by a newer one) must not keep
    // it looking alive.
    if (identity != s.identity) return;
    if (s.state == State::kLost) {
      // Its network came back, but its ranks were given up: their workers are stale.
      control::Envelope r = make_envelope(0);
      r.mutable_command()->set_kind(control::Command::reset);
      server_->send(identity, r);
      return;
    }
    s.last_heartbeat = Clock::now();
    // The agent's proof that the controller lives: without it for
    // detect.controller_timeout_ms the agent stops its workers and exits (launcher/agent/agent.h).
    control::Envelope alive = make_envelope(0);
    alive.mutable_command()->set_kind(control::Command::keepalive);
    server_->send(identity, alive);
    return;
  }
  if (m.has_event()) {
    const control::Event& e = m.event();
    if (e.kind() == control::Event::snapshots) {
      survey_replies_[e.slot()] = e;
    } else if (e.kind() == control::Event::stacks) {
      stacks_replies_[e.slot()] = e;
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
      LOG(WARNING) << "slot " << e.slot() << ": " << e.message();
    }
  }
}

std::string AgentHost::refusal(const std::string& identity, const control::Register& reg) const {
  if (!job_.empty() && reg.job() != job_)
    return detail::concat("job id '", reg.job(), "' is not this controller's job (", job_,
                          "): take --job from runs/<job>/controller");
  const int last = int(slots_.size()) - 1;
  if (reg.slot() < 0 || reg.slot() > last)
    return detail::concat("slot ", reg.slot(), " is out of range: the job has slots 0..", last);
  if (reg.slot() == 0 && reg.pid() != int(getpid()))
    return detail::concat("slot 0 is the controller's own (keel-launch pid ", getpid(),
                          "): join as ",
                          last == 1 ? "slot 1" : detail::concat("one of slots 1..", last));
  const Slot& s = slots_[size_t(reg.slot())];
  if (s.state == State::kActive && identity != s.identity)
    return detail::concat(
        "slot ", reg.slot(), " is in use: keel-launch pid ", s.pid, " on ", s.host,
        " runs it (last heartbeat ",
        int64_t(std::chrono::duration<double, std::milli>(Clock::now() - s.last_heartbeat).count()),
        " ms ago); a slot can be joined once it is taken as lost (no heartbeat for ",
        slot_timeout_.count(), " ms)");
  return "";
}

void AgentHost::start_standby(int slot, bool initial) {
  Slot& s = slots_[size_t(slot)];
  s.self_check.assign(size_t(workers_per_slot_), "");
  ++s.gen;
  // The standbys of the job's start check one all-reduce among all of them; a slot that
  // becomes a standby later checks among its own workers.
  const int first = int(slots_.size()) - initial_standbys_;
  const int group_size = initial ? initial_standbys_ * workers_per_slot_ : workers_per_slot_;
  const std::string group = initial ? std::string("standby/check/start")
                                    : detail::concat("standby/check/", slot, "/", s.gen);
  for (int i = 0; i < workers_per_slot_; ++i) {
    control::Envelope m = make_envelope(0);
    control::Command* c = m.mutable_command();
    c->set_kind(control::Command::spawn);
    c->set_rank(-1 - i);  // a parked worker: no rank yet
    c->set_world(world_);
    for (const auto& a : worker_argv_) c->add_args(a);
    for (const auto& [k, v] : worker_env_) (*c->mutable_env())[k] = v;
    auto& env = *c->mutable_env();
    env["KEEL_STANDBY"] = "1";
    env["KEEL_SLOT"] = std::to_string(slot);
    env["KEEL_STANDBY_INDEX"] = std::to_string(i);
    env["KEEL_STANDBY_GEN"] = std::to_string(s.gen);
    env["KEEL_LOCAL_WORLD_SIZE"] = std::to_string(workers_per_slot_);
    env["KEEL_STANDBY_GROUP"] = group;
    env["KEEL_STANDBY_GROUP_SIZE"] = std::to_string(group_size);
    env["KEEL_STANDBY_GROUP_RANK"] =
        std::to_string(initial ? (slot - first) * workers_per_slot_ + i : i);
    send(slot, m);
  }
}

bool AgentHost::standby_ready(int slot) const {
  const Slot& s = slots_[size_t(slot)];
  if (s.role != Role::kStandby || s.state != State::kActive) return false;
  for (int i = 0; i < workers_per_slot_; ++i) {
    if (s.self_check[size_t(i)].empty()) {
      try {
        s.self_check[size_t(i)] =
            store_->get(keys::standby_ready_key(slot, i, s.gen), std::chrono::milliseconds(1));
      } catch (const CommTimeout&) {
        return false;
      }
    }
    if (s.self_check[size_t(i)].rfind("ok", 0) != 0) return false;
  }
  return true;
}

bool AgentHost::promote(int lost, int standby) {
  if (!standby_ready(standby)) return false;
  const std::vector<int> ranks = ranks_on(lost);
  for (size_t i = 0; i < ranks.size(); ++i) {
    rank_slot_[size_t(ranks[i])] = standby;
    adopt_[ranks[i]] = int(i);
  }
  slots_[size_t(standby)].role = Role::kActive;
  // A live slot evicted a moment ago (evict()) has registered again and checks itself as a
  // standby by now: it must stay one. Only a slot still holding the role is marked.
  if (slots_[size_t(lost)].role == Role::kActive) slots_[size_t(lost)].role = Role::kEvicted;
  return true;
}

void AgentHost::renumber(const std::map<int, int>& old_to_new, int new_world) {
  std::vector<int> slot(size_t(new_world), -1);
  std::vector<bool> alive(size_t(new_world), false);
  for (const auto& [o, n] : old_to_new) {
    slot[size_t(n)] = rank_slot_[size_t(o)];
    alive[size_t(n)] = alive_[size_t(o)];
  }
  rank_slot_ = std::move(slot);
  alive_ = std::move(alive);
  world_ = new_world;
  adopt_.clear();
  killing_.clear();
  control::Envelope m = make_envelope(0);
  m.mutable_command()->set_kind(control::Command::renumber);
  for (const auto& [o, n] : old_to_new) (*m.mutable_command()->mutable_rank_map())[o] = n;
  for (size_t k = 0; k < slots_.size(); ++k) send(int(k), m);
}

bool AgentHost::place(const std::vector<int>& ranks) {
  std::vector<int> ready;
  for (size_t k = 0; k < slots_.size(); ++k)
    if (standby_ready(int(k))) ready.push_back(int(k));
  if (int(ready.size()) * workers_per_slot_ < int(ranks.size())) return false;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int k = ready[i / size_t(workers_per_slot_)];
    rank_slot_[size_t(ranks[i])] = k;
    adopt_[ranks[i]] = int(i % size_t(workers_per_slot_));
    slots_[size_t(k)].role = Role::kActive;
  }
  return true;
}

void AgentHost::evict(int slot) {
  for (int r : ranks_on(slot)) kill(r);
  slots_[size_t(slot)].role = Role::kEvicted;
  // The slot itself is healthy enough to answer: it drops its workers and its shared memory
  // and registers again, which makes it a standby once it has checked itself. Its ranks'
  // new workers must not find its old segments (on one machine they share /dev/shm): wait
  // for the registration that follows the reset.
  const int before = slots_[size_t(slot)].registrations;
  control::Envelope m = make_envelope(0);
  m.mutable_command()->set_kind(control::Command::reset);
  send(slot, m);
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  while (slots_[size_t(slot)].registrations == before &&
         slots_[size_t(slot)].state == State::kActive && Clock::now() < deadline) {
    if (pump_) pump_();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
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
  const int slot = slot_of(rank);
  control::Envelope m = make_envelope(0);
  control::Command* c = m.mutable_command();
  c->set_kind(control::Command::spawn);
  c->set_rank(rank);
  c->set_world(world_);
  auto adopt = adopt_.find(rank);
  if (adopt != adopt_.end()) {
    // A parked standby worker takes the rank: it joins the epoch as a restarted rank.
    auto epoch = env.find("KEEL_EPOCH");
    store_->set(keys::standby_assign_key(slot, adopt->second, slots_[size_t(slot)].gen),
                std::to_string(rank) + " " + (epoch == env.end() ? "0" : epoch->second) + " " +
                    std::to_string(world_));
    (*c->mutable_env())["KEEL_ADOPT_INDEX"] = std::to_string(adopt->second);
    adopt_.erase(adopt);
  } else {
    for (const auto& a : worker_argv_) c->add_args(a);
    for (const auto& [k, v] : env) (*c->mutable_env())[k] = v;
    (*c->mutable_env())["KEEL_LOCAL_WORLD_SIZE"] = std::to_string(workers_per_slot_);
    (*c->mutable_env())["KEEL_SLOT"] = std::to_string(slot);
    std::string ranks;
    for (int r : ranks_on(slot)) {
      if (!ranks.empty()) ranks += ',';
      ranks += std::to_string(r);
    }
    (*c->mutable_env())["KEEL_SLOT_RANKS"] = ranks;
  }
  alive_[size_t(rank)] = true;
  send(slot, m);
}

bool AgentHost::spawn_extra(int slot, int id, const std::map<std::string, std::string>& env) {
  if (slot < 0 || slot >= int(slots_.size()) || id < world_) return false;
  control::Envelope m = make_envelope(0);
  control::Command* c = m.mutable_command();
  c->set_kind(control::Command::spawn);
  c->set_rank(id);
  c->set_world(world_);
  for (const auto& a : worker_argv_) c->add_args(a);
  for (const auto& [k, v] : env) (*c->mutable_env())[k] = v;
  (*c->mutable_env())["KEEL_LOCAL_WORLD_SIZE"] = std::to_string(workers_per_slot_);
  (*c->mutable_env())["KEEL_SLOT"] = std::to_string(slot);
  send(slot, m);
  return true;
}

void AgentHost::kill_extra(int slot, int id) {
  if (slot < 0 || slot >= int(slots_.size())) return;
  control::Envelope m = make_envelope(0);
  m.mutable_command()->set_kind(control::Command::kill);
  m.mutable_command()->set_rank(id);
  send(slot, m);
}

void AgentHost::kill(int rank) {
  if (!alive_[size_t(rank)]) return;
  killing_.insert(rank);
  control::Envelope m = make_envelope(0);
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
    for (int r : ranks_on(int(k))) {
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

std::map<int, policy::Holdings> AgentHost::survey(const Topology& topo, bool) {
  (void)topo;
  survey_replies_.clear();
  control::Envelope m = make_envelope(0);
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
  // A holding on the slot the rank runs on is its own snapshot; anywhere else it is the
  // copy its backup holder keeps.
  std::map<int, policy::Holdings> out;
  for (const auto& [slot, e] : survey_replies_)
    for (const auto& h : e.holdings()) {
      const int r = h.owner_rank();
      if (r < 0 || r >= world_) continue;
      const bool own = h.own() && rank_slot_[size_t(r)] == slot;
      if (h.own() && !own) continue;  // a snapshot left on a slot the rank moved away from
      for (int64_t s : h.steps()) (own ? out[r].own : out[r].backup).insert(s);
    }
  return out;
}

std::map<int, control::RankStacks> AgentHost::capture_stacks(std::chrono::milliseconds timeout) {
  stacks_replies_.clear();
  const auto capture = std::min(timeout, slot_timeout_ / 2);
  control::Envelope m = make_envelope(0);
  m.mutable_command()->set_kind(control::Command::stacks);
  m.mutable_command()->set_timeout_ms(int(capture.count()));
  std::vector<int> asked;
  for (size_t k = 0; k < slots_.size(); ++k)
    if (slots_[k].state == State::kActive && !ranks_on(int(k)).empty()) {
      send(int(k), m);
      asked.push_back(int(k));
    }
  const auto deadline = Clock::now() + capture + std::chrono::seconds(1);
  while (stacks_replies_.size() < asked.size() && Clock::now() < deadline) {
    if (pump_) pump_();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::map<int, control::RankStacks> out;
  for (int k : asked) {
    auto reply = stacks_replies_.find(k);
    if (reply == stacks_replies_.end()) {
      // Its ranks are named, so the summary says whose stacks are missing and why.
      for (int r : ranks_on(k)) {
        control::RankStacks& missing = out[r];
        missing.set_rank(r);
        missing.set_error(detail::concat("slot ", k, " did not answer within ",
                                         (capture + std::chrono::seconds(1)).count(), " ms"));
      }
      continue;
    }
    for (const auto& rs : reply->second.rank_stacks())
      if (rs.rank() >= 0 && rs.rank() < world_ && rank_slot_[size_t(rs.rank())] == k)
        out[rs.rank()] = rs;
  }
  return out;
}

void AgentHost::finish() {
  control::Envelope m = make_envelope(0);
  m.mutable_command()->set_kind(control::Command::shutdown);
  for (size_t k = 0; k < slots_.size(); ++k) send(int(k), m);
}

double AgentHost::slot_silence_s(int slot) const {
  return std::chrono::duration<double>(Clock::now() - slots_[size_t(slot)].last_heartbeat).count();
}

void AgentHost::fill_view(policy::ClusterView* v) const {
  v->rank_slot = rank_slot_;
  v->workers_per_slot = workers_per_slot_;
  v->slots.clear();
  v->ready_standbys.clear();
  v->pending_standbys.clear();
  for (size_t k = 0; k < slots_.size(); ++k) {
    const Slot& s = slots_[k];
    using St = membership::SlotInfo;
    St::State st = s.state == State::kLost      ? St::lost
                   : s.state == State::kPending ? St::pending
                   : s.role == Role::kStandby   ? St::standby
                   : s.role == Role::kEvicted   ? St::evicted
                                                : St::active;
    v->slots[int(k)] = st;
    if (st != St::standby) continue;
    if (standby_ready(int(k))) {
      v->ready_standbys.insert(int(k));
      continue;
    }
    bool failed = false;  // a failed self-check is not worth waiting for
    for (const std::string& c : s.self_check) failed = failed || (!c.empty() && c.rfind("ok", 0));
    if (!failed) v->pending_standbys.insert(int(k));
  }
}

void AgentHost::fill_status(control::StatusReply* reply) const {
  const auto now = Clock::now();
  for (size_t k = 0; k < slots_.size(); ++k) {
    const Slot& s = slots_[k];
    control::SlotStatus* ss = reply->add_slots();
    ss->set_slot(int(k));
    ss->set_host(s.host);
    std::string state = s.state == State::kLost      ? "lost"
                        : s.state == State::kPending ? "pending"
                        : s.role == Role::kStandby   ? "standby"
                        : s.role == Role::kEvicted   ? "evicted"
                                                     : "active";
    if (s.role == Role::kStandby) standby_ready(int(k));  // fetches its self-check results
    if (s.role == Role::kStandby && !s.self_check.empty())
      state += s.self_check[0].empty() ? " (checking)"
                                       : " (self-check " + s.self_check[0].substr(0, 6) + ")";
    ss->set_state(state);
    ss->set_last_heartbeat_age_s(std::chrono::duration<double>(now - s.last_heartbeat).count());
    for (int r : ranks_on(int(k))) ss->add_ranks(r);
  }
}

}  // namespace keel
