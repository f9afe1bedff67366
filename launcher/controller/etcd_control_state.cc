#include "launcher/controller/etcd_control_state.h"

#include <thread>

#include "launcher/etcd/etcd_error.h"
#include "proto/store_keys.h"
#include "runtime/logging.h"

namespace keel {
namespace {

using Clock = std::chrono::steady_clock;

// Between the tries of a write etcd did not take: short against the quorum timeout, long
// against a member's reply.
constexpr std::chrono::milliseconds kRetryPause{200};
// One campaign's wait when the leadership is to be won again.
constexpr std::chrono::milliseconds kCampaignWait{2000};

}  // namespace

EtcdControlState::EtcdControlState(EtcdClient* client, const std::string& job,
                                   const state::Leader& leader, std::chrono::seconds ttl,
                                   std::chrono::milliseconds quorum_timeout,
                                   std::function<void()> idle,
                                   std::chrono::milliseconds campaign_timeout)
    : client_(client),
      job_(job),
      leader_value_(leader.SerializeAsString()),
      ttl_(ttl),
      quorum_timeout_(quorum_timeout),
      idle_(std::move(idle)) {
  lead(Clock::now() + (campaign_timeout.count() > 0 ? campaign_timeout : quorum_timeout_));
}

EtcdControlState::~EtcdControlState() {
  // Steps down at the job's end: the next job's candidates have nothing to wait for.
  try {
    if (election_) election_->resign();
  } catch (const std::exception& e) {
    LOG(WARNING) << "etcd: resigning the leadership: " << e.what();
  }
}

int64_t EtcdControlState::term() const {
  return election_ ? election_->guard().create_revision : 0;
}

void EtcdControlState::abandon() {
  if (election_) election_->abandon();
  election_.reset();
}

EtcdGuard EtcdControlState::guard() const {
  if (!election_ || !election_->is_leader()) return {};
  return election_->guard();
}

void EtcdControlState::refused(const std::string& what) {
  ++refusals_;
  LOG(WARNING) << "fenced write refused by etcd (term " << led_term_ << "): " << what
               << ": this controller no longer leads";
  if (election_) election_->refused();
}

bool EtcdControlState::leads() const {
  return election_ && election_->is_leader();
}

void EtcdControlState::check_leading() {
  if (election_ && election_->is_leader()) return;
  lead(Clock::now() + quorum_timeout_);
}

void EtcdControlState::lead(Clock::time_point deadline) {
  while (!election_ || !election_->is_leader()) {
    if (led_term_ > 0) {
      // It led before: a candidate that leads now (a later term, not this one's new
      // candidacy) has taken the job over.
      std::optional<LeaderInfo> now;
      try {
        now = find_leader(*client_, keys::state::leader_prefix(job_));
      } catch (const std::exception&) {
        // etcd out of reach: who leads is learnt on a later try
      }
      const std::string mine = election_ ? election_->guard().key : "";
      if (now && now->key != mine && now->term > led_term_)
        throw Deposed(detail::concat("another controller leads the job now (term ", now->term,
                                     "; this one led in term ", led_term_, ")"));
    }
    try {
      // A candidacy keeps its place in line across waits; one that ended (its lease lapsed
      // while etcd was out of reach) cannot lead again: a new one stands.
      if (!election_)
        election_ =
            std::make_unique<LeaderElection>(*client_, keys::state::leader_prefix(job_), ttl_);
      if (election_->campaign(leader_value_, kCampaignWait)) break;
    } catch (const LostLeadership&) {
      election_.reset();
    } catch (const std::exception& e) {
      if (Clock::now() > deadline)
        throw QuorumLost(detail::concat("etcd (", client_->endpoints().size(),
                                        " member(s)) took no write for ", quorum_timeout_.count(),
                                        " ms (detect.quorum_timeout_ms): ", e.what()));
    }
    if (Clock::now() > deadline)
      throw QuorumLost(detail::concat("the controller could not win the job's leadership within ",
                                      quorum_timeout_.count(), " ms (detect.quorum_timeout_ms)"));
    if (idle_) idle_();
    check_quorum_left();
    std::this_thread::sleep_for(kRetryPause);
  }
  led_term_ = election_->guard().create_revision;
}

void EtcdControlState::write(const std::string& key, const std::string& value) {
  write_all({{key, value}});
}

void EtcdControlState::write_all(const std::vector<std::pair<std::string, std::string>>& kvs) {
  const std::string& key = kvs.front().first;
  const auto deadline = Clock::now() + quorum_timeout_;
  bool said = false;
  while (true) {
    try {
      lead(deadline);
      election_->fenced_put_all(kvs);
      if (said) LOG(WARNING) << "etcd takes writes again";
      return;
    } catch (const QuorumLost&) {
      throw;
    } catch (const Deposed&) {
      throw;
    } catch (const LostLeadership& e) {
      // Refused by etcd: lead() campaigns again or finds the controller that took over.
      refused(e.what());
    } catch (const std::exception& e) {
      if (Clock::now() > deadline)
        throw QuorumLost(detail::concat("etcd took no write of ", key, " for ",
                                        quorum_timeout_.count(),
                                        " ms (detect.quorum_timeout_ms): ", e.what()));
      if (!said)
        LOG(WARNING) << "etcd does not take the write of " << key << " (" << e.what()
                     << "): decisions wait, training goes on";
      said = true;
    }
    if (idle_) idle_();
    check_quorum_left();
    std::this_thread::sleep_for(kRetryPause);
  }
}

void EtcdControlState::spec(const state::JobSpec& s) {
  write(keys::state::spec(job_), s.SerializeAsString());
}

void EtcdControlState::job_state(state::JobState js,
                                 const std::vector<std::pair<std::string, std::string>>& with) {
  js.set_term(term());
  std::vector<std::pair<std::string, std::string>> kvs = with;
  kvs.emplace_back(keys::state::job_state(job_), js.SerializeAsString());
  write_all(kvs);
}

std::optional<state::JobState> EtcdControlState::read_job_state() {
  const auto kv = client_->get(keys::state::job_state(job_));
  state::JobState js;
  if (!kv) return std::nullopt;
  KEEL_CHECK(js.ParseFromString(kv->value), "etcd: ", keys::state::job_state(job_),
             " holds no state::JobState");
  return js;
}

void EtcdControlState::etcd_members(const state::EtcdMembers& m) {
  write(keys::state::etcd_members(job_), m.SerializeAsString());
}

std::optional<state::EtcdMembers> EtcdControlState::etcd_members() {
  const auto kv = client_->get(keys::state::etcd_members(job_));
  state::EtcdMembers m;
  if (!kv || !m.ParseFromString(kv->value)) return std::nullopt;
  return m;
}

void EtcdControlState::incident(int64_t n, const report::Incident& inc) {
  const auto [key, value] = incident_entry(n, inc);
  write(key, value);
}

std::pair<std::string, std::string> EtcdControlState::incident_entry(
    int64_t n, const report::Incident& inc) const {
  return {keys::state::incident(job_, n), inc.SerializeAsString()};
}

std::optional<report::Incident> EtcdControlState::incident_record(int64_t n) {
  const auto kv = client_->get(keys::state::incident(job_, n));
  report::Incident inc;
  if (!kv || !inc.ParseFromString(kv->value)) return std::nullopt;
  return inc;
}

void EtcdControlState::update(const report::Update& u) {
  write(keys::state::update(job_, u.id()), u.SerializeAsString());
}

void EtcdControlState::end(const state::JobEnd& e) {
  write(keys::state::end(job_), e.SerializeAsString());
}

void EtcdControlState::command(int64_t n, const control::Envelope& request) {
  write(keys::state::command(job_, n), request.SerializeAsString());
}

std::optional<control::Envelope> EtcdControlState::command_record(int64_t n) {
  const auto kv = client_->get(keys::state::command(job_, n));
  control::Envelope e;
  if (!kv || !e.ParseFromString(kv->value)) return std::nullopt;
  return e;
}

}  // namespace keel
