#include "launcher/controller/agent_host.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "launcher/control_plane.h"
#include "launcher/etcd/etcd_store.h"
#include "launcher/job_env.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "runtime/check.h"
#include "runtime/logging.h"
#include "runtime/text.h"

namespace keel {
namespace {

using Clock = std::chrono::steady_clock;

// How long kill() waits for the agent to report the worker gone: SIGKILL and waitpid on the
// slot take milliseconds; an agent silent this long is dying with its slot (the slot timeout
// then takes it as lost).
constexpr std::chrono::seconds kKillWait{10};
// How long a survey waits for every active slot's answer: reading slot headers takes
// milliseconds; a slot that does not answer by then contributes no holdings.
constexpr std::chrono::seconds kSurveyWait{10};
// How long evict() waits for an evicted slot's agent to register again after its reset, so
// that the ranks' new workers never find its old shared memory; a slot that takes longer is
// dying anyway.
constexpr std::chrono::seconds kEvictRegisterWait{2};
// The trip of a stacks request and its answer over the control plane, on top of the capture.
constexpr std::chrono::seconds kStacksTrip{1};
// The most messages one poll of the control plane takes up.
constexpr int kPollBatch = 4096;
// Between polls of the control plane while waiting on an agent.
constexpr std::chrono::milliseconds kPollPause{2};
// How often the own slot's agent hears from a leader that ends the job (await_shutdown).
constexpr std::chrono::milliseconds kAliveEvery{100};

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
      layout_{slots, standby_slots, workers_per_slot},
      agents_(size_t(slots)),
      worker_argv_(std::move(worker_argv)),
      worker_env_(std::move(worker_env)),
      slot_timeout_(slot_timeout),
      alive_(size_t(world), false) {
  // Until a controller lends its own (attach): a host driven alone (tests) still places its
  // ranks, in Megatron order.
  unattached_ = std::make_unique<JobMembership>(Topology(1, 1, world), world, layout_);
  members_ = unattached_.get();
}

void AgentHost::attach(JobMembership* membership, Inbox inbox) {
  KEEL_CHECK(membership && membership->slot_count() == layout_.slots,
             "the membership's slots are not this host's");
  // Agents that registered before (keel-launch waits for its slots before it starts the job's
  // etcd and controller) keep their slots' states; a new leader's restored membership (all
  // pending) is taken as it is.
  if (unattached_ && !membership->restored()) membership->take_slots_of(*unattached_);
  members_ = membership;
  unattached_.reset();
  inbox_ = std::move(inbox);
}

void AgentHost::poll_plane() {
  note_closed();
  if (!inbox_) {
    if (pump_) pump_();
    return;
  }
  // Bounded: messages that come faster than they are handled (thousands of ranks reporting
  // while a new leader takes over) must not keep a waiter from its deadline.
  for (int n = 0; n < kPollBatch; ++n) {
    auto in = server_->poll(std::chrono::milliseconds(0));
    if (!in) break;
    const control::Envelope& m = in->msg;
    if (m.has_registration() || m.has_heartbeat() || m.has_event())
      on_message(in->identity, m);
    else
      inbox_(in->identity, m);
  }
}

control::Envelope AgentHost::command(control::Command::Kind kind) const {
  control::Envelope m = make_envelope(members_->epoch());
  m.mutable_command()->set_kind(kind);
  *m.mutable_command()->mutable_membership() = members_->to_proto();
  return m;
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
    const int k = reg.slot();
    Agent& a = agents_[size_t(k)];
    ++a.registrations;
    a.identity = identity;
    a.host = reg.host();
    a.pid = reg.pid();
    a.etcd_client_port = reg.etcd_client_port();
    a.liveness_port = reg.liveness_port();
    a.failure_domain = reg.failure_domain();
    a.process_gone = false;
    a.etcd_peer_port = reg.etcd_peer_port();
    a.last_heartbeat = Clock::now();
    a.closed_at.reset();
    a.lost_silent = false;
    control::Envelope w = make_envelope(0);
    w.mutable_command()->set_kind(control::Command::welcome);
    for (const auto& e : etcd_endpoints()) w.mutable_command()->add_etcd_endpoints(e);
    const bool candidate = !etcd_endpoints_.empty() && wants_candidate(k);
    w.mutable_command()->set_candidate(candidate);
    if (candidate) candidate_at_.insert(k);
    if (reg.rejoin()) {
      // A new leader: the slot goes on as it was, its workers running.
      members_->rejoin_slot(k);
      for (const auto& [rank, pid] : reg.running())
        if (rank >= 0 && rank < int(alive_.size())) alive_[size_t(rank)] = true;
      // Workers that ended while the job had no leader (finished, or crashed): exits like any,
      // for the ranks the restored Membership still places here.
      const std::vector<int> here = ranks_on(k);
      for (const control::Event& e : reg.exited()) {
        const int r = e.rank();
        if (r < 0 || r >= int(alive_.size()) || reg.running().count(r) ||
            std::find(here.begin(), here.end(), r) == here.end())
          continue;
        alive_[size_t(r)] = false;
        RankExit x;
        x.rank = r;
        x.slot = k;
        x.status = wait_status(e.exit_code(), e.signal());
        x.detail = e.last_lines();
        exits_.push_back(x);
        LOG(INFO) << "slot " << k << ": rank " << r
                  << "'s worker ended while the job had no leader (" << x.describe() << ")";
      }
      // Ranks placed here that the agent neither runs nor saw end: it was started anew (the
      // machine lost and joined again while the job had no leader) and never ran them. They
      // are gone, not hung: exits, so that the transition restarts them instead of waiting
      // for an ack (a hang would evict the slot and wait for a standby).
      for (const int r : here) {
        if (reg.running().count(r) ||
            std::any_of(reg.exited().begin(), reg.exited().end(),
                        [r](const control::Event& e) { return e.rank() == r; }))
          continue;
        alive_[size_t(r)] = false;
        RankExit x;
        x.rank = r;
        x.slot = k;
        x.status = W_EXITCODE(0, SIGKILL);
        x.detail = detail::concat("no worker of rank ", r, " runs on slot ", k,
                                  ": its agent was started anew while the job had no leader");
        exits_.push_back(x);
        LOG(INFO) << "slot " << k << ": rank " << r << " has no worker there (" << x.detail << ")";
      }
      if (members_->state(k) == membership::SlotInfo::standby)
        a.self_check.assign(size_t(layout_.workers_per_slot), std::nullopt);
      server_->send(identity, w);
      LOG(INFO) << "slot " << k << " (" << reg.host() << ") registered with this leader, "
                << reg.running_size() << " worker(s) running";
      return;
    }
    const JobMembership::Registered r = members_->register_slot(k);
    server_->send(identity, w);
    if (r.rejoined)
      LOG(INFO) << "slot " << k << " (" << reg.host() << ") rejoined"
                << (r.start_check ? " as a standby" : "");
    if (r.start_check && !store_)
      deferred_standby_.push_back(k);
    else if (r.start_check)
      start_standby(k);
    return;
  }
  if (m.has_heartbeat()) {
    const int k = m.heartbeat().slot();
    if (k < 0 || k >= int(agents_.size())) return;
    Agent& a = agents_[size_t(k)];
    // Another agent that claims the slot (refused, or replaced by a newer one) must not keep
    // it looking alive.
    if (identity != a.identity) return;
    if (members_->link(k) == JobMembership::Link::kLost) {
      // Its network came back, but its ranks were given up: their workers are stale.
      server_->send(identity, command(control::Command::reset));
      return;
    }
    a.last_heartbeat = Clock::now();
    a.closed_at.reset();  // it reconnected
    // The agent's proof that the controller lives: without it for
    // detect.controller_timeout_ms the agent stops its workers and exits (launcher/agent/agent.h).
    // Bare: with the Membership it cost slots x ranks per second (keel-bench control-plane:
    // 25 MB/s at 4,096 ranks), and the agent reads none from it.
    control::Envelope keepalive = make_envelope(members_->epoch());
    keepalive.mutable_command()->set_kind(control::Command::keepalive);
    server_->send(identity, keepalive);
    return;
  }
  if (m.has_event()) {
    const control::Event& e = m.event();
    if (e.kind() == control::Event::snapshots) {
      survey_replies_[e.slot()] = e;
    } else if (e.kind() == control::Event::stacks) {
      stacks_replies_[e.slot()] = e;
    } else if (e.kind() == control::Event::etcd_started) {
      etcd_replies_[e.slot()] = e;
    } else if (e.kind() == control::Event::worker_exit) {
      if (e.rank() < 0 || e.rank() >= int(alive_.size())) return;
      const int k = e.slot();
      // A stale worker's end, not the rank's: sent by an agent that does not hold the slot
      // (refused, replaced), or from a slot that no longer runs the rank (taken out while it
      // could not be heard; the rank lives on elsewhere).
      if (k < 0 || k >= int(agents_.size()) || identity != agents_[size_t(k)].identity ||
          slot_of(e.rank()) != k) {
        LOG(INFO) << "slot " << k << ": the end of a stale worker of rank " << e.rank()
                  << " (the rank runs on slot " << slot_of(e.rank()) << ")";
        return;
      }
      alive_[size_t(e.rank())] = false;
      if (killing_.erase(e.rank())) return;  // we asked for it
      RankExit x;
      x.rank = e.rank();
      x.slot = e.slot();
      x.status = wait_status(e.exit_code(), e.signal());
      x.detail = e.last_lines();
      exits_.push_back(x);
    } else if (e.kind() == control::Event::standby_exit) {
      const int k = e.slot();
      if (k >= 0 && k < int(agents_.size()) && identity == agents_[size_t(k)].identity)
        on_standby_exit(k, e);
    } else if (e.kind() == control::Event::slot_error) {
      LOG(WARNING) << "slot " << e.slot() << ": " << e.message();
    }
  }
}

std::string AgentHost::refusal(const std::string& identity, const control::Register& reg) const {
  if (!job_.empty() && reg.job() != job_)
    return detail::concat("job id '", reg.job(), "' is not this controller's job (", job_,
                          "): take --job from runs/<job>/controller");
  const int last = int(agents_.size()) - 1;
  if (reg.slot() < 0 || reg.slot() > last)
    return detail::concat("slot ", reg.slot(), " is out of range: the job has slots 0..", last);
  if (reg.slot() == 0 && slot0_pid_ != 0 && reg.pid() != slot0_pid_)
    return detail::concat("slot 0 is the controller's own (keel-launch pid ", slot0_pid_,
                          "): join as ",
                          last == 1 ? "slot 1" : detail::concat("one of slots 1..", last));
  if (reg.rejoin() && members_->link(reg.slot()) != JobMembership::Link::kPending)
    return detail::concat("slot ", reg.slot(), " rejoins a new leader but is ",
                          JobMembership::state_name(members_->state(reg.slot())),
                          " here: it was taken as lost");
  const Agent& a = agents_[size_t(reg.slot())];
  if (up(reg.slot()) && identity != a.identity)
    return detail::concat(
        "slot ", reg.slot(), " is in use: keel-launch pid ", a.pid, " on ", a.host,
        " runs it (last heartbeat ",
        int64_t(std::chrono::duration<double, std::milli>(Clock::now() - a.last_heartbeat).count()),
        " ms ago); a slot can be joined once it is taken as lost (no heartbeat for ",
        slot_timeout_.count(), " ms)");
  return "";
}

void AgentHost::evict(int slot) {
  for (int r : ranks_on(slot)) kill(r);
  // The slot itself is healthy enough to answer: it drops its workers and its shared memory
  // and registers again, which makes it a standby once it has checked itself. Its ranks'
  // new workers must not find its old segments (on one machine they share /dev/shm): wait
  // for the registration that follows the reset.
  const int before = agents_[size_t(slot)].registrations;
  send(slot, command(control::Command::reset));
  wait_until([&] { return agents_[size_t(slot)].registrations != before || !up(slot); },
             kEvictRegisterWait);
}

void AgentHost::wait_until(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!done() && Clock::now() < deadline) {
    poll_plane();
    std::this_thread::sleep_for(kPollPause);
  }
}

bool AgentHost::wait_for_slots(std::chrono::milliseconds timeout, const volatile int* stop) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (stop && *stop) return false;
    poll_plane();
    bool all = true;
    for (int k = 0; k < members_->slot_count(); ++k) all = all && up(k);
    if (all) return true;
    std::this_thread::sleep_for(kPollPause);
  }
  return false;
}

void AgentHost::send(int slot, const control::Envelope& msg) {
  if (up(slot)) server_->send(agents_[size_t(slot)].identity, msg);
}

void AgentHost::spawn(int rank, const std::map<std::string, std::string>& env) {
  const int slot = slot_of(rank);
  control::Envelope m = command(control::Command::spawn);
  control::Command* c = m.mutable_command();
  c->set_rank(rank);
  c->set_world(members_->world());
  auto adopt = adopt_.find(rank);
  if (adopt != adopt_.end()) {
    // A parked standby worker takes the rank: it joins the epoch as a restarted rank.
    store::StandbyAssign assign;
    assign.set_rank(rank);
    assign.set_epoch(members_->epoch());
    *assign.mutable_membership() = members_->to_proto();
    set_message(*store_, keys::standby_assign_key(slot, adopt->second, members_->standby_gen(slot)),
                assign);
    c->set_adopt_index(adopt->second);
    adopt_.erase(adopt);
  } else {
    for (const auto& a : worker_argv_) c->add_args(a);
    for (const auto& [k, v] : env) (*c->mutable_env())[k] = v;
    with_current_etcd(c->mutable_env());
    (*c->mutable_env())[env::kLocalWorldSize] = std::to_string(layout_.workers_per_slot);
    (*c->mutable_env())[env::kSlot] = std::to_string(slot);
  }
  alive_[size_t(rank)] = true;
  send(slot, m);
}

bool AgentHost::spawn_extra(int slot, int id, const std::map<std::string, std::string>& env) {
  if (slot < 0 || slot >= int(agents_.size()) || id < members_->world()) return false;
  control::Envelope m = command(control::Command::spawn);
  control::Command* c = m.mutable_command();
  c->set_rank(id);
  c->set_world(members_->world());
  for (const auto& a : worker_argv_) c->add_args(a);
  for (const auto& [k, v] : env) (*c->mutable_env())[k] = v;
  with_current_etcd(c->mutable_env());
  (*c->mutable_env())[env::kLocalWorldSize] = std::to_string(layout_.workers_per_slot);
  (*c->mutable_env())[env::kSlot] = std::to_string(slot);
  send(slot, m);
  return true;
}

void AgentHost::kill_extra(int slot, int id) {
  if (slot < 0 || slot >= int(agents_.size())) return;
  control::Envelope m = command(control::Command::kill);
  m.mutable_command()->set_rank(id);
  send(slot, m);
}

void AgentHost::kill(int rank) {
  if (!alive_[size_t(rank)]) return;
  killing_.insert(rank);
  control::Envelope m = command(control::Command::kill);
  m.mutable_command()->set_rank(rank);
  send(slot_of(rank), m);
  // Returns once the agent says the worker is gone, or its slot is lost (then it is gone
  // with it, as far as the job is concerned).
  const auto deadline = Clock::now() + kKillWait;
  while (alive_[size_t(rank)] && Clock::now() < deadline) {
    poll_plane();
    check_heartbeats();
    if (!up(slot_of(rank))) break;
    std::this_thread::sleep_for(kPollPause);
  }
  alive_[size_t(rank)] = false;
  killing_.erase(rank);
}

void AgentHost::set_store(std::shared_ptr<Store> store,
                          const std::map<std::string, std::string>& env) {
  store_ = std::move(store);
  for (const auto& [k, v] : env) worker_env_[k] = v;
  for (const int slot : deferred_standby_)
    if (up(slot)) start_standby(slot);
  deferred_standby_.clear();
}

std::vector<std::string> AgentHost::etcd_endpoints() const {
  if (etcd_endpoints_.empty() || !etcd_now_) return etcd_endpoints_;
  std::vector<std::string> now = etcd_now_();
  return now.empty() ? etcd_endpoints_ : now;
}

void AgentHost::with_current_etcd(google::protobuf::Map<std::string, std::string>* env) const {
  if (!etcd_now_ || !env->contains(env::kEtcd)) return;
  const std::vector<std::string> now = etcd_endpoints();
  (*env)[env::kEtcd] = join(now, ",");
  const auto store = env->find(env::kStoreAddr);
  if (store != env->end()) store->second = with_etcd_endpoints(store->second, now);
}

void AgentHost::follow(const std::vector<std::string>& etcd_endpoints, int candidates) {
  etcd_endpoints_ = etcd_endpoints;
  candidates_ = candidates;
  for (int k = 0; k < int(agents_.size()); ++k) {
    if (!up(k)) continue;  // told with its welcome
    control::Envelope m = command(control::Command::follow);
    for (const auto& e : this->etcd_endpoints()) m.mutable_command()->add_etcd_endpoints(e);
    const bool candidate = wants_candidate(k);
    m.mutable_command()->set_candidate(candidate);
    if (candidate) candidate_at_.insert(k);
    send(k, m);
  }
}

bool AgentHost::wants_candidate(int slot) const {
  if (!up(slot)) return false;
  int before = 0;  // live slots before this one
  for (int k = 0; k < slot && before < candidates_; ++k) before += up(k);
  return before < candidates_;
}

void AgentHost::keep_candidates() {
  if (etcd_endpoints_.empty()) return;
  int live = 0;  // live slots so far: the first candidates_ of them run one (wants_candidate)
  for (int k = 0; k < int(agents_.size()); ++k) {
    if (!up(k)) {
      candidate_at_.erase(k);  // its candidate went with it
      continue;
    }
    if (live++ >= candidates_ || candidate_at_.count(k)) continue;
    control::Envelope m = command(control::Command::follow);
    for (const auto& e : etcd_endpoints()) m.mutable_command()->add_etcd_endpoints(e);
    m.mutable_command()->set_candidate(true);
    send(k, m);
    candidate_at_.insert(k);
  }
}

void AgentHost::stop_all(int sig, std::chrono::milliseconds grace) {
  (void)sig;
  (void)grace;
  for (int r = 0; r < int(alive_.size()); ++r) kill(r);
  exits_.clear();
}

std::map<int, policy::Holdings> AgentHost::survey(const Topology& topo, bool) {
  (void)topo;  // the agents take the layout from the membership the command carries
  survey_replies_.clear();
  const control::Envelope m = command(control::Command::survey);
  int asked = 0;
  for (int k = 0; k < int(agents_.size()); ++k)
    if (up(k)) {
      send(k, m);
      ++asked;
    }
  wait_until([&] { return int(survey_replies_.size()) >= asked; }, kSurveyWait);
  // A holding on the slot the rank runs on is its own snapshot; anywhere else it is the
  // copy its backup holder keeps.
  std::map<int, policy::Holdings> out;
  for (const auto& [slot, e] : survey_replies_)
    for (const auto& h : e.holdings()) {
      const int r = h.owner_rank();
      if (r < 0 || r >= members_->world()) continue;
      const bool own = h.own() && slot_of(r) == slot;
      if (h.own() && !own) continue;  // a snapshot left on a slot the rank moved away from
      for (int64_t s : h.steps()) (own ? out[r].own : out[r].backup).insert(s);
    }
  return out;
}

std::map<int, control::RankStacks> AgentHost::capture_stacks(std::chrono::milliseconds timeout) {
  stacks_replies_.clear();
  const auto capture = std::min(timeout, slot_timeout_ / 2);
  control::Envelope m = command(control::Command::stacks);
  m.mutable_command()->set_timeout_ms(int(capture.count()));
  std::vector<int> asked;
  for (int k = 0; k < int(agents_.size()); ++k)
    if (up(k) && !ranks_on(k).empty()) {
      send(k, m);
      asked.push_back(k);
    }
  const auto wait = capture + std::chrono::duration_cast<std::chrono::milliseconds>(kStacksTrip);
  wait_until([&] { return stacks_replies_.size() >= asked.size(); }, wait);
  std::map<int, control::RankStacks> out;
  for (int k : asked) {
    auto reply = stacks_replies_.find(k);
    if (reply == stacks_replies_.end()) {
      // Its ranks are named, so the summary says whose stacks are missing and why.
      for (int r : ranks_on(k)) {
        control::RankStacks& missing = out[r];
        missing.set_rank(r);
        missing.set_error(
            detail::concat("slot ", k, " did not answer within ", wait.count(), " ms"));
      }
      continue;
    }
    for (const auto& rs : reply->second.rank_stacks())
      if (rs.rank() >= 0 && rs.rank() < members_->world() && slot_of(rs.rank()) == k)
        out[rs.rank()] = rs;
  }
  return out;
}

void AgentHost::renumber(const std::map<int, int>& old_to_new, int new_world) {
  std::vector<bool> alive(size_t(new_world), false);
  for (const auto& [o, n] : old_to_new) alive[size_t(n)] = alive_[size_t(o)];
  alive_ = std::move(alive);
  adopt_.clear();
  killing_.clear();
  control::Envelope m = command(control::Command::renumber);
  for (const auto& [o, n] : old_to_new) (*m.mutable_command()->mutable_rank_map())[o] = n;
  for (int k = 0; k < int(agents_.size()); ++k) send(k, m);
}

void AgentHost::finish() {
  control::Envelope m = command(control::Command::shutdown);
  m.mutable_command()->set_exit_code(exit_code_);
  for (int k = 0; k < int(agents_.size()); ++k)
    if (k != own_slot_) send(k, m);
}

void AgentHost::await_shutdown(std::chrono::milliseconds grace) {
  std::set<std::string> open;
  for (int k = 0; k < int(agents_.size()); ++k)
    if (up(k) && k != own_slot_) open.insert(agents_[size_t(k)].identity);
  const bool own = own_slot_ >= 0 && up(own_slot_);
  // This process's own agent is told last (it ends this process), and hears nothing else
  // while the others go: past Agent::kLeaderSilence it would look for another leader and miss
  // its shutdown. It hears that this leader lives, as each heartbeat's answer would say.
  control::Envelope alive = command(control::Command::keepalive);
  auto next_alive = Clock::now();
  const auto deadline = Clock::now() + grace;
  while (!open.empty() && Clock::now() < deadline) {
    while (server_->poll(std::chrono::milliseconds(0))) {
    }
    for (const std::string& id : server_->take_closed()) open.erase(id);
    if (own && Clock::now() >= next_alive) {
      send(own_slot_, alive);
      next_alive = Clock::now() + kAliveEvery;
    }
    std::this_thread::sleep_for(kPollPause);
  }
  if (!own) return;
  control::Envelope m = command(control::Command::shutdown);
  m.mutable_command()->set_exit_code(exit_code_);
  send(own_slot_, m);
  // Its agent ends this process once it has the message; until then the message must not be
  // dropped with the socket.
  const auto own_deadline = Clock::now() + grace;
  while (Clock::now() < own_deadline) std::this_thread::sleep_for(kPollPause);
}

void AgentHost::fill_status(control::StatusReply* reply) const {
  const auto now = Clock::now();
  for (int k = 0; k < int(agents_.size()); ++k) {
    const Agent& a = agents_[size_t(k)];
    control::SlotStatus* ss = reply->add_slots();
    ss->set_slot(k);
    ss->set_host(a.host);
    std::string state = JobMembership::state_name(members_->state(k));
    if (members_->role(k) == JobMembership::Role::kStandby && !a.self_check.empty())
      state += !a.self_check[0]   ? " (checking)"
               : *a.self_check[0] ? " (self-check ok)"
                                  : " (self-check failed)";
    ss->set_state(state);
    ss->set_last_heartbeat_age_s(std::chrono::duration<double>(now - a.last_heartbeat).count());
    for (int r : ranks_on(k)) ss->add_ranks(r);
  }
}

}  // namespace keel
