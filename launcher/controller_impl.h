// The controller's state and decisions (launcher/controller.h), shared by controller.cc
// (the loop, detection, recovery in place and restart_all) and controller_slots.cc (what
// follows a lost slot: waiting, hot swap onto standbys, shrinking and growing data
// parallelism). Private to launcher/.
#pragma once

#include "launcher/controller.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "ckpt/persistent_checkpoint.h"
#include "launcher/control_plane.h"
#include "launcher/recovery_protocol.h"
#include "robust/fault_injector.h"
#include "robust/fault_spec.h"
#include "runtime/check.h"

namespace keel {

using Clock = std::chrono::steady_clock;
using recovery::unix_now;

struct Controller::Impl {
  ControllerOptions o;
  RankHost* host;
  std::shared_ptr<Store> store;
  ControlServer* server;
  Topology topo;  // the layout now: data parallelism may have shrunk (recovery.on_no_standby)
  int world;
  int64_t forced_S = -3;  // a shrink chose the restore step before renumbering the ranks
  std::string shrink_action;
  int epoch = 0;
  int incidents = 0;
  int64_t progress_at_last_incident = -2;
  int no_progress_incidents = 0;
  std::string state = "starting";
  std::function<void(const std::string&, const control::Envelope&)> on_agent;
  // Progress as the ranks last reported it, and when the slowest rank last advanced.
  std::map<int, std::pair<control::WorkerProgress, Clock::time_point>> progress;
  int64_t epoch_start_step = 0;
  int64_t last_min_step = -1;
  Clock::time_point last_advance = Clock::now();

  Impl(ControllerOptions opts, RankHost* h, std::shared_ptr<Store> s, ControlServer* srv)
      : o(std::move(opts)),
        host(h),
        store(std::move(s)),
        server(srv),
        topo(o.cfg.parallel().tp(), o.cfg.parallel().pp(), o.cfg.parallel().dp()),
        world(topo.world_size()) {}

  void event(const std::string& kind, const std::string& json) {
    if (o.on_event) o.on_event(kind, json);
  }

  std::map<std::string, std::string> rank_env(int rank, bool restarted) const {
    char start[32];
    std::snprintf(start, sizeof(start), "%.6f", o.job_start);
    std::map<std::string, std::string> env = {
        {"KEEL_RANK", std::to_string(rank)},
        {"KEEL_WORLD_SIZE", std::to_string(world)},
        {"KEEL_STORE_ADDR", o.store_addr},
        {"KEEL_JOB_ID", o.job},
        {"KEEL_SUPERVISED", "1"},
        {"KEEL_EPOCH", std::to_string(epoch)},
        {"KEEL_RESTARTED", restarted ? "1" : "0"},
        {"KEEL_JOB_START", start},
    };
    if (!o.controller_endpoint.empty()) env["KEEL_CONTROLLER"] = o.controller_endpoint;
    if (topo.dp() != o.cfg.parallel().dp()) env["KEEL_DP"] = std::to_string(topo.dp());
    if (epoch > 0 && o.cfg.recovery().mode() == config::RecoveryConfig::restart_all &&
        o.cfg.checkpoint().persistent_every_steps() > 0)
      env["KEEL_RESUME_LATEST"] = o.cfg.checkpoint().dir();
    // Ranks share cores: OpenMP threads that spin while waiting steal them from the rank
    // that has work (measured: a step 5-7x slower at load 9).
    if (world > 1) env["OMP_WAIT_POLICY"] = "PASSIVE";
    return env;
  }

  void spawn(int rank, bool restarted) { host->spawn(rank, rank_env(rank, restarted)); }

  bool stopping() const { return o.stop_signal && *o.stop_signal; }

  // Handles what arrived on the control plane: progress, keel-ctl, and the agents' messages.
  void pump() {
    if (!server) return;
    while (auto in = server->poll(std::chrono::milliseconds(0))) {
      const control::Envelope& m = in->msg;
      if (m.has_progress()) {
        if (m.epoch() != epoch) continue;  // a report of an older epoch: stale
        const control::WorkerProgress& p = m.progress();
        if (o.console_progress && p.rank() == 0) print_progress(p);
        progress[p.rank()] = {p, Clock::now()};
      } else if (m.has_status_request()) {
        control::Envelope r = make_envelope(epoch);
        status(r.mutable_status_reply());
        server->send(in->identity, r);
      } else if (m.has_inject_request()) {
        control::Envelope r = make_envelope(epoch);
        inject(m.inject_request().fault(), r.mutable_inject_reply());
        server->send(in->identity, r);
      } else if (on_agent) {
        on_agent(in->identity, m);
      }
    }
  }

  int64_t last_printed = -1;
  void print_progress(const control::WorkerProgress& p) {
    const int every = std::max(1, o.cfg.train().log_every());
    if (p.step() == last_printed || p.step() <= 0 ||
        (p.step() % every != 0 && p.step() != o.cfg.train().steps()))
      return;
    last_printed = p.step();
    const double tokens =
        double(o.cfg.train().global_batch_size()) * double(o.cfg.model().seq_len());
    std::printf(
        "step %5lld/%d | loss %.6f | %8.0f tok/s | compute %3.0f%% comm %3.0f%% | epoch %d\n",
        static_cast<long long>(p.step()), o.cfg.train().steps(), p.loss(),
        p.step_s() > 0 ? tokens / p.step_s() : 0.0,
        p.step_s() > 0 ? 100 * p.compute_s() / p.step_s() : 0.0,
        p.step_s() > 0 ? 100 * p.comm_s() / p.step_s() : 0.0, epoch);
    std::fflush(stdout);
  }

  void status(control::StatusReply* r) const {
    r->set_epoch(epoch);
    r->set_state(state);
    r->set_incidents(incidents);
    int64_t step = -1;
    double loss = 0;
    for (const auto& [rank, p] : progress) {
      control::RankStatus* rs = r->add_ranks();
      rs->set_rank(rank);
      rs->set_slot(p.first.slot());
      rs->set_pid(p.first.pid());
      rs->set_step(p.first.step());
      rs->set_in_collective(p.first.in_collective());
      if (step < 0 || p.first.step() < step) step = p.first.step(), loss = p.first.loss();
    }
    r->set_step(std::max<int64_t>(step, 0));
    r->set_loss(loss);
    try {
      r->set_tokens_per_s(std::stod(store->get("live/tokens_per_s", std::chrono::milliseconds(1))));
      r->set_mfu(std::stod(store->get("live/mfu", std::chrono::milliseconds(1))));
      r->set_ettr(std::stod(store->get("live/ettr", std::chrono::milliseconds(1))));
    } catch (const std::exception&) {
    }
    host->fill_status(r);
  }

  // keel-ctl inject: the fault joins the ranks' schedules through the store.
  void inject(const std::string& fault, control::InjectReply* r) {
    try {
      FaultPlan plan;
      add_fault_flag(&plan, fault);
      validate_fault_plan(plan, world, o.cfg.train().steps());
      const faults::Fault& f = plan.schedule.fault(0);
      if ((f.kind() == faults::Fault::slot_loss || f.kind() == faults::Fault::partition) &&
          host->slot_of(f.rank()) <= 0)
        throw InputError(fault + ": rank " + std::to_string(f.rank()) +
                         (host->slot_of(f.rank()) < 0 ? " has no slot (keel-launch runs slots)"
                                                      : " is on slot 0, which hosts the controller "
                                                        "and cannot be lost yet"));
      const int64_t n = store->add("runtime_faults/count", 1) - 1;
      store->set("runtime_faults/" + std::to_string(n), fault);
      r->set_ok(true);
      r->set_message("injected " + fault);
      event("inject_request", "{\"fault\": \"" + fault + "\"}");
    } catch (const std::exception& e) {
      r->set_ok(false);
      r->set_message(e.what());
    }
  }

  int run() {
    for (int r = 0; r < world; ++r) spawn(r, /*restarted=*/false);
    state = "training";
    event("start", "{\"world\": " + std::to_string(world) + "}");
    auto next_error_poll = Clock::now(), next_grow_check = Clock::now();
    int finished = 0;
    while (true) {
      if (stopping()) {
        std::fprintf(stderr, "%s: %s: stopping every rank\n", o.program.c_str(),
                     strsignal(*o.stop_signal));
        host->stop_all(SIGTERM, std::chrono::seconds(5));
        return 128 + *o.stop_signal;
      }
      pump();
      if (auto ex = host->poll_exit()) {
        if (ex->clean()) {
          if (++finished == world) return 0;
          continue;
        }
        if (finished > 0 || ex->fatal()) return stop_job(*ex);
        report::Incident inc = new_incident(*ex);
        if (!handle(&inc, {ex->rank}, ex->slot_lost ? ex->slot : -1)) return stop_job(*ex);
        continue;
      }
      if (Clock::now() >= next_error_poll) {
        next_error_poll = Clock::now() + std::chrono::milliseconds(20);
        if (store->add(recovery::errors_key(epoch), 0) > 0) {
          report::Incident inc;
          inc.set_detected_at(unix_now());
          inc.set_rank(-1);
          inc.set_slot(-1);
          inc.set_kind("comm_error");
          inc.set_detail("a communication error");
          if (!handle(&inc, {}, -1)) return 1;
          continue;
        }
      }
      if (Clock::now() >= next_grow_check) {
        next_grow_check = Clock::now() + std::chrono::milliseconds(200);
        maybe_grow();
      }
      if (int culprit = hung_rank(); culprit >= 0) {
        report::Incident inc;
        inc.set_detected_at(unix_now());
        inc.set_rank(culprit);
        inc.set_slot(host->slot_of(culprit));
        inc.set_kind("hang");
        inc.set_detail(detail::concat("rank ", culprit,
                                      " made no progress and is not inside a collective while "
                                      "the others wait for it"));
        const int slot = host->slot_of(culprit);
        if (o.cfg.recovery().mode() == config::RecoveryConfig::hot_swap && slot > 0) {
          // A hung machine is not trusted again until it has checked itself: evicted.
          std::vector<int> on = host->ranks_on(slot);
          host->evict(slot);
          if (!handle(&inc, std::set<int>(on.begin(), on.end()), slot)) return 1;
        } else {
          host->kill(culprit);
          if (!handle(&inc, {culprit}, -1)) return 1;
        }
        continue;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  // Silence alone cannot tell a dead machine from a cut network; an injected fault on the
  // slot can.
  void label_slot_loss(report::Incident* inc, int slot);

  report::Incident new_incident(const RankExit& ex) {
    report::Incident inc;
    inc.set_detected_at(unix_now());
    inc.set_rank(ex.rank);
    inc.set_slot(host->slot_of(ex.rank));
    inc.set_kind(ex.slot_lost ? "slot_loss" : WIFSIGNALED(ex.status) ? "crash" : "exit");
    inc.set_detail(detail::concat("rank ", ex.rank, " ", ex.describe()));
    if (ex.slot_lost) label_slot_loss(&inc, ex.slot);
    return inc;
  }

  // The newest stalled rank that is not waiting in a collective while others are, once the
  // job's slowest rank has not advanced for 2 typical steps + detect.hang_grace_ms.
  int hung_rank() {
    const int grace = o.cfg.detect().hang_grace_ms();
    if (!server || grace <= 0 || int(progress.size()) < world) return -1;
    int64_t min_step = INT64_MAX;
    std::vector<double> step_s;
    for (const auto& [r, p] : progress) {
      min_step = std::min(min_step, p.first.step());
      if (p.first.step_s() > 0) step_s.push_back(p.first.step_s());
    }
    if (min_step <= epoch_start_step) return -1;  // wait for a first step in this epoch
    // After the last step, rank 0 gathers the weights and writes the report while the others
    // wait for it in a barrier: that is the end of the job, not a hang.
    if (min_step >= o.cfg.train().steps()) return -1;
    const auto now = Clock::now();
    if (min_step != last_min_step) {
      last_min_step = min_step;
      last_advance = now;
      return -1;
    }
    std::sort(step_s.begin(), step_s.end());
    const double typical = step_s.empty() ? 0 : step_s[step_s.size() / 2];
    const double stalled = std::chrono::duration<double>(now - last_advance).count();
    if (stalled < 2 * typical + grace / 1000.0) return -1;
    std::vector<int> waiting, idle;
    for (const auto& [r, p] : progress) {
      if (std::chrono::duration<double>(now - p.second).count() > 1.0) continue;  // stale
      (p.first.in_collective() ? waiting : idle).push_back(r);
    }
    if (waiting.empty() || idle.size() != 1) return -1;  // no single clear culprit
    return idle[0];
  }

  // Moves the job to the next epoch after a failure of `dead` ranks (their exits already
  // seen; lost_slot >= 0 when a whole slot went). Returns false when the job must stop.
  bool handle(report::Incident* inc, std::set<int> dead, int lost_slot) {
    event("detected",
          "{\"kind\": \"" + inc->kind() + "\", \"rank\": " + std::to_string(inc->rank()) + "}");
    if (++incidents > o.cfg.recovery().max_incidents()) {
      std::fprintf(stderr,
                   "%s: %d incidents, more than recovery.max_incidents = %d; stopping the job "
                   "(last: %s)\n",
                   o.program.c_str(), incidents, o.cfg.recovery().max_incidents(),
                   inc->detail().c_str());
      return false;
    }
    // A failure that comes back before the job completed a single step since the last one
    // will not go away by restarting (every rank failing to connect, say): stop.
    int64_t progress_now = -1;
    try {
      progress_now = std::stoll(store->get("progress", std::chrono::milliseconds(1)));
    } catch (const std::exception&) {
    }
    no_progress_incidents =
        progress_now == progress_at_last_incident ? no_progress_incidents + 1 : 0;
    progress_at_last_incident = progress_now;
    if (no_progress_incidents >= 2) {
      std::fprintf(stderr,
                   "%s: %s; the job completed no step since the last %d recoveries, so this "
                   "failure repeats: stopping the job\n",
                   o.program.c_str(), inc->detail().c_str(), no_progress_incidents);
      return false;
    }
    state = "recovering";
    bool ok = o.cfg.recovery().mode() == config::RecoveryConfig::restart_all
                  ? restart_all(inc)
                  : restart_in_place(inc, std::move(dead), lost_slot);
    if (!ok) return false;
    const int64_t n = store->add(recovery::kIncidentCount, 1) - 1;
    store->set(recovery::incident_key(n), inc->SerializeAsString());
    std::fprintf(stderr, "%s: incident %lld: %s at step %d; %s (epoch %d, restored step %d)\n",
                 o.program.c_str(), static_cast<long long>(n + 1), inc->detail().c_str(),
                 inc->step() + 1, inc->action().c_str(), epoch, inc->restored_step());
    event("recovered", "{\"kind\": \"" + inc->kind() + "\", \"epoch\": " + std::to_string(epoch) +
                           ", \"restored_step\": " + std::to_string(inc->restored_step()) +
                           ", \"action\": \"" + inc->action() + "\"}");
    progress.clear();
    epoch_start_step = std::max(0, inc->restored_step());
    last_min_step = -1;
    last_advance = Clock::now();
    state = "training";
    return true;
  }

  bool restart_in_place(report::Incident* inc, std::set<int> restart, int lost_slot) {
    const int next = epoch + 1;
    store->set(recovery::abort_key(next), inc->detail());
    event("abort", "{\"epoch\": " + std::to_string(next) + "}");
    // Every other rank aborts its communicators and acknowledges; one that does not within
    // recovery.abort_timeout_ms is hung (its own thread cannot be interrupted) and is killed.
    std::map<int, std::pair<int64_t, int64_t>> acks;  // rank -> (steps completed, in flight)
    std::set<int> lost_slots;
    if (lost_slot >= 0) lost_slots.insert(lost_slot);
    const auto deadline =
        Clock::now() + std::chrono::milliseconds(o.cfg.recovery().abort_timeout_ms());
    while (true) {
      pump();
      while (auto ex = host->poll_exit()) {
        restart.insert(ex->rank);
        // A peer's communication error was seen before this exit: the exit names the culprit.
        if (inc->kind() == "comm_error" && !ex->slot_lost && !ex->clean()) {
          inc->set_rank(ex->rank);
          inc->set_slot(host->slot_of(ex->rank));
          inc->set_kind(WIFSIGNALED(ex->status) ? "crash" : "exit");
        }
        if (ex->slot_lost && !lost_slots.count(ex->slot)) label_slot_loss(inc, ex->slot);
        if (ex->slot_lost) lost_slots.insert(ex->slot);
        inc->set_detail(inc->detail() + detail::concat("; rank ", ex->rank, " ", ex->describe()));
      }
      bool all = true;
      for (int r = 0; r < world; ++r) {
        if (restart.count(r) || acks.count(r)) continue;
        try {
          std::string v = store->get(recovery::ack_key(next, r), std::chrono::milliseconds(1));
          long long done = 0, in_flight = 0;
          std::sscanf(v.c_str(), "%lld %lld", &done, &in_flight);
          acks[r] = {done, in_flight};
        } catch (const CommTimeout&) {
          all = false;
        }
      }
      if (all) break;
      if (Clock::now() > deadline) {
        for (int r = 0; r < world; ++r) {
          if (restart.count(r) || acks.count(r)) continue;
          host->kill(r);
          restart.insert(r);
          if (inc->rank() < 0 || inc->kind() == "comm_error") {
            inc->set_rank(r);
            inc->set_slot(host->slot_of(r));
            inc->set_kind("hang");
          }
          inc->set_detail(inc->detail() + detail::concat("; rank ", r,
                                                         " did not answer the abort within ",
                                                         o.cfg.recovery().abort_timeout_ms(),
                                                         " ms (hung): killed"));
        }
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (!lost_slots.empty()) {
      if (o.cfg.recovery().mode() == config::RecoveryConfig::hot_swap) {
        if (!swap_in_standbys(inc, &restart, &acks, lost_slots)) return false;
      } else if (!wait_for_slots(inc, restart, acks, lost_slots)) {
        return false;
      }
    }
    epoch = next;
    inc->set_epoch(next);
    for (int r : restart) spawn(r, /*restarted=*/true);
    int64_t in_flight = 0, completed = 0;
    for (const auto& [r, a] : acks) {
      in_flight = std::max(in_flight, a.second);
      completed = std::max(completed, a.first);
    }
    const int64_t S = forced_S >= -1 ? forced_S : restore_step(acks);
    forced_S = -3;
    store->set(recovery::rebuild_key(next), std::to_string(S));
    inc->set_rebuilt_at(unix_now());
    event("rebuild",
          "{\"epoch\": " + std::to_string(next) + ", \"restore_step\": " + std::to_string(S) + "}");
    inc->set_step(int(in_flight));
    inc->set_restored_step(int(S));
    inc->set_steps_lost(int(std::max<int64_t>(0, completed - std::max<int64_t>(S, 0))));
    std::string who;
    for (int r : restart) who += (who.empty() ? "" : ", ") + std::to_string(r);
    inc->set_action(restart.empty()
                        ? "reattempt in place (no culprit)"
                        : "restart rank" + std::string(restart.size() > 1 ? "s " : " ") + who +
                              " in place");
    if (!shrink_action.empty()) inc->set_action(shrink_action);
    shrink_action.clear();
    if (inc->standbys_promoted_size() > 0) {
      std::string ev, sb;
      for (int k : inc->slots_evicted()) ev += (ev.empty() ? "" : ", ") + std::to_string(k);
      for (int k : inc->standbys_promoted()) sb += (sb.empty() ? "" : ", ") + std::to_string(k);
      inc->set_action("evict slot " + ev + "; standby slot " + sb + " takes rank" +
                      std::string(restart.size() > 1 ? "s " : " ") + who);
    }
    return true;
  }

  // hot_swap: each lost or evicted slot's ranks move to a warm standby slot (recovery.evict
  // widens what is evicted to the culprit's PP group or DP replica). Without a standby:
  // recovery.on_no_standby.
  bool swap_in_standbys(report::Incident* inc, std::set<int>* restart,
                        std::map<int, std::pair<int64_t, int64_t>>* acks, std::set<int> lost);

  // recovery.on_no_standby = shrink_dp: the DP replica that lost ranks is dropped and the
  // job goes on with dp − 1 replicas, each running more micro-batches, so that every step
  // still trains on the same global batch of samples (DESIGN.md, Data). Survivors keep their
  // state (replicas are equal without ZeRO-1) and get new rank ids; the retired replica's
  // other ranks are stopped and their slots become standbys, for growing back.
  bool shrink_dp(report::Incident* inc, std::set<int>* restart,
                 std::map<int, std::pair<int64_t, int64_t>>* acks, const std::set<int>& lost);

  // After a shrink: once enough standby slots are ready for a whole replica, the job moves
  // to an epoch with one replica more. The new ranks receive the state from their DP
  // group's first rank; every rank goes on from the step they all hold.
  void maybe_grow();

  // A lost slot takes its ranks and the snapshots it held. detect.on_slot_loss = fail ends
  // the job naming the slot and the newest step every rank can still restore; wait parks
  // the job until the slot is back.
  bool wait_for_slots(report::Incident* inc, const std::set<int>& restart,
                      const std::map<int, std::pair<int64_t, int64_t>>& acks,
                      const std::set<int>& lost);

  // The newest step that every rank can restore: from its own snapshot, from its backup
  // holder's copy, or (a survivor) from its memory. -1 when there is none: the job's start.
  int64_t restore_step(const std::map<int, std::pair<int64_t, int64_t>>& acks) {
    std::map<int, std::set<int64_t>> have = host->survey(topo);
    for (const auto& [r, a] : acks) have[r].insert(a.first);
    std::set<int64_t> common;
    for (int r = 0; r < world; ++r) {
      const std::set<int64_t>& h = have[r];
      if (r == 0) {
        common = h;
        continue;
      }
      std::set<int64_t> both;
      std::set_intersection(common.begin(), common.end(), h.begin(), h.end(),
                            std::inserter(both, both.begin()));
      common.swap(both);
    }
    return common.empty() ? -1 : *common.rbegin();
  }

  bool restart_all(report::Incident* inc) {
    host->stop_all(SIGKILL, std::chrono::milliseconds(0));
    int64_t progress_step = 0;
    try {
      progress_step = std::stoll(store->get("progress", std::chrono::milliseconds(1)));
    } catch (const CommTimeout&) {
    }
    int64_t S = 0;
    const auto& ck = o.cfg.checkpoint();
    if (ck.persistent_every_steps() > 0) {
      CheckpointLayout l;
      l.tp = topo.tp();
      l.pp = topo.pp();
      l.dp = topo.dp();
      l.zero1 = o.cfg.parallel().zero1();
      try {
        S = find_resume_point(ck.dir(), l).step;
      } catch (const InputError&) {
        S = 0;
      }
    }
    ++epoch;
    inc->set_epoch(epoch);
    for (int r = 0; r < world; ++r) spawn(r, /*restarted=*/false);
    inc->set_step(int(progress_step));
    inc->set_restored_step(int(S));
    inc->set_steps_lost(int(std::max<int64_t>(0, progress_step - S)));
    inc->set_action(S > 0 ? detail::concat("restart all ranks from the checkpoint of step ", S)
                          : "restart all ranks from the start");
    return true;
  }

  int stop_job(const RankExit& ex) {
    std::fprintf(stderr, "%s: rank %d %s; stopping the job\n", o.program.c_str(), ex.rank,
                 ex.describe().c_str());
    if (!ex.detail.empty() && !ex.slot_lost)
      std::fprintf(stderr, "%s: rank %d's last lines:\n%s\n", o.program.c_str(), ex.rank,
                   ex.detail.c_str());
    event("stop", "{\"rank\": " + std::to_string(ex.rank) +
                      ", \"code\": " + std::to_string(ex.code()) + "}");
    host->stop_all(SIGTERM, std::chrono::seconds(5));
    return ex.code();
  }
};

}  // namespace keel
