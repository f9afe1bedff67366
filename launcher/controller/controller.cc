// The controller's loop: starts every rank, handles the control plane (progress reports,
// keel-ctl, the agents' messages), and watches for failures cheapest first, handing each to
// the epoch transition (controller_recovery.cc).
#include "launcher/controller/controller.h"
#include "launcher/recovery_protocol.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>

#include "launcher/controller/controller_impl.h"
#include "launcher/controller/etcd_control_state.h"
#include "launcher/controller/etcd_upkeep.h"
#include "launcher/controller/job_state.h"
#include "launcher/controller/stop_report.h"
#include "launcher/fault_checks.h"
#include "launcher/job_env.h"
#include "launcher/patient_store.h"
#include "parallel/peer_auth.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "robust/fault_injector.h"
#include "robust/fault_spec.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {
namespace {

// How often the loop looks for what the ranks report through the store (errors, updates).
constexpr std::chrono::milliseconds kStorePollEvery{20};
// After a look at the store that found it out of reach: the next one, a second later.
constexpr std::chrono::milliseconds kStoreRetryEvery{1000};
// How often it asks whether a shrunk job can grow back.
constexpr std::chrono::milliseconds kGrowCheckEvery{200};
// The loop's pause when nothing happened.
constexpr std::chrono::milliseconds kLoopPause{5};
// How long the ranks get to stop on SIGTERM before they are killed.
constexpr std::chrono::seconds kStopGrace{5};

}  // namespace

const char* run_state_name(RunState s) {
  switch (s) {
    case RunState::kStarting:
      return "starting";
    case RunState::kTraining:
      return "training";
    case RunState::kRecovering:
      return "recovering";
    case RunState::kWaiting:
      return "waiting";
  }
  return "starting";
}

Controller::Impl::Impl(ControllerOptions opts, RankHost* h, std::shared_ptr<Store> s,
                       ControlServer* srv)
    : o(std::move(opts)),
      host(h),
      store(std::move(s)),
      server(srv),
      members(o.takeover ? JobMembership::restore(o.takeover->membership(), o.cfg.parallel().dp(),
                                                  h->slot_layout())
                         : JobMembership(Topology(o.cfg.parallel().tp(), o.cfg.parallel().pp(),
                                                  o.cfg.parallel().dp()),
                                         o.cfg.parallel().dp(), h->slot_layout())),
      ctx{&o, h, store, &members, [this] { pump(); }, {}},
      detector(ctx, srv != nullptr),
      updates(ctx),
      replays(ctx),
      diagnostics(ctx),
      slow(ctx) {
  host->attach(&members, [this](const std::string& identity, const control::Envelope& m) {
    take_up(identity, m);
  });
  if (o.takeover) {
    // What the leader before this one decided with goes on here: a fourth incident is the
    // fourth whoever leads, an update on probation is still on probation.
    const state::JobState& js = *o.takeover;
    stops = stop_memory(js.stops());
    ladder = ladder_memory(js.ladder());
    updates.restore(js.update());
    transition = js.transition();
    commands = js.commands();
    commands_done = js.commands_done();
    recorded_state = job_state_key(js);
  }
}

// Handles what arrived on the control plane: first what the host set aside while it waited on
// its agents (take_up), then what is new.
void Controller::Impl::pump() {
  // Every message this leader sends says the term it leads in (a term won again after a
  // lapse is a new one): an agent that etcd told of a newer leader drops it at its door.
  if (server && o.state) server->set_term(o.state->term());
  while (!inbox.empty()) {
    auto [identity, m] = std::move(inbox.front());
    inbox.pop_front();
    handle(identity, std::move(m));
  }
  if (!server) return;
  while (auto in = server->poll(std::chrono::milliseconds(0)))
    handle(in->identity, std::move(in->msg));
  // A peer without the job's keys never got a message through; the event says who tried.
  for (const Refusal& r : server->take_refused()) {
    ctx.event("refused", EventFields()
                             .add("plane", "control")
                             .add("peer", r.peer)
                             .add("why", r.why)
                             .add("more", double(r.more)));
    LOG(WARNING) << "control plane: refused " << r.peer << ": " << r.why
                 << (r.more ? detail::concat(" (and ", r.more, " more)") : std::string());
  }
  // This process's own TCP servers (the rendezvous store of a job without etcd).
  if (const int64_t refused = auth_refusals(); refused > 0)
    note_tcp_refusals(getpid(), "the controller", refused);
}

void Controller::Impl::note_tcp_refusals(int64_t pid, const std::string& who, int64_t total) {
  const auto e = tcp_refusals.report(pid, who, total);
  if (!e) return;
  ctx.event("refused", EventFields()
                           .add("plane", "tcp")
                           .add("peer", "see the log of " + e->at)
                           .add("why", detail::concat(e->count, " connection(s) refused by ", e->at,
                                                      ": no job key, or a sealed record that "
                                                      "failed its check"))
                           .add("more", double(e->count - 1)));
}

void Controller::Impl::take_up(const std::string& identity, const control::Envelope& m) {
  // keel-ctl status is answered at once (it changes nothing); the rest waits for the loop.
  if (m.has_status_request() && server) {
    control::Envelope r = make_envelope(members.epoch());
    status(r.mutable_status_reply());
    server->send(identity, r);
    return;
  }
  inbox.emplace_back(identity, m);
}

// Progress, keel-ctl, and the agents' messages.
void Controller::Impl::handle(const std::string& identity, control::Envelope m) {
  control::Envelope r = make_envelope(members.epoch());
  if (m.has_progress()) {
    if (m.epoch() == members.epoch()) on_progress(std::move(*m.mutable_progress()));  // else stale
    return;
  } else if (m.has_status_request()) {
    status(r.mutable_status_reply());
  } else if (m.has_stacks_request()) {
    stacks_requests.emplace_back(identity, m.stacks_request().name());
    return;
  } else if (m.has_inject_request() || m.has_update_request() || m.has_replay_request()) {
    // A command changes the job: the log has it before anything is done.
    const int64_t n = commands++;
    if (o.state) o.state->command(n, m);
    r = command(n, m, /*redo=*/false);
  } else {
    if (on_agent) on_agent(identity, m);
    return;
  }
  server->send(identity, r);
}

control::Envelope Controller::Impl::command(int64_t n, const control::Envelope& m, bool redo) {
  control::Envelope r = make_envelope(members.epoch());
  std::string what, outcome;
  if (m.has_inject_request()) {
    what = "inject " + m.inject_request().fault();
    // A fault injected twice is refused by the job's schedule check: a redo of one that
    // reached the store says so, and adds nothing.
    inject(m.inject_request().fault(), r.mutable_inject_reply());
    outcome = r.inject_reply().message();
  } else if (m.has_update_request()) {
    what = "update " + m.update_request().plugin();
    if (redo && updates.published_by(n)) {
      r.mutable_update_reply()->set_ok(false);
      r.mutable_update_reply()->set_message("published already");
    } else {
      updates.request(m.update_request(), detector.ahead(), n, r.mutable_update_reply());
    }
    outcome = r.update_reply().message();
  } else if (m.has_replay_request()) {
    what = "replay";
    replay_request(r.mutable_replay_reply());
    outcome = r.replay_reply().message();
  }
  commands_done = std::max(commands_done, n + 1);
  // Done is recorded with the job's record (record_job_state, or the next transition's);
  // until then a next leader redoes it, and the checks above keep the redo from acting twice.
  if (redo) {
    LOG(WARNING) << "keel-ctl command " << n << " (" << what
                 << "), accepted by the leader before this one and not finished, carried out "
                    "now: "
                 << outcome;
    ctx.event("command_resumed",
              EventFields().add("n", double(n)).add("command", what).add("outcome", outcome));
  }
  return r;
}

void Controller::Impl::resume_commands() {
  if (!o.state) return;
  for (int64_t n = commands_done;; ++n) {
    const std::optional<control::Envelope> m = o.state->command_record(n);
    if (!m) break;
    commands = std::max(commands, n + 1);
    command(n, *m, /*redo=*/true);
  }
  record_job_state();
}

void Controller::Impl::on_progress(control::WorkerProgress p) {
  if (p.rank() < 0 || p.rank() >= members.world() || finished.count(p.rank())) return;
  if (o.console_progress && p.rank() == 0) print_progress(p);
  if (p.has_round()) slow.on_round(p.rank(), p.round());
  if (p.refusals() > 0)
    note_tcp_refusals(p.pid(), detail::concat("rank ", p.rank(), " (pid ", p.pid(), ")"),
                      p.refusals());
  detector.on_progress(std::move(p));
}

void Controller::Impl::replay_request(control::ReplayReply* rr) {
  std::string why;
  rr->set_ok(replays.possible(&why));
  rr->set_message(rr->ok() ? "the job stops, replays its newest step on groups of machines "
                             "and evicts the machine found (see the incidents)"
                           : "no replay: " + why);
  if (rr->ok()) replays.request();
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
  const std::string plugin = updates.progress_label();
  // A rank that computes well above its stage's median drags every step: name it early.
  char slowest[48] = "";
  if (slow.slowest_rank() >= 0 && slow.slowest_factor() > 1.2)
    std::snprintf(slowest, sizeof(slowest), " | slowest rank %d %.1fx", slow.slowest_rank(),
                  slow.slowest_factor());
  std::printf(
      "step %5lld/%d | loss %.6f | %8.0f tok/s | compute %3.0f%% comm %3.0f%% | epoch %d%s%s%s\n",
      static_cast<long long>(p.step()), o.cfg.train().steps(), p.loss(),
      p.step_s() > 0 ? tokens / p.step_s() : 0.0,
      p.step_s() > 0 ? 100 * p.compute_s() / p.step_s() : 0.0,
      p.step_s() > 0 ? 100 * p.comm_s() / p.step_s() : 0.0, members.epoch(), sdc, plugin.c_str(),
      slowest);
  std::fflush(stdout);
}

void Controller::Impl::status(control::StatusReply* r) {
  r->set_epoch(members.epoch());
  r->set_state(run_state_name(state));
  r->set_incidents(stops.incidents);
  int64_t step = -1;
  double loss = 0;
  for (const auto& [rank, p] : detector.progress()) {
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
    // A look in passing: without etcd's quorum the status goes without the live figures
    // rather than holding up the loop that watches exits and agents.
    const PatientStore::Quick quick;
    if (auto live = try_get_message<store::Live>(*store, keys::kLive)) {
      r->set_tokens_per_s(live->tokens_per_s());
      r->set_mfu(live->mfu());
      r->set_ettr(live->ettr());
    }
  } catch (const CommError& e) {
    LOG_EVERY_N(WARNING, 10) << "status without the live figures: " << e.what();
  }
  host->refresh();  // the standbys' self-checks
  host->fill_status(r);
}

// keel-ctl inject: the fault joins the ranks' schedules through the store.
void Controller::Impl::inject(const std::string& fault, control::InjectReply* r) {
  try {
    // The job's faults so far (its schedule and earlier injections) and this one, checked
    // as keel-launch checks its schedule: the same fault twice is refused.
    FaultPlan plan;
    *plan.schedule.mutable_fault() = o.faults.fault();
    const int64_t injected = store->add(keys::kRuntimeFaultCount, 0);
    for (int64_t i = 0; i < injected; ++i)
      if (auto f = try_get_message<faults::Fault>(*store, keys::runtime_fault_key(i)))
        *plan.schedule.add_fault() = *f;
    for (int i = 0; i < plan.schedule.fault_size(); ++i)
      plan.origins.push_back(FaultOrigin{.file = "the job's faults", .index = i});
    const int first_new = plan.schedule.fault_size();
    add_fault_flag(&plan, fault);
    check_faults(plan,
                 FaultJob{.world = members.world(),
                          .steps = o.cfg.train().steps(),
                          .slot_of = [this](int rank) { return host->slot_of(rank); },
                          .own_interfaces = !JobEnv::get().ifname.empty(),
                          .slot0_losable = o.slot0_losable || o.state != nullptr,
                          .failover = o.state != nullptr},
                 first_new, /*running=*/true);
    const faults::Fault& f = plan.schedule.fault(first_new);
    // A fault at step S fires as its rank starts step S (counted from 0), when the rank
    // reads the store's new faults. A rank that reported c steps completed may already have
    // started step c, so S must be past c: S <= c is refused. S = c + 1 or later fires unless
    // the rank completes step S - 1 before the fault reaches the store (the time of this
    // call: with steps of a few ms, give a step some way ahead).
    auto target = detector.progress().find(f.rank());
    const bool reported = target != detector.progress().end();
    if (reported && f.step() <= target->second.first.step()) {
      const int64_t done = target->second.first.step();
      throw InputError(detail::concat(
          fault, ": step ", f.step(), " has passed: rank ", f.rank(), " has completed ", done,
          " step(s) (a fault fires as its rank starts the step, counted from 0); ",
          done + 1 < o.cfg.train().steps() ? detail::concat("give step=", done + 1, " or later")
                                           : std::string("the job has no step left to start")));
    }
    const int64_t n = store->add(keys::kRuntimeFaultCount, 1) - 1;
    // The fault as parsed and checked here (robust/fault_injector.h reads a faults::Fault).
    set_message(*store, keys::runtime_fault_key(n), f);
    r->set_ok(true);
    r->set_message("injected " + fault +
                   (!reported ? std::string()
                              : detail::concat(" (rank ", f.rank(), " has completed ",
                                               target->second.first.step(), " step(s))")));
    ctx.event("inject_request", EventFields().add("fault", fault));
  } catch (const std::exception& e) {
    r->set_ok(false);
    r->set_message(e.what());
  }
}

std::optional<Detected> Controller::Impl::poll_failures(Clock::time_point* next_error_poll,
                                                        Clock::time_point* next_grow_check) {
  if (Clock::now() >= *next_error_poll) {
    *next_error_poll = Clock::now() + kStorePollEvery;
    try {
      // A store out of reach (etcd without quorum) skips this look: the loop goes on
      // watching exits and agents, and decisions wait in the epoch transition.
      const PatientStore::Quick quick;
      updates.poll(detector.ahead());
      updates.end_probation(detector.min_step());
      if (auto d = detector.comm_error()) return d;
    } catch (const CommError& e) {
      *next_error_poll = Clock::now() + kStoreRetryEvery;
      LOG_EVERY_N(WARNING, 10) << "the ranks' errors were not read: " << e.what();
    }
  }
  if (Clock::now() >= *next_grow_check) {
    *next_grow_check = Clock::now() + kGrowCheckEvery;
    maybe_grow();
    record_job_state();
    host->keep_candidates();
    if (o.upkeep) o.upkeep->maintain();
  }
  serve_stacks_requests();
  if (replays.take_request()) return replays.requested();
  // What arrived while the calls above waited (an etcd member replaced, a stacks capture can
  // take seconds): a rank's silence must be its own, not this loop's. Without it, every rank
  // looked hung after the upkeep's etcd calls, and all were restarted.
  pump();
  if (auto d = detector.hang(stops.incidents + 1)) return d;
  return slow.judge();
}

int Controller::Impl::run() {
  if (o.takeover) {
    take_over();
    resume_commands();
    if (auto d = interrupted_transition())
      if (!recover(std::move(*d))) return stop_after_recovery();
  } else {
    // Epoch 0's record: every rank, whenever it starts, finds the membership there.
    write_rebuild(policy::Plan{}, nullptr);
    for (int r = 0; r < members.world(); ++r) spawn(r, /*restarted=*/false);
    ctx.event("start", EventFields().add("world", members.world()));
  }
  state = RunState::kTraining;
  auto next_error_poll = Clock::now(), next_grow_check = Clock::now();
  while (true) {
    if (stopping()) return stop_by_signal();
    // A lease that lapsed (etcd out of reach, or this process stopped for longer than the
    // lease): nothing is looked at or decided until this controller leads again, or learns
    // that another does (Deposed). The agents keep hearing from it meanwhile.
    if (o.state && !o.state->leads()) o.state->check_leading();
    pump();
    if (auto ex = host->poll_exit()) {
      if (ex->clean()) {
        finished.insert(ex->rank);
        detector.forget(ex->rank);
        if (int(finished.size()) == members.world()) return 0;
        continue;
      }
      if (!finished.empty() || ex->fatal()) {
        std::string why = detail::concat("rank ", ex->rank, " ", ex->describe());
        if (!ex->detail.empty() && !ex->slot_lost)
          why += detail::concat("\nrank ", ex->rank, "'s last lines:\n", ex->detail);
        // A rank's own code says why (bad input, a NaN, a failed write); a rank lost after
        // the others finished has none of keel's.
        return stop_job(why, ex->fatal() ? ex->code() : recovery::kExitStopped);
      }
      // Before the loss is even labelled (an event): a controller another replaced while it
      // was cut off sees every slot silent once back, and must say nothing of it.
      if (o.state) o.state->check_leading();
      if (!recover(detector.from_exit(*ex))) return stop_after_recovery();
      continue;
    }
    if (auto d = poll_failures(&next_error_poll, &next_grow_check)) {
      if (!recover(std::move(*d))) return stop_after_recovery();
      continue;
    }
    std::this_thread::sleep_for(kLoopPause);
  }
}

void Controller::Impl::serve_stacks_requests() {
  auto requests = std::move(stacks_requests);
  stacks_requests.clear();
  for (auto& [identity, name] : requests) {
    control::Envelope r = make_envelope(members.epoch());
    // The name becomes a directory: user text, so no separators and no way up.
    if (name.find('/') != std::string::npos || name.find("..") != std::string::npos) {
      r.mutable_stacks_reply()->set_ok(false);
      r.mutable_stacks_reply()->set_message("stacks --name " + name +
                                            ": a name, not a path (no '/' or '..')");
    } else {
      if (name.empty()) name = detail::concat("ctl-", int64_t(recovery::unix_now() * 1000));
      *r.mutable_stacks_reply() = ctx.capture_stacks(name);
      ctx.event("stacks", EventFields().add("name", name).add("dir", r.stacks_reply().dir()));
    }
    server->send(identity, r);
  }
}

int Controller::Impl::stop_by_signal() {
  return stop_job(detail::concat(strsignal(*o.stop_signal), ": stopped from outside"),
                  128 + *o.stop_signal);
}

int Controller::Impl::stop_after_recovery() {
  // A signal that came while the recovery waited stops the job as any signal does.
  return stopping() ? stop_by_signal() : stop_job(stop_why, recovery::kExitStopped);
}

int Controller::Impl::stop_job(const std::string& why, int code) {
  stop_why = why;
  LOG(ERROR) << why << "; stopping the job";
  // Fenced before anything is stopped: a controller whose lease lapsed while it decided
  // learns here that the job is another's, and leaves its ranks alone.
  record_end(code);
  ctx.event("stop", EventFields().add("code", code).add("why", why));
  host->stop_all(SIGTERM, kStopGrace);
  try {
    write_stop_report(*store, o.cfg, o.job_start, why, o.report_path, detector.min_step());
  } catch (const std::exception& e) {
    LOG(ERROR) << "the stopped job's report: " << e.what();
  }
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

void Controller::Impl::record_end(int code) {
  if (!o.state || end_recorded) return;
  end_recorded = true;
  try {
    state::JobEnd end;
    end.set_code(code);
    end.set_why(code == 0 ? "done" : stop_why);
    o.state->end(end);
  } catch (const Deposed&) {
    throw;
  } catch (const std::exception& e) {
    // Out of etcd's reach past the quorum timeout: the job stops all the same (keel-launch
    // has its controller's exit status; the slots theirs from the shutdown).
    LOG(ERROR) << "etcd: the job's end could not be written: " << e.what();
  }
}

int Controller::run() {
  try {
    int code = 0;
    try {
      code = impl_->run();
    } catch (const QuorumLost& e) {
      // etcd has been out of reach for the quorum timeout already: the end is not tried
      // again (another timeout's wait) before the ranks are stopped.
      impl_->end_recorded = true;
      code = impl_->stop_job(e.what(), recovery::kExitStopped);
    }
    // Before this leader gives up its leadership (a job done, or stopped without stop_job).
    impl_->record_end(code);
    return code;
  } catch (const Deposed& e) {
    // Another controller leads: this one stops acting at once (the ranks and agents are the
    // new leader's), and says nothing of the job's end.
    return impl_->step_aside(e.what());
  } catch (const LostLeadership& e) {
    // A fenced write refused where nothing could campaign again (past the job's end):
    // the same, it acts no more.
    return impl_->step_aside(e.what());
  }
}

int Controller::Impl::step_aside(const std::string& why) {
  const int64_t refused = o.state ? o.state->refusals() : 0;
  LOG(WARNING) << why << ": this controller steps aside (" << refused
               << " fenced write(s) refused by etcd)";
  ctx.event("deposed", EventFields().add("why", why).add("refused_writes", double(refused)));
  return kExitDeposed;
}

void Controller::pump() {
  impl_->pump();
}

void Controller::set_control_state(EtcdControlState* state, EtcdUpkeep* upkeep) {
  impl_->o.state = state;
  impl_->o.upkeep = upkeep;
}

int Controller::epoch() const {
  return impl_->members.epoch();
}

}  // namespace keel
