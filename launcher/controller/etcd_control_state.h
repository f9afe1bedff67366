// The leader controller's writes of the job's control state to etcd (DESIGN.md, Control state
// and failover; keys in proto/store_keys.h, keys::state): the job spec, the Membership of
// every epoch, the incidents, the updates, the plugin in force and the numbered command log,
// each a protobuf message. Every write is a transaction fenced on the leadership
// (launcher/etcd/leader_election.h), so a controller that is no longer the leader writes
// nothing. Nothing here runs on the step path: writes come with an epoch transition, an
// update, a keel-ctl command.
//
// etcd unreachable or without quorum pauses the writer, never the training: a write is
// tried again (the controller's `idle` runs between tries, so the agents keep hearing from
// it) until detect.quorum_timeout_ms, then QuorumLost ends the job cleanly.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "launcher/etcd/etcd_client.h"
#include "launcher/etcd/leader_election.h"
#include "launcher/exit_codes.h"
#include "launcher/patient_store.h"
#include "proto/control.pb.h"
#include "proto/control_state.pb.h"
#include "proto/membership.pb.h"
#include "proto/report.pb.h"
#include "proto/store_values.pb.h"
#include "runtime/check.h"

namespace keel {

// This controller led, lost its lease (a pause, a partition, etcd without quorum), and another
// leads the job now: it must stop acting at once, leaving the job (its ranks, its agents) to
// the new leader. Never a reason to stop the job.
class Deposed : public Error {
 public:
  using Error::Error;
};

// A controller that was deposed exits with kExitDeposed (launcher/exit_codes.h).

class EtcdControlState {
 public:
  // Campaigns under the job's leader prefix as `leader` (waiting up to `quorum_timeout` for
  // the leadership) and keeps it with a lease of `ttl`. `idle` runs between the tries of a
  // write etcd did not take (the agents' messages answered). `client` must outlive this.
  // `campaign_timeout` (0: the quorum timeout) bounds the first campaign only: a candidate
  // waits in line as long as the job runs. `idle` may throw to give up waiting.
  EtcdControlState(EtcdClient* client, const std::string& job, const state::Leader& leader,
                   std::chrono::seconds ttl, std::chrono::milliseconds quorum_timeout,
                   std::function<void()> idle,
                   std::chrono::milliseconds campaign_timeout = std::chrono::milliseconds(0));
  ~EtcdControlState();

  void spec(const state::JobSpec& s);
  // The job's one record (state::JobState), whole, stamped with this leader's term, and
  // `with` (an incident's record, say) in the same fenced transaction: an epoch transition
  // writes its Membership, its Rebuild (before any rank is told, so that a leader that takes
  // over can tell them) and the decisions' memory at once.
  void job_state(state::JobState js,
                 const std::vector<std::pair<std::string, std::string>>& with = {});
  // The record as the newest leader wrote it; nullopt before the first leader's first write.
  std::optional<state::JobState> read_job_state();
  // The members keel keeps (launcher/controller/etcd_upkeep.h), and as last written.
  void etcd_members(const state::EtcdMembers& m);
  std::optional<state::EtcdMembers> etcd_members();
  void incident(int64_t n, const report::Incident& inc);
  // Incident n as a key and value for job_state's `with`.
  std::pair<std::string, std::string> incident_entry(int64_t n, const report::Incident& inc) const;
  // Incident n as written here, if it was.
  std::optional<report::Incident> incident_record(int64_t n);
  void update(const report::Update& u);
  // How the job ended (the last write of a job's leader).
  void end(const state::JobEnd& e);
  // Records keel-ctl request `n` in the command log (created once: a retry writes nothing
  // twice), before it is carried out.
  void command(int64_t n, const control::Envelope& request);
  // Command n as recorded, if it was.
  std::optional<control::Envelope> command_record(int64_t n);

  // At the job's end, once every agent was told: stops keeping the lease without a word to
  // etcd (whose members are stopping), leaving the key to lapse with it.
  void abandon();

  // Returns while this controller leads (campaigning again if its lease lapsed); throws
  // Deposed if another took over meanwhile, QuorumLost as a write does.
  void check_leading();
  // Whether this controller's leadership holds now (its lease refreshed in time), without
  // asking etcd: false once the lease lapsed, when check_leading() must come before any
  // decision.
  bool leads() const;
  // The guard every write of this leader carries (its key and term), for the ranks' store
  // fenced on it (etcd_store.h, EtcdStore::fence): empty while it does not lead.
  EtcdGuard guard() const;
  // etcd refused a fenced write of the ranks' store (`what` says which): the leadership is
  // over; check_leading() then campaigns again or throws Deposed. Logged once a refusal, and
  // counted.
  void refused(const std::string& what);
  // Fenced writes etcd refused so far (this controller's own and the store's).
  int64_t refusals() const { return refusals_; }
  // KV writes sent to etcd so far (to measure writes per recovery and per step).
  uint64_t writes() const { return client_->writes(); }
  // The leadership's term (its key's create revision).
  int64_t term() const;

  // `check` runs wherever this controller waits for etcd (beside `idle`, and in the ranks'
  // store of lead.cc's leaders_store through check_quorum_left): it throws QuorumLost when
  // waiting cannot help, the members left being too few for a quorum and the others known
  // dead (EtcdUpkeep::check_quorum), so that the job stops at once instead of after
  // detect.quorum_timeout_ms.
  void give_up_when(std::function<void()> check) { give_up_ = std::move(check); }
  void check_quorum_left() const {
    if (give_up_) give_up_();
  }

 private:
  // Writes key = value fenced on the leadership, trying again as the header says.
  void write(const std::string& key, const std::string& value);
  void write_all(const std::vector<std::pair<std::string, std::string>>& kvs);
  // Leads, campaigning anew if the lease lapsed (etcd was out of reach longer than it).
  void lead(std::chrono::steady_clock::time_point deadline);

  EtcdClient* client_;
  const std::string job_;
  const std::string leader_value_;
  const std::chrono::seconds ttl_;
  const std::chrono::milliseconds quorum_timeout_;
  std::unique_ptr<LeaderElection> election_;
  std::function<void()> idle_;
  std::function<void()> give_up_;  // give_up_when
  int64_t led_term_ = 0;           // the term this controller last led in (0: it never led)
  int64_t refusals_ = 0;
};

}  // namespace keel
