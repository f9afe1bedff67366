#include "launcher/controller_impl.h"

namespace keel {

// Silence alone cannot tell a dead machine from a cut network; an injected fault on the
// slot can.
void Controller::Impl::label_slot_loss(report::Incident* inc, int slot) {
  if (inc->kind() != "slot_loss" && inc->kind() != "comm_error") return;
  // The peers' communication errors were only the first sign of it.
  if (inc->kind() == "comm_error") inc->set_detail(detail::concat("slot ", slot, " lost"));
  inc->set_kind("slot_loss");
  inc->set_slot(slot);
  for (const InjectionRecord& in : FaultInjector::read_injections(*store))
    if ((in.kind == "partition" || in.kind == "slot_loss") && host->slot_of(in.rank) == slot &&
        in.time <= unix_now()) {
      inc->set_kind(in.kind);
      inc->set_rank(in.rank);
      inc->set_injected_at(in.time);
    }
  const double now = unix_now();
  std::fprintf(stderr, "%s: slot %d lost (%s)%s\n", o.program.c_str(), slot, inc->kind().c_str(),
               inc->injected_at() > 0
                   ? detail::concat(" ", now - inc->injected_at(), " s after the injection").c_str()
                   : "");
  event("slot_lost", detail::concat("{\"slot\": ", slot, ", \"kind\": \"", inc->kind(),
                                    "\", \"after_injection_s\": ",
                                    inc->injected_at() > 0 ? now - inc->injected_at() : -1.0, "}"));
}

// hot_swap: each lost or evicted slot's ranks move to a warm standby slot (recovery.evict
// widens what is evicted to the culprit's PP group or DP replica). Without a standby:
// recovery.on_no_standby.
bool Controller::Impl::swap_in_standbys(report::Incident* inc, std::set<int>* restart,
                                        std::map<int, std::pair<int64_t, int64_t>>* acks,
                                        std::set<int> lost) {
  const auto scope = o.cfg.recovery().evict();
  if (scope != config::RecoveryConfig::culprit && inc->rank() >= 0) {
    const int r = inc->rank();
    std::vector<int> group;
    if (scope == config::RecoveryConfig::pp_group) {
      group = topo.pp_group(r);
    } else {
      for (int q = 0; q < world; ++q)
        if (topo.coord(q).dp == topo.coord(r).dp) group.push_back(q);
    }
    for (int q : group) {
      const int slot = host->slot_of(q);
      if (slot <= 0 || lost.count(slot)) continue;  // slot 0 hosts the controller
      for (int x : host->ranks_on(slot)) {
        restart->insert(x);
        acks->erase(x);
      }
      host->evict(slot);
      lost.insert(slot);
    }
  }
  inc->set_evicted_at(unix_now());
  for (int slot : lost) {
    int sb = host->promote(slot);
    if (sb < 0 && o.cfg.recovery().on_no_standby() == config::RecoveryConfig::shrink_dp)
      return shrink_dp(inc, restart, acks, lost);
    while (sb < 0) {
      if (o.cfg.recovery().on_no_standby() == config::RecoveryConfig::fail) {
        std::fprintf(stderr,
                     "%s: slot %d is out and no standby is ready; recovery.on_no_standby = "
                     "fail: stopping the job\n",
                     o.program.c_str(), slot);
        event("stop_no_standby", detail::concat("{\"slot\": ", slot, "}"));
        return false;
      }
      // on_no_standby = wait: the slot itself may come back, or a standby become ready.
      if (state != "waiting")
        std::fprintf(stderr, "%s: slot %d is out and no standby is ready; waiting\n",
                     o.program.c_str(), slot);
      state = "waiting";
      if (stopping()) return false;
      pump();
      bool back = true;
      for (int r : host->ranks_on(slot)) back = back && host->can_spawn(r);
      if (back && !host->ranks_on(slot).empty()) break;
      sb = host->promote(slot);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (sb >= 0) {
      inc->add_slots_evicted(slot);
      inc->add_standbys_promoted(sb);
      std::fprintf(stderr, "%s: slot %d evicted; standby slot %d takes its ranks\n",
                   o.program.c_str(), slot, sb);
      event("promote", detail::concat("{\"evicted\": ", slot, ", \"standby\": ", sb, "}"));
    }
  }
  state = "recovering";
  return true;
}

// recovery.on_no_standby = shrink_dp: the DP replica that lost ranks is dropped and the
// job goes on with dp − 1 replicas, each running more micro-batches, so that every step
// still trains on the same global batch of samples (DESIGN.md, Data). Survivors keep their
// state (replicas are equal without ZeRO-1) and get new rank ids; the retired replica's
// other ranks are stopped and their slots become standbys, for growing back.
bool Controller::Impl::shrink_dp(report::Incident* inc, std::set<int>* restart,
                                 std::map<int, std::pair<int64_t, int64_t>>* acks,
                                 const std::set<int>& lost) {
  std::set<int> replicas;
  for (int slot : lost)
    for (int r : host->ranks_on(slot)) replicas.insert(topo.coord(r).dp);
  for (int r : *restart) replicas.insert(topo.coord(r).dp);
  const int B = o.cfg.train().micro_batch_size(), G = o.cfg.train().global_batch_size();
  std::string why;
  if (replicas.size() != 1) why = "the lost ranks span several data-parallel replicas";
  if (topo.dp() <= 1) why = "there is a single data-parallel replica left";
  if (why.empty() && G % (B * (topo.dp() - 1)) != 0)
    why = detail::concat("train.global_batch_size ", G, " does not split into micro-batches of ", B,
                         " over ", topo.dp() - 1, " replicas");
  if (!why.empty()) {
    std::fprintf(stderr,
                 "%s: no standby is ready and data parallelism cannot shrink: %s; "
                 "stopping the job\n",
                 o.program.c_str(), why.c_str());
    return false;
  }
  const int d = *replicas.begin();
  const Topology next(topo.tp(), topo.pp(), topo.dp() - 1);
  // The step to restore, while the snapshots still carry the old ids.
  forced_S = restore_step(*acks);
  std::map<int, int> renamed;
  std::map<int, std::pair<int64_t, int64_t>> kept;
  std::set<int> retired_slots;
  for (int r = 0; r < world; ++r) {
    Coord c = topo.coord(r);
    if (c.dp == d) {
      if (!restart->count(r)) host->kill(r);  // a healthy rank of the dropped replica
      if (host->slot_of(r) >= 0) retired_slots.insert(host->slot_of(r));
      continue;
    }
    if (c.dp > d) --c.dp;
    renamed[r] = next.rank(c);
    auto a = acks->find(r);
    if (a != acks->end()) kept[renamed[r]] = a->second;
  }
  for (const auto& [o_rank, n] : renamed)
    store->set(detail::concat("layout/", epoch + 1, "/", o_rank), std::to_string(n));
  store->set(detail::concat("layout/", epoch + 1), std::to_string(next.dp()));
  host->renumber(renamed, next.world_size());
  // Slots left without ranks check themselves and wait as standbys, to grow back on.
  for (int slot : retired_slots)
    if (!lost.count(slot)) host->evict(slot);
  std::fprintf(stderr,
               "%s: no standby is ready: data parallelism shrinks from %d to %d replicas "
               "(replica %d dropped); %d micro-batch(es) of %d per replica now\n",
               o.program.c_str(), topo.dp(), next.dp(), d, G / (B * next.dp()), B);
  event("shrink_dp", detail::concat("{\"dp\": ", next.dp(), ", \"dropped_replica\": ", d, "}"));
  inc->set_action(
      detail::concat("shrink data parallelism to ", next.dp(), " (replica ", d, " dropped)"));
  topo = next;
  world = next.world_size();
  *acks = std::move(kept);
  restart->clear();
  shrink_action = inc->action();
  return true;
}

// After a shrink: once enough standby slots are ready for a whole replica, the job moves
// to an epoch with one replica more. The new ranks receive the state from their DP
// group's first rank; every rank goes on from the step they all hold.
void Controller::Impl::maybe_grow() {
  if (o.cfg.recovery().on_no_standby() != config::RecoveryConfig::shrink_dp ||
      topo.dp() >= o.cfg.parallel().dp())
    return;
  const int per_replica = topo.tp() * topo.pp();
  if (host->standby_capacity() < per_replica) return;
  const Topology next(topo.tp(), topo.pp(), topo.dp() + 1);
  std::vector<int> fresh;
  std::map<int, int> renamed;
  for (int r = 0; r < world; ++r) renamed[r] = next.rank(topo.coord(r));
  for (int r = 0; r < next.world_size(); ++r)
    if (next.coord(r).dp == topo.dp()) fresh.push_back(r);
  if (int(fresh.size()) != per_replica) return;
  // Enough ready standbys? place() answers without changing anything when not.
  const int next_epoch = epoch + 1;
  std::map<int, std::pair<int64_t, int64_t>> acks;
  store->set(recovery::abort_key(next_epoch), "grow data parallelism");
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(o.cfg.recovery().abort_timeout_ms());
  while (int(acks.size()) < world && Clock::now() < deadline) {
    pump();
    for (int r = 0; r < world; ++r) {
      if (acks.count(r)) continue;
      try {
        std::string v = store->get(recovery::ack_key(next_epoch, r), std::chrono::milliseconds(1));
        long long done = 0, in_flight = 0;
        std::sscanf(v.c_str(), "%lld %lld", &done, &in_flight);
        acks[r] = {done, in_flight};
      } catch (const CommTimeout&) {
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (int(acks.size()) < world) {
    std::fprintf(stderr, "%s: growing back: not every rank answered; trying again later\n",
                 o.program.c_str());
  }
  const int64_t S = restore_step(acks);
  std::map<int, std::pair<int64_t, int64_t>> renamed_acks;
  for (const auto& [o_rank, n] : renamed) {
    store->set(detail::concat("layout/", next_epoch, "/", o_rank), std::to_string(n));
  }
  store->set(detail::concat("layout/", next_epoch), std::to_string(next.dp()));
  store->set(detail::concat("layout/", next_epoch, "/grow"), "1");
  host->renumber(renamed, next.world_size());
  topo = next;
  world = next.world_size();
  epoch = next_epoch;
  if (!host->place(fresh)) {
    std::fprintf(stderr, "%s: growing back: the standbys went away\n", o.program.c_str());
  }
  for (int r : fresh) spawn(r, /*restarted=*/true);
  store->set(recovery::rebuild_key(next_epoch), std::to_string(S));
  std::fprintf(stderr, "%s: data parallelism grows back to %d replicas (epoch %d, step %lld)\n",
               o.program.c_str(), topo.dp(), epoch, static_cast<long long>(S));
  event("grow_dp", detail::concat("{\"dp\": ", topo.dp(), ", \"epoch\": ", epoch, "}"));
  progress.clear();
  epoch_start_step = std::max<int64_t>(0, S);
  last_min_step = -1;
  last_advance = Clock::now();
}

// A lost slot takes its ranks and the snapshots it held. detect.on_slot_loss = fail ends
// the job naming the slot and the newest step every rank can still restore; wait parks
// the job until the slot is back.
bool Controller::Impl::wait_for_slots(report::Incident* inc, const std::set<int>& restart,
                                      const std::map<int, std::pair<int64_t, int64_t>>& acks,
                                      const std::set<int>& lost) {
  std::string slots;
  for (int s : lost) slots += (slots.empty() ? "" : ", ") + std::to_string(s);
  if (o.cfg.detect().on_slot_loss() == config::DetectConfig::fail) {
    const int64_t S = restore_step(acks);
    std::fprintf(stderr,
                 "%s: slot %s lost (%s); detect.on_slot_loss = fail: stopping the job. The "
                 "newest step every rank can restore is %s.\n",
                 o.program.c_str(), slots.c_str(), inc->detail().c_str(),
                 S < 0 ? "none (the job's start)" : std::to_string(S).c_str());
    event("stop_on_slot_loss",
          "{\"slots\": \"" + slots + "\", \"restorable_step\": " + std::to_string(S) + "}");
    return false;
  }
  state = "waiting";
  std::fprintf(stderr, "%s: slot %s lost; waiting for it to rejoin (detect.on_slot_loss = wait)\n",
               o.program.c_str(), slots.c_str());
  event("wait_for_slot", "{\"slots\": \"" + slots + "\"}");
  while (true) {
    if (stopping()) return false;
    pump();
    bool ready = true;
    for (int r : restart) ready = ready && host->can_spawn(r);
    if (ready) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::fprintf(stderr, "%s: slot %s is back\n", o.program.c_str(), slots.c_str());
  event("slot_rejoined", "{\"slots\": \"" + slots + "\"}");
  state = "recovering";
  return true;
}

}  // namespace keel
