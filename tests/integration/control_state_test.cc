// The job's control state in etcd (issue 28): a job of 3+ slots starts etcd members beside
// its first slots, its controller wins the leadership and writes what a next leader needs
// (the spec, each epoch's Membership, the incidents), nothing on the step path writes there,
// and nothing of etcd outlives the job.
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "launcher/etcd/etcd_client.h"
#include "launcher/etcd/leader_election.h"
#include "launcher/exit_codes.h"
#include "launcher/job_env.h"
#include "proto/control_state.pb.h"
#include "proto/events.pb.h"
#include "proto/membership.pb.h"
#include "proto/report.pb.h"
#include "proto/store_keys.h"
#include "runtime/text.h"
#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The first event of `kind` in the job's event log.
std::optional<events::Event> find_event(const std::string& job_dir, const std::string& kind) {
  std::ifstream in(job_dir + "/events.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    events::Event e;
    if (google::protobuf::util::JsonStringToMessage(line, &e).ok() && e.kind() == kind) return e;
  }
  return std::nullopt;
}

double number(const events::Event& e, const std::string& field) {
  auto it = e.data().fields().find(field);
  return it == e.data().fields().end() ? -1 : it->second.number_value();
}

TEST(ControlState, AJobOfThreeSlotsKeepsItsStateInEtcd) {
  const std::string dir = temp_dir("etcd-state");
  const std::string cfg = write_config(dir, {{"parallel", "dp: 2"}});
  state::JobSpec spec;
  membership::Membership members;
  report::Incident incident;
  int64_t term = 0;
  std::vector<EtcdKeyValue> leaders;
  bool read = false;
  JobRun r = run_launch_job(
      dir,
      "--config " + cfg +
          " --local 3 --standby 1 --set train.steps=80 --set train.eval_every=0 "
          "--fault crash@step=20,rank=1",
      [&](pid_t) {
        const std::string job_dir = launched_job_dir(dir);
        if (read || job_dir.empty() || !find_event(job_dir, "recovered")) return;
        const auto etcd = find_event(job_dir, "etcd");
        ASSERT_TRUE(etcd);
        EtcdClient c(split(etcd->data().fields().at("endpoints").string_value(), ','),
                     std::chrono::seconds(5), JobKey::load(job_dir + "/secret"));
        const std::string job = fs::path(job_dir).filename();
        spec.ParseFromString(c.get(keys::state::spec(job)).value().value);
        state::JobState js;
        js.ParseFromString(c.get(keys::state::job_state(job)).value().value);
        members = js.membership();
        term = js.term();
        incident.ParseFromString(c.get(keys::state::incident(job, 0)).value().value);
        leaders = c.get_prefix(keys::state::leader_prefix(job));
        read = true;
      });
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(read) << r.output;
  const std::string job_dir = launched_job_dir(dir);
  // What a next leader needs: the job, the membership of the epoch in force, the incidents.
  EXPECT_EQ(spec.world(), 2);
  EXPECT_EQ(spec.slots(), 3);
  EXPECT_EQ(spec.standby(), 1);
  EXPECT_EQ(spec.config_hash().size(), 16u);
  ASSERT_EQ(spec.faults().fault_size(), 1);
  EXPECT_EQ(members.epoch(), 1);
  EXPECT_GT(term, 0);  // the record names the leader's term that wrote it
  EXPECT_EQ(incident.rank(), 1);
  EXPECT_EQ(incident.epoch(), 1);
  // One leader, this job's controller, at the endpoint keel-ctl finds (the oldest candidacy),
  // and a candidate beside each of the 3 members waiting in line behind it.
  ASSERT_EQ(leaders.size(), 4u);
  std::sort(leaders.begin(), leaders.end(), [](const EtcdKeyValue& a, const EtcdKeyValue& b) {
    return a.create_revision < b.create_revision;
  });
  state::Leader leader;
  ASSERT_TRUE(leader.ParseFromString(leaders[0].value));
  for (size_t i = 1; i < leaders.size(); ++i) {
    state::Leader candidate;
    ASSERT_TRUE(candidate.ParseFromString(leaders[i].value));
    EXPECT_NE(candidate.pid(), leader.pid());
  }
  std::ifstream controller(job_dir + "/controller");
  std::string endpoint;
  std::getline(controller, endpoint);
  EXPECT_EQ(leader.endpoint(), endpoint);
  // Writes: the recovery's Membership and incident; none for the 60 steps after it (the job's
  // total is its start's few and the recovery's).
  const auto recovered = find_event(job_dir, "recovered");
  const auto end = find_event(job_dir, "end");
  ASSERT_TRUE(recovered && end);
  EXPECT_EQ(number(*recovered, "etcd_writes"), 2);
  EXPECT_LE(number(*end, "etcd_writes"), 8) << "steps write to etcd";
  // Nothing of etcd outlives the job: its processes (counted with the job's) and data.
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
  // (Under --local their data is on /dev/shm.)
  EXPECT_FALSE(fs::exists("/dev/shm/keel-etcd-" + fs::path(job_dir).filename().string()))
      << "the members' data outlived the job";
  EXPECT_FALSE(fs::exists(job_dir + "/etcd"));
  EXPECT_TRUE(r.leftover_shm.empty()) << r.output;
}

// How many events of `kind` the job's event log holds.
int count_events(const std::string& job_dir, const std::string& kind) {
  std::ifstream in(job_dir + "/events.jsonl");
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    events::Event e;
    if (google::protobuf::util::JsonStringToMessage(line, &e).ok() && e.kind() == kind) ++n;
  }
  return n;
}

// Only the controller dies, four times (issue 28): first by the controller_crash fault, then
// each leader that took over, killed -9 from outside (the process the election names). Each
// time a candidate takes over while the ranks train on: no rank restarts (one PID each), no
// epoch change, no incident, and the job ends bitwise equal to the same job without the
// kills. The job had 4 controllers (the first and a candidate on each of slots 0-2): the
// fourth takeover is by a candidate an agent started again after its first one died.
TEST(ControlState, TheControllerDiesFourTimesAndTrainingNeverStops) {
  const std::string dir = temp_dir("controller-crash");
  const std::string cfg = write_config(dir, {{"parallel", "dp: 2"}});
  const std::string job =
      "--config " + cfg + " --local 3 --standby 1 --set train.steps=500 --set train.eval_every=0";
  JobRun ref = run_launch_job(temp_dir("controller-crash-ref"), job);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  // Paced (50 ms a step, numbers unchanged): four takeovers of some 4 s each while it trains.
  const std::string paced =
      " --fault slow@step=0,rank=0,delay_ms=50 --set detect.slow_round_steps=0";
  int deaths = 1;  // the fault's
  JobRun r =
      run_launch_job(dir, job + paced + " --fault controller_crash@step=20,rank=1", [&](pid_t) {
        const std::string job_dir = launched_job_dir(dir);
        if (deaths >= 4 || job_dir.empty() || count_events(job_dir, "takeover") < deaths) return;
        const auto etcd = find_event(job_dir, "etcd");
        ASSERT_TRUE(etcd);
        EtcdClient c(split(etcd->data().fields().at("endpoints").string_value(), ','),
                     std::chrono::seconds(5), JobKey::load(job_dir + "/secret"));
        const auto leader =
            find_leader(c, keys::state::leader_prefix(fs::path(job_dir).filename()));
        if (!leader) return;  // between two leaders
        state::Leader l;
        ASSERT_TRUE(l.ParseFromString(leader->value));
        ASSERT_EQ(kill(l.pid(), SIGKILL), 0);
        ++deaths;
      });
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(deaths, 4) << r.output;
  const std::string job_dir = launched_job_dir(dir);
  EXPECT_EQ(count_events(job_dir, "takeover"), 4) << read_text(job_dir + "/events.jsonl");
  EXPECT_EQ(json_number_field(r.report, "steps_completed"), 500);
  EXPECT_EQ(json_string_field(r.report, "param_checksum"),
            json_string_field(ref.report, "param_checksum"));
  EXPECT_TRUE(json_object_array(r.report, "incidents").empty()) << r.report;
  for (const std::string& rank : json_object_array(r.report, "ranks"))
    EXPECT_EQ(json_array_field(rank, "pids").size(), 1u) << "a rank was restarted: " << rank;
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
  EXPECT_TRUE(r.leftover_shm.empty()) << r.output;
}

// The pid of the job's etcd member `name` ("slot1"), found from outside as an operator would:
// the etcd process whose command line names it and the job (its cluster token).
pid_t member_pid(const std::string& job, const std::string& name) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string pid = e.path().filename();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = read_text(e.path().string() + "/cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (contains(cmd, "--name=" + name + " ") && contains(cmd, "--initial-cluster-token=" + job))
      return pid_t(std::stoi(pid));
  }
  return -1;
}

// The last step rank `rank` logged ("step N/M" in logs/rank<R>.log), -1 before its first:
// its own progress, whether or not etcd takes the job's records.
int logged_step(const std::string& job_dir, int rank) {
  std::ifstream in(job_dir + "/logs/rank" + std::to_string(rank) + ".log");
  int step = -1, n = 0;
  for (std::string line; std::getline(in, line);)
    if (std::sscanf(line.c_str(), "step %d/", &n) == 1) step = n;
  return step;
}

// The pid of the job's rank `rank`, found from outside: the process whose environment names
// the job and the rank (a standby's names no rank until it is promoted).
pid_t rank_pid(const std::string& job, int rank) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string pid = e.path().filename();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string vars = read_text(e.path().string() + "/environ");
    auto has = [&](const std::string& var) {
      return vars.find(std::string(1, '\0') + var + std::string(1, '\0')) != std::string::npos ||
             vars.starts_with(var + std::string(1, '\0'));
    };
    if (has(std::string(env::kJobId) + "=" + job) && has("KEEL_RANK=" + std::to_string(rank)))
      return pid_t(std::stoi(pid));
  }
  return -1;
}

// The pid of the job's leader controller, as the election names it.
pid_t leader_pid(const std::string& job_dir) {
  const auto etcd = find_event(job_dir, "etcd");
  if (!etcd) return -1;
  EtcdClient c(split(etcd->data().fields().at("endpoints").string_value(), ','),
               std::chrono::seconds(5), JobKey::load(job_dir + "/secret"));
  const auto leader = find_leader(c, keys::state::leader_prefix(fs::path(job_dir).filename()));
  state::Leader l;
  return leader && l.ParseFromString(leader->value) ? pid_t(l.pid()) : -1;
}

// The pid of the agent that keeps the job's parked standby: the parent of the process named
// keel-standby whose environment names the job.
pid_t standby_agent_pid(const std::string& job) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string pid = e.path().filename();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (read_text(e.path().string() + "/comm") != "keel-standby\n") continue;
    const std::string vars = read_text(e.path().string() + "/environ");
    if (!contains(vars, std::string(env::kJobId) + "=" + job + std::string(1, '\0'))) continue;
    // Field 4 of stat, after the name in parentheses.
    const std::string stat = read_text(e.path().string() + "/stat");
    std::istringstream rest(stat.substr(stat.rfind(')') + 2));
    char state = 0;
    pid_t parent = -1;
    rest >> state >> parent;
    return parent;
  }
  return -1;
}

// The leader dies in the middle of an epoch transition (issue 28): the ranks frozen from
// outside (-STOP) are found hung, told to abort, and while the leader waits for their acks
// it is killed -9. The next leader finds the abort without its rebuild and
// completes that transition under the same epoch (never a second epoch over half of one):
// one incident, in epoch 1, the job ends every step done, bitwise equal to the same job
// without the faults.
TEST(ControlState, ATransitionLeftByAKilledControllerIsCompletedByTheNext) {
  const std::string dir = temp_dir("controller-mid-transition");
  const std::string cfg = write_config(dir, {{"parallel", "dp: 2"}});
  const std::string job = "--config " + cfg +
                          " --local 3 --standby 1 --set train.steps=600 --set train.eval_every=0 "
                          "--fault slow@step=0,rank=0,delay_ms=20 --set detect.slow_round_steps=0";
  JobRun ref = run_launch_job(temp_dir("controller-mid-transition-ref"), job);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  // Both ranks frozen, so that no ack comes and the leader waits in the transition (the
  // abort deadline, 5 s): killed there, not before it began nor after it ended. Rank 0 is
  // thawed with the kill and acks; rank 1 stays frozen and is found hung by the next leader.
  int phase = 0;
  bool interrupted = false;
  pid_t frozen[2] = {-1, -1};
  JobRun r = run_launch_job(dir, job, [&](pid_t) {
    const std::string job_dir = launched_job_dir(dir);
    if (job_dir.empty() || !find_event(job_dir, "etcd")) return;
    if (phase == 0) {
      if (launched_job_step(job_dir) < 60) return;
      for (int rank : {1, 0}) {
        frozen[rank] = rank_pid(fs::path(job_dir).filename(), rank);
        if (frozen[rank] <= 0 || kill(frozen[rank], SIGSTOP) != 0) phase = -10 - rank;
      }
      if (phase == 0) phase = 1;
    } else if (phase == 1) {
      if (!find_event(job_dir, "abort")) return;
      const pid_t leader = leader_pid(job_dir);
      // Killed before it said the recovery was done (else it finished within the test's poll)
      interrupted = !find_event(job_dir, "recovered");
      phase = leader > 0 && kill(leader, SIGKILL) == 0 ? 2 : -2;
      kill(frozen[0], SIGCONT);  // unless the leader found it hung first and killed it
    }
  });
  for (pid_t p : frozen)
    if (p > 0) kill(p, SIGCONT);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(phase, 2) << "the ranks or the leader were not found or could not be signalled\n"
                      << r.output;
  const std::string job_dir = launched_job_dir(dir);
  const std::string events = read_text(job_dir + "/events.jsonl");
  EXPECT_EQ(count_events(job_dir, "takeover"), 1) << events;
  EXPECT_EQ(json_number_field(r.report, "steps_completed"), 600) << r.report;
  EXPECT_EQ(json_string_field(r.report, "param_checksum"),
            json_string_field(ref.report, "param_checksum"));
  // (600 paced steps: the ranks still train when the next leader takes over, ~4 s later. A
  // job that ends within the takeover has rank 0's report written before the new leader
  // could record an incident left unrecorded: see the note. With 400 the job ended
  // within ~0.1 s of the takeover here, and under the suite's load once before it.)
  const std::vector<std::string> inc = json_object_array(r.report, "incidents");
  ASSERT_EQ(inc.size(), 1u) << r.report;
  EXPECT_EQ(json_number_field(inc[0], "epoch"), 1) << inc[0];
  // Whichever step the leader died at (before the ranks were told, or after, before the
  // incident was recorded), the next one completed it and says so; or the one that died
  // had recorded it whole just before its `recovered` event (a transition of 25 ms).
  if (interrupted && !contains(json_string_field(inc[0], "detail"), "the controller before"))
    EXPECT_GT(json_number_field(inc[0], "recovered_at"), 0) << inc[0] << events;
  else if (!interrupted)
    std::printf("the leader finished the transition before it was killed: not checked\n");
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
}

// etcd failing: a member killed (-9) changes nothing and is started again by its slot's agent
// (SlotMember); quorum lost (two members stopped, -STOP: a stopped process is alive, so nobody
// restarts it) pauses decisions, never training: the ranks train on, a rank killed (-9, from
// outside) meanwhile waits for its recovery until quorum is back (-CONT), and the job ends
// every step done.
TEST(ControlState, EtcdLosingAMemberOrItsQuorumNeverStopsTraining) {
  const std::string dir = temp_dir("etcd-quorum");
  const std::string cfg = write_config(dir, {{"parallel", "dp: 2"}});
  int phase = 0, stopped_at = -1, killed_at = -1;
  pid_t slot1 = -1, slot2 = -1;
  bool restarted = false;
  double paused_s = 0, cont_at = 0;  // cont_at: when quorum was given back (Unix time)
  Clock::time_point killed_seen;
  JobRun r = run_launch_job(
      dir,
      "--config " + cfg +
          " --local 3 --standby 1 --set train.steps=300 --set train.eval_every=0 "
          // Paced (20 ms a step), so that phases can be seen from outside; not a degrader.
          "--fault slow@step=0,rank=0,delay_ms=20 --set detect.slow_round_steps=0",
      [&](pid_t) {
        const std::string job_dir = launched_job_dir(dir);
        if (job_dir.empty() || !find_event(job_dir, "etcd")) return;
        const std::string job = fs::path(job_dir).filename();
        if (phase == 0) {
          slot1 = member_pid(job, "slot1");
          slot2 = member_pid(job, "slot2");
          phase = slot1 > 0 && slot2 > 0 && kill(slot2, SIGKILL) == 0 ? 1 : -1;
        } else if (phase == 1) {
          // The killed member is started again, from its data, by its slot's agent.
          if (!restarted) {
            const pid_t again = member_pid(job, "slot2");
            if (again <= 0 || again == slot2) return;
            slot2 = again;
            restarted = true;
          }
          const int step = logged_step(job_dir, 0);
          if (step < 60) return;
          // 1 of 3 left: no quorum.
          if (kill(slot1, SIGSTOP) != 0 || kill(slot2, SIGSTOP) != 0) phase = -1;
          stopped_at = step;
          if (phase == 1) phase = 2;
        } else if (phase == 2) {
          // The ranks' own progress (their logs: etcd takes no record now, and keel-ctl
          // status says the last step it could read there).
          const int step = logged_step(job_dir, 0);
          if (step < stopped_at + 30) return;
          const pid_t victim = rank_pid(job, 1);
          phase = victim > 0 && kill(victim, SIGKILL) == 0 ? 3 : -1;
          killed_at = step;
          killed_seen = Clock::now();
        } else if (phase == 3) {
          // Not "until detected": a leader whose lease lapsed meanwhile (an outage past the
          // 5 s lease, as a loaded machine makes it) decides nothing, detection included,
          // until it leads again, which needs the quorum.
          if (Clock::now() - killed_seen < std::chrono::milliseconds(2000)) return;
          // Decisions wait for quorum: no recovery yet.
          EXPECT_FALSE(find_event(job_dir, "recovered"));
          paused_s = std::chrono::duration<double>(Clock::now() - killed_seen).count();
          cont_at =
              std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                  .count();
          phase = kill(slot1, SIGCONT) == 0 && kill(slot2, SIGCONT) == 0 ? 4 : -1;
        }
      });
  if (slot1 > 0) kill(slot1, SIGCONT);
  if (slot2 > 0) kill(slot2, SIGCONT);
  EXPECT_TRUE(restarted) << "the killed member was not started again\n" << r.output;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(phase, 4) << "the member or rank processes were not found or could not be signalled\n"
                      << r.output;
  EXPECT_GE(paused_s, 2.0);
  const std::string job_dir = launched_job_dir(dir);
  const auto recovered = find_event(job_dir, "recovered");
  ASSERT_TRUE(recovered) << r.output;
  // The Membership and the incident, the leadership won again if its lease lapsed while etcd
  // had no quorum to refresh it (an outage longer than the 5 s lease), and the tries etcd did
  // not take: a handful, not one per step.
  EXPECT_GE(number(*recovered, "etcd_writes"), 2);
  EXPECT_LE(number(*recovered, "etcd_writes"), 8);
  EXPECT_GE(recovered->t(), cont_at) << "recovered without quorum";
  EXPECT_EQ(json_number_field(r.report, "steps_completed"), 300) << r.report;
  const std::vector<std::string> inc = json_object_array(r.report, "incidents");
  ASSERT_EQ(inc.size(), 1u) << r.report;
  EXPECT_EQ(json_string_field(inc[0], "restored_from"), "memory") << inc[0];
  // The ranks trained on without quorum, from the stop up to the crash.
  EXPECT_GE(json_number_field(inc[0], "step") - stopped_at, 30) << "stopped at " << stopped_at;
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
}

// Two of the three slots that host etcd members lost for good at the same step (their
// processes gone, their ports refusing): no quorum can form again, and the job stops at once,
// with a report that names the members and the way out, instead of waiting out
// detect.quorum_timeout_ms (10 minutes here, past the test's own deadline). The way out
// works: --resume with the run directory it names ends the job.
TEST(ControlState, TwoMemberSlotsLostForGoodStopTheJobAtOnce) {
  const std::string dir = temp_dir("etcd-lost-for-good");
  const std::string cfg = write_config(dir, {{"parallel", "dp: 3"}});
  const std::string common = "--config " + cfg +
                             " --local 3 --set train.steps=60 --set train.eval_every=0"
                             " --set train.global_batch_size=24"
                             " --set checkpoint.persistent_every_steps=10 --set checkpoint.dir=" +
                             dir + "/ck";
  JobRun r =
      run_launch_job(dir,
                     common +
                         " --set detect.quorum_timeout_ms=600000"
                         " --fault slot_loss@step=30,rank=1 --fault slot_loss@step=30,rank=2",
                     {}, 240);
  ASSERT_EQ(r.exit_code, 6) << r.output;
  const std::string why = json_string_field(r.report, "stop_reason");
  EXPECT_TRUE(contains(why, "lost its quorum for good")) << r.report;
  EXPECT_TRUE(contains(why, "slot1 (slot 1)") && contains(why, "slot2 (slot 2)")) << why;
  EXPECT_TRUE(contains(r.output, "lost its quorum for good")) << r.output;
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
  // The way out, as the report gives it.
  const size_t at = why.find("--resume ");
  ASSERT_NE(at, std::string::npos) << why;
  const std::string run_dir = why.substr(at + 9);
  ASSERT_TRUE(fs::is_directory(run_dir)) << why;
  JobRun again = run_launch_job(dir, "--resume " + run_dir + " --local 3", {}, 240);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(json_number_field(again.report, "steps_completed"), 60) << again.report;
}

// A member slot lost while no other slot could take its member (a job of 5 slots runs a
// member on each), then brought back by hand (keel-launch --join, a repaired machine; it
// rejoins as a standby): the new agent runs no member and has ports of its own, so the member
// the record names there is dead for good. It is replaced, on that slot (event etcd_member,
// "its slot came back without it"), and the cluster is whole again (etcd_whole). Without it
// the dead member would count against the quorum for the job's life (the 100-fault soak with
// in-job members lost its quorum so).
TEST(ControlState, AMemberWhoseSlotCameBackWithoutItIsReplaced) {
  const std::string dir = temp_dir("etcd-orphan");
  const std::string cfg = write_config(dir, {{"parallel", "dp: 4"}});
  const std::string sets =
      " --set train.steps=400 --set train.eval_every=0 --set detect.slow_round_steps=0";
  pid_t joiner = -1;
  JobRun r = run_launch_job(dir,
                            "--config " + cfg + " --local 5 --standby 1" + sets +
                                " --fault slot_loss@step=20,rank=2"
                                " --fault slow@step=0,rank=0,delay_ms=20",
                            [&](pid_t) {
                              if (joiner > 0) return;
                              const std::string job_dir = launched_job_dir(dir);
                              if (job_dir.empty() || !find_event(job_dir, "recovered")) return;
                              joiner = join_slot(dir, 2, "--config " + cfg + sets);
                            });
  if (joiner > 0) waitpid(joiner, nullptr, 0);
  ASSERT_GT(joiner, 0) << r.output;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json_number_field(r.report, "steps_completed"), 400) << r.report;
  const std::string job_dir = launched_job_dir(dir);
  const auto replaced = find_event(job_dir, "etcd_member");
  ASSERT_TRUE(replaced) << read_text(job_dir + "/events.jsonl");
  EXPECT_EQ(replaced->data().fields().at("removed").string_value(), "slot2");
  EXPECT_EQ(replaced->data().fields().at("why").string_value(), "its slot came back without it");
  EXPECT_EQ(number(*replaced, "slot"), 2);
  const auto whole = find_event(job_dir, "etcd_whole");
  ASSERT_TRUE(whole) << read_text(job_dir + "/events.jsonl");
  EXPECT_GE(whole->t(), replaced->t());
  EXPECT_EQ(number(*whole, "members"), 5);
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
}

// Two of the three slots that host etcd members lost, one after the other: each loss alone
// leaves a quorum, and the first member lost is replaced on a live slot before the second
// goes, so the job keeps a quorum (2 of 3) and recovers both times. Without the replacement
// only slot 0's member would be left and the second recovery would wait for a quorum that
// never comes.
TEST(ControlState, AMemberOfALostSlotIsReplaced) {
  const std::string dir = temp_dir("etcd-upkeep");
  const std::string cfg = write_config(dir, {{"parallel", "dp: 2"}});
  // Paced (20 ms a step): etcd changes its members only once its leader has had a quorum for
  // 5 s (its health check), so the second loss comes seconds after the first, as machines fail.
  JobRun r =
      run_launch_job(dir, "--config " + cfg +
                              " --local 4 --standby 2 --set train.steps=400 "
                              "--set train.eval_every=0 --set detect.quorum_timeout_ms=15000 "
                              "--fault slow@step=0,rank=0,delay_ms=20 "
                              "--set detect.slow_round_steps=0 "
                              "--fault slot_loss@step=20,rank=1 "
                              "--fault slot_loss@step=350,rank=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string job_dir = launched_job_dir(dir);
  // Slot 1's member was replaced by one on slot 3, the only live slot that ran none.
  const auto replaced = find_event(job_dir, "etcd_member");
  ASSERT_TRUE(replaced) << read_text(job_dir + "/events.jsonl");
  EXPECT_EQ(replaced->data().fields().at("removed").string_value(), "slot1");
  EXPECT_EQ(number(*replaced, "slot"), 3);
  // The new member was started while the controller's loop went on, and the event log says
  // when etcd listed every member started again.
  const auto whole = find_event(job_dir, "etcd_whole");
  ASSERT_TRUE(whole) << read_text(job_dir + "/events.jsonl");
  EXPECT_EQ(whole->data().fields().at("added").string_value(),
            replaced->data().fields().at("added").string_value());
  EXPECT_EQ(number(*whole, "members"), 3);
  EXPECT_GE(whole->t(), replaced->t());
  const std::vector<std::string> inc = json_object_array(r.report, "incidents");
  ASSERT_EQ(inc.size(), 2u) << r.report;
  for (const auto& i : inc) EXPECT_EQ(json_string_field(i, "kind"), "slot_loss") << i;
  EXPECT_EQ(json_number_field(r.report, "steps_completed"), 400);
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
}

// A leader that took over ends the job while another slot's agent is slow to go (stopped
// from outside with SIGSTOP): it waits a grace for that agent before it tells its own slot's
// agent, which ends this process, and its resignation lets a candidate lead for a moment.
// Its own agent must not take that silence for its death and follow the candidate (it then
// missed its shutdown and stopped itself after detect.controller_timeout_ms, 10 s after the
// job's end: seen on a loaded machine in LaunchNetns.PartitionedLeader...; under --local
// keel-launch stops it). Every agent follows one leader change, the job's, and ends with it.
TEST(ControlState, TheLeadersOwnAgentEndsWithTheJobWhenAnotherIsSlowToGo) {
  const std::string dir = temp_dir("own-agent-end");
  const std::string cfg = write_config(dir, {{"parallel", "dp: 2"}});
  pid_t stopped = -1;
  std::optional<Clock::time_point> ended;
  JobRun r = run_launch_job(
      dir,
      "--config " + cfg +
          " --local 3 --standby 1 --set train.steps=200 --set train.eval_every=0"
          " --fault slow@step=0,rank=0,delay_ms=40 --set detect.slow_round_steps=0"
          " --fault controller_crash@step=10,rank=1 --set detect.slot_timeout_ms=60000",
      [&](pid_t) {
        const std::string job_dir = launched_job_dir(dir);
        if (job_dir.empty()) return;
        if (stopped < 0 && count_events(job_dir, "takeover") == 1) {
          stopped = standby_agent_pid(fs::path(job_dir).filename());
          ASSERT_GT(stopped, 0);
          ASSERT_EQ(kill(stopped, SIGSTOP), 0);
        }
        if (stopped > 0 && !ended && find_event(job_dir, "end")) ended = Clock::now();
        // Past the leader's grace for the stopped agent (1 s): it may go now.
        if (ended && Clock::now() - *ended > std::chrono::seconds(3)) kill(stopped, SIGCONT);
      });
  if (stopped > 0) kill(stopped, SIGCONT);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_GT(stopped, 0) << r.output;
  ASSERT_TRUE(ended) << r.output;
  EXPECT_EQ(json_number_field(r.report, "steps_completed"), 200);
  // One leader changed hands, so each agent followed a new leader once; the own agent of the
  // one that took over followed a second (the candidate that led for a moment) without the fix.
  for (int slot = 0; slot < 3; ++slot) {
    const std::string said = "slot " + std::to_string(slot) + ": the controller at ";
    int follows = 0;
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);)
      follows += contains(line, said) && contains(line, "following the new leader");
    EXPECT_LE(follows, 1) << "slot " << slot << "\n" << r.output;
  }
  EXPECT_FALSE(contains(r.output, "stopping this slot's workers")) << r.output;
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
}

// The first controller deposed without learning it: it is frozen (-STOP) while the job trains
// on, a candidate takes the job over once its lease lapses, ends it, and the job's etcd
// members go with the slots; only then does it wake (-CONT), with no etcd to learn from that
// another led (as when its lease lapsed in an outage and the job ended before quorum was
// back: ControlState.EtcdLosingAMember... failed so, once in six). keel-launch, whose slots
// all ended with the job's status, stops it and exits with the job's end, not with the
// quorum timeout's exit 6.
TEST(ControlState, AFirstControllerDeposedUnawareIsStoppedWhenTheJobEnds) {
  const std::string dir = temp_dir("deposed-unaware");
  const std::string cfg = write_config(dir, {{"parallel", "dp: 2"}});
  int phase = 0;
  pid_t first = -1;
  JobRun r =
      run_launch_job(dir,
                     "--config " + cfg +
                         " --local 3 --standby 1 --set train.steps=300 --set train.eval_every=0"
                         " --fault slow@step=0,rank=0,delay_ms=20 --set detect.slow_round_steps=0"
                         " --set detect.quorum_timeout_ms=10000",
                     [&](pid_t) {
                       const std::string job_dir = launched_job_dir(dir);
                       if (job_dir.empty() || !find_event(job_dir, "etcd")) return;
                       const std::string job = fs::path(job_dir).filename();
                       if (phase == 0) {
                         if (launched_job_step(job_dir) < 30) return;
                         first = leader_pid(job_dir);
                         phase = first > 0 && kill(first, SIGSTOP) == 0 ? 1 : -1;
                       } else if (phase == 1) {
                         if (!find_event(job_dir, "end")) return;
                         for (const char* m : {"slot0", "slot1", "slot2"})
                           if (member_pid(job, m) > 0) return;
                         phase = kill(first, SIGCONT) == 0 ? 2 : -1;
                       }
                     });
  if (first > 0) kill(first, SIGCONT);
  ASSERT_EQ(phase, 2) << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::string job_dir = launched_job_dir(dir);
  EXPECT_EQ(count_events(job_dir, "takeover"), 1) << read_text(job_dir + "/events.jsonl");
  EXPECT_EQ(json_number_field(r.report, "steps_completed"), 300);
  EXPECT_TRUE(contains(r.output, "deposed without learning it")) << r.output;
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
  EXPECT_TRUE(r.leftover_shm.empty()) << r.output;
}

// What a leader knows outlives it (issue 42): the stop rules' count is in the job's record in
// etcd, so recovery.max_incidents = 2 stops the job at its third incident although the leader
// that counted the first was killed (-9, from outside, the process the election names) before
// the second. Without the count carried over, the next leader counts 2 and trains on.
TEST(ControlState, MaxIncidentsCountsAcrossATakeover) {
  const std::string dir = temp_dir("max-incidents-takeover");
  const std::string cfg = write_config(dir, {{"parallel", "dp: 2"}});
  // Paced (40 ms a step): the takeover (some 4 s) lands between the first and second crash.
  const std::string job = "--config " + cfg +
                          " --local 3 --standby 1 --set train.steps=500 --set train.eval_every=0 "
                          "--set recovery.max_incidents=2 --fault slow@step=0,rank=0,delay_ms=40 "
                          "--set detect.slow_round_steps=0 --fault crash@step=20,rank=1 "
                          "--fault crash@step=300,rank=0 --fault crash@step=400,rank=1";
  bool killed = false;
  JobRun r = run_launch_job(dir, job, [&](pid_t) {
    const std::string job_dir = launched_job_dir(dir);
    if (killed || job_dir.empty() || !find_event(job_dir, "recovered")) return;
    if (launched_job_step(job_dir) < 60) return;
    const pid_t leader = leader_pid(job_dir);
    if (leader > 0 && kill(leader, SIGKILL) == 0) killed = true;
  });
  ASSERT_TRUE(killed) << r.output;
  const std::string job_dir = launched_job_dir(dir);
  const std::string events = read_text(job_dir + "/events.jsonl");
  EXPECT_EQ(r.exit_code, kExitStopped) << r.output << events;
  EXPECT_EQ(count_events(job_dir, "takeover"), 1) << events;
  EXPECT_TRUE(contains(r.report, "\"stopped\": true")) << r.report;
  EXPECT_EQ(json_object_array(r.report, "incidents").size(), 2u) << r.report;
  const double steps = json_number_field(r.report, "steps_completed");
  EXPECT_GE(steps, 300) << r.report;
  EXPECT_LT(steps, 500) << r.report;
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
  EXPECT_TRUE(r.leftover_shm.empty()) << r.output;
}

}  // namespace
}  // namespace keel::test
