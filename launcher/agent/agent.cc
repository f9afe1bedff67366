#include "launcher/agent/agent.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "ckpt/backup_placement.h"
#include "ckpt/restore.h"
#include "ckpt/snapshot_region.h"
#include "launcher/control_plane.h"
#include "launcher/job_env.h"
#include "launcher/processes.h"
#include "launcher/stack_capture.h"
#include "runtime/check.h"
#include "runtime/cpu/blas_core.h"
#include "runtime/logging.h"
#include "runtime/text.h"

namespace keel {
namespace {

using Clock = std::chrono::steady_clock;

// The last `n` lines of a worker's log, to tell the user why it ended.
std::string tail(const std::string& path, size_t n) {
  std::ifstream in(path);
  std::deque<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    if (lines.size() > n) lines.pop_front();
  }
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

// Whether the process that runs the job's controller is gone from this machine. The job id
// starts with its PID (make_job_id); a zombie (its parent has not reaped it yet) is gone too.
// Another machine's PID usually names no process here, which is right: its segments on this
// machine are this job's leftovers either way.
bool controller_process_gone(const std::string& job) {
  const std::optional<int> owner = job_owner_pid(job);
  if (!owner) return false;
  const int pid = *owner;
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');  // the command name may hold spaces and parentheses
  return paren != std::string::npos && paren + 2 < text.size() &&
         (text[paren + 2] == 'Z' || text[paren + 2] == 'X');
}

}  // namespace

void Agent::kill_workers() {
  for (auto* m : {&workers_, &parked_}) {
    for (auto& [key, pid] : *m) {
      ::kill(pid, SIGKILL);
      int st = 0;
      waitpid(pid, &st, 0);
    }
    m->clear();
  }
}

void Agent::remove_shared_memory() {
  // A segment already removed (by its worker's slot at an earlier shutdown, or never made)
  // is no error: ENOENT is expected here, and nothing else can be done about other errors.
  for (int r : hosted_) {
    shm_unlink(snapshot_segment_name(o_.job, r).c_str());
    shm_unlink(backup_segment_name(o_.job, r).c_str());
  }
}

// The controller went silent: slot 0 died, or this slot was cut off from it. Either way the
// job cannot go on here, and nothing of it must linger on this machine.
int Agent::stop_without_controller(std::chrono::milliseconds silent) {
  const std::string why = detail::concat(
      "slot ", o_.slot, ": no word from the controller at ", controller_, " for ", silent.count(),
      " ms: stopping this slot's workers and removing its shared memory");
  LOG(ERROR) << why;
  std::ofstream(o_.log_dir + "/slot" + std::to_string(o_.slot) + "-agent.log", std::ios::app)
      << why << "\n";
  kill_workers();
  remove_shared_memory();
  // When the controller's own slot shared this machine (--slots with --join on one box), its
  // workers died with it and left their segments: remove every segment of the job here.
  int others = 0;
  if (controller_process_gone(o_.job)) others = unlink_job_segments(o_.job);
  LOG(ERROR) << "slot " << o_.slot << ": workers stopped, shared memory of " << hosted_.size()
             << " rank(s)"
             << (others > 0 ? detail::concat(" and ", others, " more segment(s) of the job") : "")
             << " removed; restart the job from its newest persistent checkpoint with "
                "keel-launch --resume "
             << std::filesystem::path(o_.log_dir).parent_path().string();  // runs/<job>
  return kExitControllerLost;
}

std::string Agent::log_of(int rank) const {
  return o_.log_dir + "/rank" + std::to_string(rank) + ".log";
}

std::string Agent::standby_log_of(int index) const {
  return o_.log_dir + "/slot" + std::to_string(o_.slot) + "-standby" + std::to_string(index) +
         ".log";
}

Agent::Agent(AgentOptions o) : o_(std::move(o)), member_(o_.slot, o_.host, o_.job) {
  liveness_ = detail::listen_tcp(o_.host, 0, 64);
}

void Agent::accept_liveness_probes() {
  // The controller's probe only needs the kernel's answer; nothing is read or said.
  for (int c; (c = ::accept4(liveness_.get(), nullptr, nullptr, SOCK_CLOEXEC)) >= 0;) ::close(c);
}

Agent::~Agent() {
  // The leadership's watch goes before the member it may be served by (stopped next, with its
  // data removed).
  leader_link_.reset();
}

void Agent::send_register(bool rejoin) {
  control::Envelope r = make_envelope(0);
  auto* reg = r.mutable_registration();
  reg->set_rejoin(rejoin);
  if (rejoin) {
    for (const auto& [rank, pid] : workers_) (*reg->mutable_running())[rank] = int(pid);
    for (const auto& [index, pid] : parked_) reg->add_parked(index);
    for (const auto& [rank, ev] : exited_)
      if (!workers_.count(rank)) *reg->add_exited() = ev;
  }
  reg->set_slot(o_.slot);
  reg->set_host(o_.host);
  reg->set_pid(int(getpid()));
  reg->set_workers(o_.workers);
  reg->set_job(o_.job);
  reg->set_etcd_client_port(member_.client_port());
  reg->set_etcd_peer_port(member_.peer_port());
  reg->set_liveness_port(detail::local_port(liveness_.get()));
  reg->set_failure_domain(o_.failure_domain);
  client_->send(r);
}

void Agent::follow(const control::Command& c) {
  if (c.etcd_endpoints().empty()) return;
  if (!leader_link_) {
    etcd_endpoints_.assign(c.etcd_endpoints().begin(), c.etcd_endpoints().end());
    try {
      leader_link_ = std::make_unique<LeaderLink>(
          etcd_endpoints_, o_.job,
          [this](const state::Leader& l) {
            std::lock_guard<std::mutex> g(leader_mu_);
            leader_endpoint_ = l.endpoint();
            if (l.term() > confirmed_term_) confirmed_term_ = l.term();
          },
          kLeaderRecheck);
    } catch (const std::exception& e) {
      LOG(ERROR) << "slot " << o_.slot
                 << ": cannot follow the job's leadership in etcd: " << e.what();
      return;
    }
  }
  // Told again later (a slot that ran a candidate was lost: this one runs the next), or with
  // a new leader's welcome; a candidate that runs keeps running.
  if (!c.candidate() || is_candidate_) return;
  is_candidate_ = true;
  if (candidate_ <= 0) start_candidate();
}

void Agent::start_candidate() {
  // A process of its own beside the agent: a controller that crashes takes no worker with it,
  // and one that loses its slot goes with it (it dies with the agent).
  const std::vector<std::string> argv = {
      self_exe_path(), "--candidate", "--job", o_.job, "--slot", std::to_string(o_.slot), "--host",
      o_.host, "--etcd",
      // The members as etcd lists them now: a cluster whose members were replaced since this
      // agent was welcomed is no longer at the endpoints of its welcome.
      join(leader_link_ ? leader_link_->etcd_endpoints() : etcd_endpoints_, ',')};
  candidate_ = spawn_child(
      argv, {}, o_.log_dir + "/slot" + std::to_string(o_.slot) + "-controller.log", SIGKILL);
  candidate_started_ = Clock::now();
  LOG(INFO) << "slot " << o_.slot << ": controller candidate started (pid " << candidate_ << ")";
}

void Agent::keep_candidate() {
  if (!is_candidate_) return;
  if (candidate_ > 0) {
    int st = 0;
    if (waitpid(candidate_, &st, WNOHANG) != candidate_) return;
    candidate_ = 0;  // reaped: none runs
    // Exit 0: the job ended (or ended before it led); nothing to lead any more.
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
      is_candidate_ = false;
      return;
    }
    LOG(WARNING) << "slot " << o_.slot << ": the controller candidate "
                 << (WIFSIGNALED(st) ? detail::concat("was killed (signal ", WTERMSIG(st), ")")
                                     : detail::concat("exited with status ", WEXITSTATUS(st)))
                 << "; starting another";
  }
  // One that dies at start (etcd out of reach, say) is started again once a second at most.
  if (Clock::now() - candidate_started_ >= kCandidateRestartEvery) start_candidate();
}

bool Agent::switch_leader(std::chrono::steady_clock::duration silent) {
  std::string next;
  {
    std::lock_guard<std::mutex> g(leader_mu_);
    next = leader_endpoint_;
  }
  if (next.empty() || next == controller_ || silent < kLeaderSilence) return false;
  LOG(WARNING) << "slot " << o_.slot << ": the controller at " << controller_ << " is silent ("
               << std::chrono::duration_cast<std::chrono::milliseconds>(silent).count()
               << " ms); following the new leader at " << next;
  controller_ = next;
  client_ = std::make_unique<ControlClient>(controller_,
                                            detail::concat("agent/", o_.slot, "/", getpid()));
  send_register(/*rejoin=*/true);
  rejoined_ = true;
  return true;
}

void Agent::stop_candidate() {
  is_candidate_ = false;
  if (candidate_ <= 0) return;
  ::kill(candidate_, SIGKILL);
  int st = 0;
  waitpid(candidate_, &st, 0);
  candidate_ = 0;
}

void Agent::on_etcd_start(int epoch, const control::Command& c) {
  control::Event ev;
  ev.set_kind(control::Event::etcd_started);
  try {
    ev.set_pid(member_.start(c.etcd()));
  } catch (const std::exception& e) {
    ev.set_message(e.what());
  }
  send_event(epoch, ev);
}

void Agent::send_event(int epoch, control::Event ev) {
  control::Envelope e = make_envelope(epoch);
  ev.set_slot(o_.slot);
  *e.mutable_event() = std::move(ev);
  client_->send(e);
}

void Agent::on_spawn(int epoch, const control::Command& c) {
  std::map<std::string, std::string> env(c.env().begin(), c.env().end());
  // This machine's best OpenBLAS core, so the worker need not re-exec to get it.
  add_blas_core_env(&env);
  const std::vector<std::string> argv(c.args().begin(), c.args().end());
  if (c.rank() < 0) {  // a warm standby, parked until it is given a rank
    const int index = -1 - c.rank();
    parked_[index] = spawn_child(argv, env, standby_log_of(index));
    return;
  }
  if (c.has_adopt_index()) {
    // Promotion: the parked worker takes the rank (the controller told it through the
    // store); from now on it is that rank's worker.
    auto p = parked_.find(c.adopt_index());
    if (p == parked_.end()) {
      control::Event ev;
      ev.set_kind(control::Event::slot_error);
      ev.set_message(detail::concat("no parked standby worker ", c.adopt_index()));
      send_event(epoch, ev);
      return;
    }
    workers_[c.rank()] = p->second;
    parked_.erase(p);
    hosted_.insert(c.rank());
    exited_.erase(c.rank());
    return;
  }
  workers_[c.rank()] = spawn_child(argv, env, log_of(c.rank()));
  exited_.erase(c.rank());
  // A process that is no rank of the job (a replay worker, a diagnostic stand-in: ids at or
  // above the world size) holds none of its state: nothing of it to survey or remove.
  if (c.rank() < c.world()) hosted_.insert(c.rank());
}

void Agent::on_kill(int epoch, const control::Command& c) {
  auto it = workers_.find(c.rank());
  if (it == workers_.end()) return;
  ::kill(it->second, SIGKILL);
  int st = 0;
  waitpid(it->second, &st, 0);
  workers_.erase(it);
  control::Event ev;
  ev.set_kind(control::Event::worker_exit);
  ev.set_rank(c.rank());
  ev.set_signal(SIGKILL);
  send_event(epoch, ev);
}

void Agent::on_survey(int epoch, const control::Command& c) {
  // Whose backups a rank holds follows the layout in force, which the command carries.
  const membership::Membership& m = c.membership();
  const Topology topo(std::max(1, m.tp()), std::max(1, m.pp()), std::max(1, m.dp()));
  const bool replica_backups = replicas_hold_backups(topo, o_.zero1);
  control::Event ev;
  ev.set_kind(control::Event::snapshots);
  // Ranks this slot ran: their own snapshots, and the backups they hold for others. Slot
  // headers only: a restore verifies the slot it loads, falls back to the next source and
  // drops a damaged slot, so no pass over the payloads is made here.
  for (int r : hosted_) {
    control::SnapshotHolding* own = ev.add_holdings();
    own->set_owner_rank(r);
    own->set_own(true);
    for (int64_t s : restorable_steps(o_.job, r, -1)) own->add_steps(s);
    const int owner = r < topo.world_size() ? backup_owner(topo, r, replica_backups) : -1;
    if (owner >= 0) {
      control::SnapshotHolding* held = ev.add_holdings();
      held->set_owner_rank(owner);
      // Only what holder r keeps: restorable_steps(owner, r) would also read the owner's
      // own segment, which lives on its slot, not here.
      for (int64_t s : held_steps(o_.job, owner, r, replica_backups)) held->add_steps(s);
    }
  }
  send_event(epoch, ev);
}

void Agent::on_stacks(int epoch, const control::Command& c) {
  // Every worker at once: a stall is a moment, and their stacks should be of it. The
  // controller keeps the timeout well under the slot timeout, as no heartbeat goes out
  // meanwhile.
  std::vector<int> ranks;
  std::vector<pid_t> pids;
  for (const auto& [rank, pid] : workers_) {
    ranks.push_back(rank);
    pids.push_back(pid);
  }
  const std::vector<ProcessStacks> stacks = capture_stacks(
      pids, c.timeout_ms() > 0 ? std::chrono::milliseconds(c.timeout_ms()) : kDefaultStackTimeout);
  control::Event ev;
  ev.set_kind(control::Event::stacks);
  for (size_t i = 0; i < ranks.size(); ++i) *ev.add_rank_stacks() = to_message(ranks[i], stacks[i]);
  send_event(epoch, ev);
}

void Agent::on_renumber(const control::Command& c) {
  exited_.clear();  // a finished transition: its leader took up those exits
  std::map<int, pid_t> renamed;
  for (const auto& [rank, pid] : workers_) {
    auto n = c.rank_map().find(rank);
    if (n != c.rank_map().end()) renamed[n->second] = pid;
  }
  workers_.swap(renamed);
  // The shared memory stays under the old names until the workers move to the new ones;
  // both are this slot's to remove at the end.
  const std::set<int> hosted = hosted_;
  for (int r : hosted) {
    auto n = c.rank_map().find(r);
    if (n != c.rank_map().end()) hosted_.insert(n->second);
  }
}

std::optional<int> Agent::on_command(int epoch, const control::Command& c) {
  switch (c.kind()) {
    case control::Command::welcome:
      welcomed_ = true;
      follow(c);
      break;
    case control::Command::follow:
      follow(c);
      break;
    case control::Command::refuse:
      // Said once, in keel-launch's form for bad input (as main() says the others, not
      // through glog); nothing of the job runs here.
      kill_workers();
      if (rejoined_) {
        std::fprintf(stderr,
                     "keel-launch: slot %d was taken as lost while it could not be heard (%s): "
                     "its workers are stopped; the job goes on without it\n",
                     o_.slot, c.message().c_str());
        return kExitSlotGone;
      }
      std::fprintf(stderr, "keel-launch: error: the controller at %s refused slot %d: %s\n",
                   controller_.c_str(), o_.slot, c.message().c_str());
      return kExitJoinRefused;
    case control::Command::spawn:
      on_spawn(epoch, c);
      break;
    case control::Command::kill:
      on_kill(epoch, c);
      break;
    case control::Command::survey:
      on_survey(epoch, c);
      break;
    case control::Command::stacks:
      on_stacks(epoch, c);
      break;
    case control::Command::reset:
      // Evicted, or given up while cut off: its ranks run elsewhere now and the copies it
      // held are no one's to restore from; it comes back empty, as a standby.
      kill_workers();
      remove_shared_memory();
      hosted_.clear();
      exited_.clear();
      send_register();
      break;
    case control::Command::shutdown:
      stop_candidate();
      kill_workers();
      remove_shared_memory();
      // A new leader ended the job after keel-launch's machine died with its workers: on one
      // box (--slots by hand) their segments are here, and no one else is left to remove them.
      if (controller_process_gone(o_.job)) unlink_job_segments(o_.job);
      return c.exit_code();  // the job's
    case control::Command::renumber:
      on_renumber(c);
      break;
    case control::Command::etcd_start:
      on_etcd_start(epoch, c);
      break;
    default:
      break;
  }
  return std::nullopt;
}

void Agent::reap_workers() {
  // Worker exits, known within one poll.
  for (auto it = workers_.begin(); it != workers_.end();) {
    int st = 0;
    if (waitpid(it->second, &st, WNOHANG) != it->second) {
      ++it;
      continue;
    }
    control::Event ev;
    ev.set_kind(control::Event::worker_exit);
    ev.set_rank(it->first);
    ev.set_pid(it->second);
    if (WIFEXITED(st)) ev.set_exit_code(WEXITSTATUS(st));
    if (WIFSIGNALED(st)) ev.set_signal(WTERMSIG(st));
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) ev.set_last_lines(tail(log_of(it->first), 12));
    send_event(0, ev);
    exited_[it->first] = ev;
    it = workers_.erase(it);
  }
  for (auto it = parked_.begin(); it != parked_.end();) {
    int st = 0;
    if (waitpid(it->second, &st, WNOHANG) != it->second) {
      ++it;
      continue;
    }
    // The controller checks the slot again (or says why it cannot be made ready).
    control::Event ev;
    ev.set_kind(control::Event::standby_exit);
    ev.set_rank(-1 - it->first);
    ev.set_pid(it->second);
    if (WIFEXITED(st)) ev.set_exit_code(WEXITSTATUS(st));
    if (WIFSIGNALED(st)) ev.set_signal(WTERMSIG(st));
    ev.set_last_lines(tail(standby_log_of(it->first), 3));
    send_event(0, ev);
    it = parked_.erase(it);
  }
}

int Agent::run(const volatile int* stop) {
  // The pid makes the identity this process's own: another launcher that claims the same
  // slot by mistake must not take over this one's connection (the controller's ROUTER hands
  // an identity over to its newest client), only be refused.
  controller_ = o_.controller;
  client_ = std::make_unique<ControlClient>(controller_,
                                            detail::concat("agent/", o_.slot, "/", getpid()));
  send_register();
  const auto register_deadline = Clock::now() + o_.register_timeout;
  auto next_heartbeat = Clock::now();
  int64_t connections_seen = 0;
  // Anything the controller sends proves it alive; it answers every heartbeat.
  auto last_heard = Clock::now();
  while (!(stop && *stop)) {
    // A controller that answered and refused the handshake is up: the job's secret is not
    // this one's (keel-ctl says the same for the same file), which no wait would mend.
    if (!welcomed_) {
      if (const std::string refused = client_->handshake_refused(); !refused.empty()) {
        LOG(ERROR) << "slot " << o_.slot << ": the controller at " << o_.controller
                   << " refused this slot's handshake (" << refused
                   << "): the job's secret is not this one's; give --join the job's own "
                      "run directory or secret file";
        return kExitJoinRefused;
      }
    }
    if (!welcomed_ && Clock::now() > register_deadline) {
      LOG(ERROR) << "slot " << o_.slot << ": cannot reach the controller at " << o_.controller
                 << " within " << o_.register_timeout.count() / 1000 << " s";
      return 1;
    }
    if (welcomed_ && leader_link_ && switch_leader(Clock::now() - last_heard))
      last_heard = Clock::now();  // the new leader's silence counts from now
    if (welcomed_ && o_.controller_timeout.count() > 0 &&
        Clock::now() - last_heard > o_.controller_timeout) {
      // With the job's etcd, a silent controller while etcd still shows a leader is a
      // failover under way: a dead leader's key lives out its lease, which etcd renews when its
      // own Raft leader changes (a lost member), so a takeover can take longer than the
      // timeout. The slot stops once etcd too has shown no leader for the timeout (the
      // control plane gone, or this machine cut off from it).
      if (leader_link_ && Clock::now() - leader_link_->leader_seen_at() < o_.controller_timeout) {
        if (!waiting_for_failover_)
          LOG(WARNING) << "slot " << o_.slot << ": no word from the controller at " << controller_
                       << " for "
                       << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() -
                                                                                last_heard)
                              .count()
                       << " ms; etcd shows a leader: waiting for the failover";
        waiting_for_failover_ = true;
      } else {
        stop_candidate();
        return stop_without_controller(
            std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - last_heard));
      }
    }
    if (auto m = client_->poll(kPoll)) {
      const int64_t term = confirmed_term_;
      client_->set_term(term);
      // The door: a deposed leader's message (one cut off and back, or frozen and thawed)
      // changes nothing here and does not count as hearing from the leader.
      if (const EntryCheck::Drop why = entry_.check(*m, term, 0); why != EntryCheck::Drop::kNone) {
        LOG_EVERY_N(WARNING, 50) << "slot " << o_.slot
                                 << ": dropped a message of the controller at " << controller_
                                 << ": " << drop_name(why) << " (term " << m->term() << ", etcd's "
                                 << term << "; " << entry_.dropped() << " dropped so far)";
      } else {
        last_heard = Clock::now();
        waiting_for_failover_ = false;
        if (m->has_command())
          if (std::optional<int> rc = on_command(m->epoch(), m->command())) return *rc;
      }
    }
    reap_workers();
    keep_candidate();
    member_.keep();
    accept_liveness_probes();
    // A connection that closed and came back (a reset link, not this process's death):
    // heartbeat at once, so that the controller sees the slot back within its grace.
    if (const int64_t c = client_->connections(); c != connections_seen) {
      if (c > 1) next_heartbeat = Clock::now();
      connections_seen = c;
    }
    // Only a welcomed agent holds its slot; until then its heartbeats would claim it.
    if (welcomed_ && Clock::now() >= next_heartbeat) {
      next_heartbeat = Clock::now() + kHeartbeatEvery;
      control::Envelope h = make_envelope(0);
      h.mutable_heartbeat()->set_slot(o_.slot);
      for (const auto& [rank, pid] : workers_) h.mutable_heartbeat()->add_ranks_alive(rank);
      client_->send(h);
    }
  }
  stop_candidate();
  kill_workers();
  // Stopped because the controller's process died (a --local slot gets SIGTERM then): no
  // shutdown will come, so the job's shared memory on this machine is this agent's to remove.
  if (controller_process_gone(o_.job)) {
    LOG(WARNING) << "slot " << o_.slot
                 << ": the controller's process is gone: workers stopped, removing the job's "
                    "shared memory";
    remove_shared_memory();
    unlink_job_segments(o_.job);
  }
  return 0;
}

}  // namespace keel
