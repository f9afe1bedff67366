#include "launcher/lead.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "launcher/control_plane.h"
#include "launcher/controller/agent_host.h"
#include "launcher/controller/controller.h"
#include "launcher/controller/event_log.h"
#include "launcher/controller/job_etcd.h"
#include "launcher/etcd/etcd_client.h"
#include "launcher/etcd/etcd_store.h"
#include "launcher/job_env.h"
#include "launcher/patient_store.h"
#include "launcher/processes.h"
#include "parallel/tcp_store.h"
#include "proto/config_loader.h"
#include "proto/store_keys.h"
#include "runtime/check.h"
#include "runtime/logging.h"
#include "runtime/text.h"

namespace keel {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// How long the first leader waits for every slot to register: machines of a cluster start
// their launchers within seconds of each other; a minute means one will not come.
constexpr std::chrono::seconds kRegisterWait{60};
// At the end: how long the agents get to take the shutdown and close their connections
// before this process (and its queued messages) goes.
constexpr std::chrono::milliseconds kShutdownGrace{1000};
// A candidate's etcd calls, and its pause between reads of a spec not written yet.
constexpr std::chrono::milliseconds kCallTimeout{2000};
constexpr std::chrono::milliseconds kSpecPoll{100};
// A candidate waits in line for as long as the job runs: its campaign has no deadline.
constexpr std::chrono::hours kCandidateWait{24 * 365};

// Thrown from a candidate's wait when the job ended (or a stop signal came) before it led.
struct JobOver {};

ControllerOptions options_of(const state::JobSpec& spec, const config::JobConfig& cfg) {
  ControllerOptions co;
  co.cfg = cfg;
  co.job = spec.job();
  co.lineage = spec.lineage();
  co.job_start = spec.job_start();
  co.store_addr = spec.store_addr();
  co.run_dir = spec.run_dir();
  co.report_path = spec.report_path();
  co.faults = spec.faults();
  co.console_progress = spec.console_progress();
  return co;
}

// Runs the job's Controller over `agents` to the job's end, then ends the job: every rank
// stopped, every agent told to shut down, the leadership left to lapse. Returns the exit status.
int run_and_end(ControllerOptions co, AgentHost& agents, ControlServer& control,
                std::shared_ptr<Store> store, EventLog& events,
                std::unique_ptr<EtcdControlState>* state, EtcdUpkeep* upkeep,
                const EtcdClient* client) {
  co.on_event = [&events](const std::string& k, const EventFields& f) { events.write(k, f); };
  agents.set_event_sink(co.on_event);
  // It lives until the agents are shut down: the host borrows its membership.
  Controller controller(co, &agents, std::move(store), &control);
  controller.set_agent_handler(
      [&](const std::string& id, const control::Envelope& m) { agents.on_message(id, m); });
  agents.set_pump([&] { controller.pump(); });
  controller.set_control_state(state->get(), upkeep);
  const int code = controller.run();
  if (code == kExitDeposed) return code;  // the job is another leader's now
  // The etcd writes of the whole job: with those of each recovery (the `recovered` events),
  // they show that nothing on the step path writes to etcd.
  events.write(
      "end",
      EventFields().add("code", code).add("etcd_writes", client ? double(client->writes()) : 0));
  agents.stop_all(SIGKILL, std::chrono::milliseconds(0));
  // The leadership is kept until every agent was told: no candidate leads meanwhile, so each
  // agent's shutdown comes in the term it follows (an agent drops an older term's messages at
  // its door), and the candidates, which find the job's end in etcd, stand down. Then it is
  // left to lapse: the members stop with their agents, and a resignation would wait for a
  // quorum that is gone.
  agents.set_exit_code(code);
  agents.finish();
  agents.await_shutdown(kShutdownGrace);
  if (*state) (*state)->abandon();
  state->reset();
  return code;
}

// The leader's view of the ranks' store in etcd: every write fenced by etcd on the
// leadership of *state (DESIGN.md, Control state and failover), so that a deposed leader's
// abort, rebuild or incident never lands whatever the timing; a refused write ends the
// leadership, and the write is tried again only once this controller leads again. Patient
// (quorum lost pauses decisions); `idle` answers the agents meanwhile.
std::shared_ptr<Store> leaders_store(const std::string& address,
                                     std::chrono::milliseconds quorum_timeout,
                                     std::function<void()> idle,
                                     const std::unique_ptr<EtcdControlState>* state) {
  auto guard = [state] { return *state ? (*state)->guard() : EtcdGuard{}; };
  return std::make_shared<PatientStore>(
      connect_fenced_etcd_store(address, guard), quorum_timeout,
      [idle = std::move(idle), state] {
        idle();
        if (*state) (*state)->check_quorum_left();
      },
      [state] {
        if (*state) (*state)->check_leading();
      },
      connect_fenced_etcd_store(address, guard, kEtcdQuickCall),
      [state](const std::string& what) {
        // The job's end gave the leadership up: nothing is written any more.
        if (!*state) throw LostLeadership(what);
        (*state)->refused(what);
      });
}

std::map<std::string, std::string> worker_env(const state::JobSpec& spec,
                                              const std::string& controller,
                                              const std::string& etcd) {
  std::map<std::string, std::string> env(spec.standby_env().begin(), spec.standby_env().end());
  env[env::kController] = controller;
  if (!spec.store_addr().empty()) env[env::kStoreAddr] = spec.store_addr();
  if (!etcd.empty()) env[env::kEtcd] = etcd;
  return env;
}

}  // namespace

int lead_first(const FirstLead& f) {
  state::JobSpec spec = f.spec;
  const fs::path dir = spec.run_dir();
  EventLog events((dir / "events.jsonl").string());
  ControlServer control(f.host, 0);
  std::ofstream(dir / "controller") << control.endpoint() << "\n" << spec.job() << "\n";
  events.write(
      "launch",
      EventFields().add("job", spec.job()).add("slots", spec.slots()).add("world", spec.world()));
  const std::vector<std::string> argv(spec.worker_argv().begin(), spec.worker_argv().end());
  AgentHost agents(&control, nullptr, spec.world(), spec.workers_per_slot(), spec.slots(),
                   spec.standby(), argv, worker_env(spec, control.endpoint(), ""),
                   std::chrono::milliseconds(f.cfg.detect().slot_timeout_ms()));
  agents.set_job(spec.job());  // a --join with another job's id is refused, not taken
  agents.set_slot0_pid(f.slot0_pid);
  agents.set_pump([&] {
    while (auto in = control.poll(std::chrono::milliseconds(0)))
      agents.on_message(in->identity, in->msg);
  });
  f.on_endpoint(control.endpoint());
  if (!agents.wait_for_slots(kRegisterWait, reinterpret_cast<const volatile int*>(f.stop))) {
    LOG(ERROR) << "not every slot registered with the controller within " << kRegisterWait.count()
               << " s";
    events.write("end", EventFields().add("code", 1));
    agents.finish();
    agents.await_shutdown(kShutdownGrace);
    return 1;
  }
  if (!f.o.quiet)
    std::printf("keel-launch: job %s: %d slot(s) x %d worker(s), run directory %s\n",
                spec.job().c_str(), spec.slots(), spec.workers_per_slot(), dir.c_str());
  JobEtcdOptions eo;
  eo.slots = spec.slots();
  eo.members = f.o.etcd_members;
  eo.endpoints = f.o.etcd;
  // Under --local every member shares one machine: its disk buys no durability that /dev/shm
  // does not have, and costs fsyncs (the first election takes seconds longer on disk).
  const bool shm = f.o.etcd_data == "shm" || (f.o.etcd_data.empty() && f.fork_slots);
  eo.data_root = shm ? etcd_shm_dir(spec.job()) : (dir / "etcd").string();
  eo.log_dir = (dir / "logs").string();
  eo.quorum_timeout = std::chrono::milliseconds(f.cfg.detect().quorum_timeout_ms());
  eo.leader.set_endpoint(control.endpoint());
  eo.leader.set_slot(0);
  eo.leader.set_pid(int(getpid()));
  eo.spec = spec;
  eo.stop = f.stop;
  const auto on_event = [&events](const std::string& k, const EventFields& e) {
    events.write(k, e);
  };
  JobEtcd etcd;
  try {
    etcd = start_job_etcd(agents, eo, on_event);
  } catch (const std::exception& e) {
    LOG(ERROR) << "the job's etcd: " << e.what();
    // Stopped from outside: 128 + the signal, as a shell says it.
    const int code = f.stop && *f.stop ? 128 + int(*f.stop) : 1;
    events.write("end", EventFields().add("code", code));
    agents.set_exit_code(code);
    agents.finish();
    agents.await_shutdown(kShutdownGrace);
    return code;
  }
  // From here on every message says the term this controller leads in (agents that follow
  // the leadership in etcd drop an older term's).
  if (etcd.state) control.set_term(etcd.state->term());
  std::vector<std::string> etcd_endpoints;
  if (etcd.client) etcd_endpoints = etcd.client->endpoints();
  const std::string etcd_list = join(etcd_endpoints, ',');
  if (!etcd.summary.empty()) {
    if (!f.o.quiet) std::printf("keel-launch: %s\n", etcd.summary.c_str());
    events.write("etcd", EventFields().add("summary", etcd.summary).add("endpoints", etcd_list));
  }
  std::fflush(stdout);
  // The ranks' store: in etcd when the job has one (it outlives any controller), else a TCP
  // store in this process.
  std::unique_ptr<TcpStoreServer> tcp;
  std::shared_ptr<Store> store;
  if (etcd.client) {
    spec.set_store_addr(etcd.store_addr);
    store = leaders_store(
        etcd.store_addr, eo.quorum_timeout, [&agents] { agents.keep_alive(); }, &etcd.state);
  } else {
    tcp = std::make_unique<TcpStoreServer>(f.host, 0);
    spec.set_store_addr(f.host + ":" + std::to_string(tcp->port()));
    store = std::make_shared<TcpStore>(f.host, tcp->port());
  }
  agents.set_store(store, worker_env(spec, control.endpoint(), etcd_list));
  if (f.on_etcd) f.on_etcd(etcd_endpoints);
  if (etcd.client) {
    agents.follow(etcd_endpoints, etcd.candidates);
    agents.follow_etcd_members([c = etcd.client.get()] { return c->endpoints(); });
  }
  ControllerOptions co = options_of(spec, f.cfg);
  co.controller_endpoint = control.endpoint();
  co.etcd_endpoints = etcd_list;
  co.slot0_losable = f.fork_slots;
  // Slot 0's agent shares keel-launch's process unless --local forks it: evicting slot 0 would
  // move ranks onto the machine whose loss ends keel-launch itself.
  co.controller_slot = f.fork_slots ? -1 : 0;
  co.stop_signal = f.stop;
  const int code = run_and_end(co, agents, control, store, events, &etcd.state, etcd.upkeep.get(),
                               etcd.client.get());
  return code;
}

int lead_as_candidate(const LaunchOptions& o, const volatile sig_atomic_t* stop) {
  set_process_name("keel-controller");
  const std::vector<std::string> endpoints = split(o.etcd, ',', /*skip_empty=*/true);
  EtcdClient client(endpoints, kCallTimeout);
  const std::string job = o.job;
  auto stopping = [stop] { return stop && *stop; };
  // The spec is written before any candidate starts; a read may still meet a lost quorum.
  state::JobSpec spec;
  while (true) {
    if (stopping()) return 0;
    try {
      if (auto kv = client.get(keys::state::spec(job))) {
        KEEL_CHECK(spec.ParseFromString(kv->value), "etcd: ", keys::state::spec(job),
                   " holds no state::JobSpec");
        break;
      }
    } catch (const EtcdUnavailable& e) {
      LOG(WARNING) << "etcd: reading the job spec: " << e.what();
    }
    std::this_thread::sleep_for(kSpecPoll);
  }
  const config::JobConfig cfg = parse_config_text(spec.config(), "the job spec in etcd", {});
  const std::string end_key = keys::state::end(job);
  auto ended = [&] {
    try {
      return client.get(end_key).has_value();
    } catch (const EtcdUnavailable&) {
      return false;
    }
  };
  ControlServer control(o.host, 0);
  state::Leader me;
  me.set_endpoint(control.endpoint());
  me.set_slot(o.slot);
  me.set_pid(int(getpid()));
  std::unique_ptr<EtcdControlState> state;
  try {
    state = std::make_unique<EtcdControlState>(
        &client, job, me, kControllerLeaseTtl,
        std::chrono::milliseconds(cfg.detect().quorum_timeout_ms()),
        [&] {
          if (stopping() || ended()) throw JobOver{};
        },
        kCandidateWait);
  } catch (const JobOver&) {
    return 0;
  }
  // Won, but the job may have ended as this candidate won (its leader gave up at the end).
  if (ended()) return 0;
  control.set_term(state->term());
  const std::optional<state::JobState> js = state->read_job_state();
  KEEL_CHECK(js, "etcd: ", keys::state::job_state(job),
             " holds no state::JobState: nothing to take over");
  LOG(WARNING) << "slot " << o.slot << ": this candidate leads job " << job << " (epoch "
               << js->membership().epoch() << ", term " << state->term() << ", written in term "
               << js->term() << ")";
  const fs::path dir = spec.run_dir();
  std::error_code ec;
  fs::create_directories(dir / "logs", ec);
  // Its run directory (on this machine, made now if the first leader's was elsewhere) is
  // read by keel-ctl for the job's key: this user's alone, as the first leader made its own.
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace, ec);
  EventLog events((dir / "events.jsonl").string());
  // keel-ctl finds the job's controller here: this one now (on the machine of the run
  // directory; elsewhere the run directory is this machine's own).
  std::ofstream(dir / "controller") << control.endpoint() << "\n" << job << "\n";
  const std::vector<std::string> argv(spec.worker_argv().begin(), spec.worker_argv().end());
  AgentHost* host = nullptr;  // the store's idle answers the agents once they exist
  // The store's address as the first leader wrote it, on the members etcd has now (a cluster
  // keel started is followed by the client as its members are replaced).
  spec.set_store_addr(with_etcd_endpoints(spec.store_addr(), client.endpoints()));
  std::shared_ptr<Store> store = leaders_store(
      spec.store_addr(), std::chrono::milliseconds(cfg.detect().quorum_timeout_ms()),
      [&host] {
        if (host) host->keep_alive();
      },
      &state);
  AgentHost agents(&control, store, spec.world(), spec.workers_per_slot(), spec.slots(),
                   spec.standby(), argv, worker_env(spec, control.endpoint(), o.etcd),
                   std::chrono::milliseconds(cfg.detect().slot_timeout_ms()));
  host = &agents;
  agents.set_job(job);
  agents.set_own_slot(o.slot);
  // Welcomes name the etcd; this leader keeps as many candidates as the first did, on the
  // first live slots (those whose candidate runs already keep it).
  agents.follow(endpoints, std::min(spec.slots(), std::max(3, int(endpoints.size()))));
  agents.follow_etcd_members([&client] { return client.endpoints(); });
  ControllerOptions co = options_of(spec, cfg);
  co.controller_endpoint = control.endpoint();
  co.etcd_endpoints = o.etcd;
  co.slot0_losable = true;
  co.stop_signal = stop;
  co.takeover = *js;
  // The members keel started (none with the user's cluster) are this leader's to keep now.
  std::unique_ptr<EtcdUpkeep> upkeep;
  if (auto members = state->etcd_members())
    upkeep = std::make_unique<EtcdUpkeep>(
        &agents, &client, *members,
        [&state](const state::EtcdMembers& x) { state->etcd_members(x); },
        [&events](const std::string& k, const EventFields& f) { events.write(k, f); }, o.slot);
  if (upkeep) state->give_up_when([u = upkeep.get()] { u->check_quorum(); });
  return run_and_end(co, agents, control, store, events, &state, upkeep.get(), &client);
}

}  // namespace keel
