#include "launcher/controller/controller.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>

#include "launcher/controller/controller_impl.h"
#include "launcher/controller/stack_report.h"
#include "robust/fault_injector.h"
#include "robust/fault_spec.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {

Controller::Impl::Impl(ControllerOptions opts, RankHost* h, std::shared_ptr<Store> s,
                       ControlServer* srv)
    : o(std::move(opts)),
      host(h),
      store(std::move(s)),
      server(srv),
      topo(o.cfg.parallel().tp(), o.cfg.parallel().pp(), o.cfg.parallel().dp()),
      world(topo.world_size()),
      slow_detector(o.cfg.detect()) {
  update_membership();
}

void Controller::Impl::event(const std::string& kind, const EventFields& fields) {
  if (o.on_event) o.on_event(kind, fields);
}

std::map<std::string, std::string> Controller::Impl::rank_env(int rank, bool restarted) const {
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
      {"KEEL_LINEAGE", o.lineage},
  };
  if (!o.controller_endpoint.empty()) env["KEEL_CONTROLLER"] = o.controller_endpoint;
  if (topo.dp() != o.cfg.parallel().dp()) env["KEEL_DP"] = std::to_string(topo.dp());
  // Ranks share cores: OpenMP threads that spin while waiting steal them from the rank
  // that has work (measured: a step 5-7x slower at load 9).
  if (world > 1) env["OMP_WAIT_POLICY"] = "PASSIVE";
  return env;
}

// Handles what arrived on the control plane: progress, keel-ctl, and the agents' messages.
void Controller::Impl::pump() {
  if (!server) return;
  while (auto in = server->poll(std::chrono::milliseconds(0))) {
    const control::Envelope& m = in->msg;
    if (m.has_progress()) {
      if (m.epoch() != epoch) continue;  // a report of an older epoch: stale
      const control::WorkerProgress& p = m.progress();
      if (p.rank() < 0 || p.rank() >= world || finished.count(p.rank())) continue;
      if (o.console_progress && p.rank() == 0) print_progress(p);
      if (p.has_round()) on_round(p.rank(), p.round());
      progress[p.rank()] = {p, Clock::now()};
    } else if (m.has_status_request()) {
      control::Envelope r = make_envelope(epoch);
      status(r.mutable_status_reply());
      server->send(in->identity, r);
    } else if (m.has_inject_request()) {
      control::Envelope r = make_envelope(epoch);
      inject(m.inject_request().fault(), r.mutable_inject_reply());
      server->send(in->identity, r);
    } else if (m.has_stacks_request()) {
      stacks_requests.emplace_back(in->identity, m.stacks_request().name());
    } else if (m.has_update_request()) {
      control::Envelope r = make_envelope(epoch);
      request_update(m.update_request(), r.mutable_update_reply());
      server->send(in->identity, r);
    } else if (m.has_replay_request()) {
      control::Envelope r = make_envelope(epoch);
      control::ReplayReply* rr = r.mutable_replay_reply();
      std::string why;
      rr->set_ok(replay_possible(&why));
      rr->set_message(rr->ok() ? "the job stops, replays its newest step on groups of machines "
                                 "and evicts the machine found (see the incidents)"
                               : "no replay: " + why);
      if (rr->ok()) replay_requested = true;
      server->send(in->identity, r);
    } else if (on_agent) {
      on_agent(in->identity, m);
    }
  }
}

void Controller::Impl::print_progress(const control::WorkerProgress& p) {
  const int every = std::max(1, o.cfg.train().log_every());
  if (p.step() == last_printed || p.step() <= 0 ||
      (p.step() % every != 0 && p.step() != o.cfg.train().steps()))
    return;
  last_printed = p.step();
  const double tokens = double(o.cfg.train().global_batch_size()) * double(o.cfg.model().seq_len());
  // When the newest SDC check ran and passed, so that a reader sees the checks keep up.
  char sdc[32] = "";
  if (p.sdc_passed_step() > 0)
    std::snprintf(sdc, sizeof(sdc), " | sdc ok @%lld", static_cast<long long>(p.sdc_passed_step()));
  // After a hot update, which code the job runs.
  const std::string plugin =
      !plugin_changed ? "" : " | plugin " + plugin_version + " " + plugin_hash.substr(0, 8);
  // A rank that computes well above its stage's median drags every step: name it early.
  char slowest[48] = "";
  if (slowest_rank >= 0 && slowest_factor > 1.2)
    std::snprintf(slowest, sizeof(slowest), " | slowest rank %d %.1fx", slowest_rank,
                  slowest_factor);
  std::printf(
      "step %5lld/%d | loss %.6f | %8.0f tok/s | compute %3.0f%% comm %3.0f%% | epoch %d%s%s%s\n",
      static_cast<long long>(p.step()), o.cfg.train().steps(), p.loss(),
      p.step_s() > 0 ? tokens / p.step_s() : 0.0,
      p.step_s() > 0 ? 100 * p.compute_s() / p.step_s() : 0.0,
      p.step_s() > 0 ? 100 * p.comm_s() / p.step_s() : 0.0, epoch, sdc, plugin.c_str(), slowest);
  std::fflush(stdout);
}

void Controller::Impl::status(control::StatusReply* r) const {
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
void Controller::Impl::inject(const std::string& fault, control::InjectReply* r) {
  try {
    FaultPlan plan;
    add_fault_flag(&plan, fault);
    validate_fault_plan(plan, world, o.cfg.train().steps());
    const faults::Fault& f = plan.schedule.fault(0);
    // The hook that corrupts a rank's tensors is installed on every rank alike when the job
    // starts (it changes when a single micro-batch's gradients are reduced), not later.
    if (f.kind() == faults::Fault::sdc)
      throw InputError(fault +
                       ": sdc faults are given when the job starts (--fault or --inject), not "
                       "while it runs");
    if ((f.kind() == faults::Fault::slot_loss || f.kind() == faults::Fault::partition) &&
        host->slot_of(f.rank()) <= 0)
      throw InputError(fault + ": rank " + std::to_string(f.rank()) +
                       (host->slot_of(f.rank()) < 0 ? " has no slot (keel-launch runs slots)"
                                                    : " is on slot 0, which hosts the controller "
                                                      "and cannot be lost yet"));
    // A fault at step S fires as its rank starts step S (counted from 0), when the rank
    // reads the store's new faults. A rank that reported c steps completed may already have
    // started step c, so S must be past c: S <= c is refused. S = c + 1 or later fires unless
    // the rank completes step S - 1 before the fault reaches the store (the time of this
    // call: with steps of a few ms, give a step some way ahead).
    auto target = progress.find(f.rank());
    if (target != progress.end() && f.step() <= target->second.first.step()) {
      const int64_t done = target->second.first.step();
      throw InputError(detail::concat(
          fault, ": step ", f.step(), " has passed: rank ", f.rank(), " has completed ", done,
          " step(s) (a fault fires as its rank starts the step, counted from 0); ",
          done + 1 < o.cfg.train().steps() ? detail::concat("give step=", done + 1, " or later")
                                           : std::string("the job has no step left to start")));
    }
    const int64_t n = store->add("runtime_faults/count", 1) - 1;
    store->set("runtime_faults/" + std::to_string(n), fault);
    r->set_ok(true);
    r->set_message("injected " + fault +
                   (target == progress.end()
                        ? std::string()
                        : detail::concat(" (rank ", f.rank(), " has completed ",
                                         target->second.first.step(), " step(s))")));
    event("inject_request", EventFields().add("fault", fault));
  } catch (const std::exception& e) {
    r->set_ok(false);
    r->set_message(e.what());
  }
}

int Controller::Impl::run() {
  for (int r = 0; r < world; ++r) spawn(r, /*restarted=*/false);
  state = "training";
  event("start", EventFields().add("world", world));
  auto next_error_poll = Clock::now(), next_grow_check = Clock::now();
  while (true) {
    if (stopping()) {
      LOG(WARNING) << strsignal(*o.stop_signal) << ": stopping every rank";
      host->stop_all(SIGTERM, std::chrono::seconds(5));
      return 128 + *o.stop_signal;
    }
    pump();
    if (auto ex = host->poll_exit()) {
      if (ex->clean()) {
        finished.insert(ex->rank);
        progress.erase(ex->rank);
        if (int(finished.size()) == world) return 0;
        continue;
      }
      if (!finished.empty() || ex->fatal()) {
        std::string why = detail::concat("rank ", ex->rank, " ", ex->describe());
        if (!ex->detail.empty() && !ex->slot_lost)
          why += detail::concat("\nrank ", ex->rank, "'s last lines:\n", ex->detail);
        return stop_job(why, ex->code());
      }
      if (!recover(from_exit(*ex))) return stop_job("", ex->code() ? ex->code() : 1);
      continue;
    }
    if (Clock::now() >= next_error_poll) {
      next_error_poll = Clock::now() + std::chrono::milliseconds(20);
      poll_updates();
      end_probation(last_min_step);
      if (auto d = comm_error()) {
        if (!recover(std::move(*d))) return stop_job("", 1);
        continue;
      }
    }
    if (Clock::now() >= next_grow_check) {
      next_grow_check = Clock::now() + std::chrono::milliseconds(200);
      maybe_grow();
    }
    serve_stacks_requests();
    if (replay_requested) {
      replay_requested = false;
      if (!recover(requested_replay())) return stop_job("", 1);
      continue;
    }
    if (auto d = hang()) {
      if (!recover(std::move(*d))) return stop_job("", 1);
      continue;
    }
    if (auto d = fail_slow()) {
      if (!recover(std::move(*d))) return stop_job("", 1);
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

control::StacksReply Controller::Impl::capture_stacks(const std::string& name) {
  const std::string root = o.run_dir.empty() ? "/tmp/keel-stacks-" + o.job : o.run_dir + "/stacks";
  return collect_stacks(*host, root + "/" + name, std::chrono::seconds(2));
}

void Controller::Impl::serve_stacks_requests() {
  auto requests = std::move(stacks_requests);
  stacks_requests.clear();
  for (auto& [identity, name] : requests) {
    control::Envelope r = make_envelope(epoch);
    // The name becomes a directory: user text, so no separators and no way up.
    if (name.find('/') != std::string::npos || name.find("..") != std::string::npos) {
      r.mutable_stacks_reply()->set_ok(false);
      r.mutable_stacks_reply()->set_message("stacks --name " + name +
                                            ": a name, not a path (no '/' or '..')");
    } else {
      if (name.empty()) name = detail::concat("ctl-", int64_t(unix_now() * 1000));
      *r.mutable_stacks_reply() = capture_stacks(name);
      event("stacks", EventFields().add("name", name).add("dir", r.stacks_reply().dir()));
    }
    server->send(identity, r);
  }
}

int Controller::Impl::stop_job(const std::string& why, int code) {
  if (!why.empty()) LOG(ERROR) << why << "; stopping the job";
  event("stop", EventFields().add("code", code).add("why", why));
  host->stop_all(SIGTERM, std::chrono::seconds(5));
  return code;
}

Controller::Controller(ControllerOptions opts, RankHost* host, std::shared_ptr<Store> store,
                       ControlServer* server)
    : impl_(std::make_unique<Impl>(std::move(opts), host, std::move(store), server)) {}

Controller::~Controller() = default;

void Controller::set_agent_handler(
    std::function<void(const std::string&, const control::Envelope&)> fn) {
  impl_->on_agent = std::move(fn);
}

int Controller::run() {
  return impl_->run();
}

void Controller::pump() {
  impl_->pump();
}

int Controller::epoch() const {
  return impl_->epoch;
}

}  // namespace keel
