// The standby slots' upkeep in the agents' host (runs in the leader controller): each standby
// slot's workers check themselves (launcher/worker/standby.h) among the slot's own workers, so
// that no other machine's fault fails its check; a parked worker that ends is followed by a
// fresh check of its slot (its agent resets it, the slot registers and is checked anew), a few
// times in a row at most, and a slot that cannot be made ready says why in the event log.
#include <string>
#include <utility>

#include "launcher/controller/agent_host.h"
#include "launcher/job_env.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "runtime/logging.h"
#include "runtime/text.h"

namespace keel {
namespace {

// The most times in a row a standby slot is checked again after a parked worker ended
// without a check passing in between: a machine whose workers keep dying is not one to hand
// ranks to, and a loop of checks would only hide it.
constexpr int kStandbyRestarts = 3;

// How a parked worker ended, from the agent's event.
std::string ended_how(const control::Event& e) {
  return e.signal() ? detail::concat("killed by signal ", e.signal())
                    : detail::concat("exit code ", e.exit_code());
}

}  // namespace

void AgentHost::start_standby(int slot) {
  const int gen = members_->begin_standby_check(slot);
  const int per_slot = layout_.workers_per_slot;
  Agent& a = agents_[size_t(slot)];
  a.self_check.assign(size_t(per_slot), std::nullopt);
  a.standby_restarting = false;
  // The slot's workers check their all-reduce among themselves: a check among every standby
  // slot failed a healthy one when another's worker died in it, and retried nothing.
  const std::string group = detail::concat(keys::kStandbyCheckGroup, "/", slot, "/", gen);
  for (int i = 0; i < per_slot; ++i) {
    control::Envelope m = command(control::Command::spawn);
    control::Command* c = m.mutable_command();
    c->set_rank(-1 - i);  // a parked worker: no rank yet
    c->set_world(members_->world());
    for (const auto& arg : worker_argv_) c->add_args(arg);
    for (const auto& [k, v] : worker_env_) (*c->mutable_env())[k] = v;
    with_current_etcd(c->mutable_env());
    const std::pair<const char*, std::string> standby_env[] = {
        {env::kStandby, "1"},
        {env::kSlot, std::to_string(slot)},
        {env::kStandbyIndex, std::to_string(i)},
        {env::kStandbyGen, std::to_string(gen)},
        {env::kLocalWorldSize, std::to_string(per_slot)},
        {env::kStandbyGroup, group},
        {env::kStandbyGroupSize, std::to_string(per_slot)},
        {env::kStandbyGroupRank, std::to_string(i)}};
    for (const auto& [k, v] : standby_env) (*c->mutable_env())[k] = v;
    send(slot, m);
  }
}

void AgentHost::refresh() {
  if (!store_) return;  // no standby has started yet (set_store)
  for (int k = 0; k < members_->slot_count(); ++k) {
    Agent& a = agents_[size_t(k)];
    // A slot checked again (its worker ended) has only the old generation's results to read.
    if (members_->state(k) != membership::SlotInfo::standby || members_->ready(k) ||
        members_->check_failed(k) || a.standby_restarting)
      continue;
    const int gen = members_->standby_gen(k);
    bool all_ok = !a.self_check.empty(), failed = false;
    for (size_t i = 0; i < a.self_check.size(); ++i) {
      if (!a.self_check[i]) {
        if (auto c = try_get_message<store::StandbyCheck>(*store_,
                                                          keys::standby_ready_key(k, int(i), gen)))
          a.self_check[i] = c->ok();
      }
      all_ok = all_ok && a.self_check[i].value_or(false);
      failed = failed || (a.self_check[i] && !*a.self_check[i]);
    }
    if (all_ok) a.standby_restarts = 0;
    if (failed || all_ok) members_->standby_checked(k, gen, all_ok);
  }
}

void AgentHost::on_standby_exit(int slot, const control::Event& e) {
  if (members_->state(slot) != membership::SlotInfo::standby) return;  // promoted meanwhile
  Agent& a = agents_[size_t(slot)];
  if (a.standby_restarting) return;  // its other workers' ends: the slot is reset already
  const int index = -1 - e.rank(), gen = members_->standby_gen(slot);
  const std::string how = detail::concat("standby worker ", index, " of slot ", slot, " ended (",
                                         ended_how(e), "): ", e.last_lines());
  // Its own checks failed (GEMM, golden mini-GPT): the machine computes wrong, and a new
  // check would not change that.
  const auto check = store_ ? try_get_message<store::StandbyCheck>(
                                  *store_, keys::standby_ready_key(slot, index, gen))
                            : std::nullopt;
  std::string why_not;
  if (check && !check->ok() && !check->machine_ok())
    why_not = "its self-check failed: " + check->checks();
  else if (a.standby_restarts >= kStandbyRestarts)
    why_not = detail::concat("its workers ended ", a.standby_restarts + 1,
                             " times in a row before a check passed");
  if (!why_not.empty()) {
    members_->standby_checked(slot, gen, false);
    LOG(WARNING) << how << "; standby slot " << slot << " cannot be made ready: " << why_not;
    if (on_event_)
      on_event_("standby_unusable",
                EventFields().add("slot", slot).add("why", why_not).add("ended", how));
    return;
  }
  // Checked again from the start: its agent drops the slot's parked workers and registers
  // anew, which starts the next check generation (on_message, Register).
  a.standby_restarts += 1;
  a.standby_restarting = true;
  LOG(WARNING) << how << "; standby slot " << slot << " is checked again";
  if (on_event_)
    on_event_("standby_restart", EventFields()
                                     .add("slot", slot)
                                     .add("index", index)
                                     .add("restart", a.standby_restarts)
                                     .add("why", how));
  send(slot, command(control::Command::reset));
}

}  // namespace keel
