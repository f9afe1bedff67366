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

#include "job_from_outside.h"
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
  // Writes: the recovery's Membership with its incident, one fenced transaction; none for the
  // 60 steps after it (the job's total is its start's few and the recovery's).
  const auto recovered = find_event(job_dir, "recovered");
  const auto end = find_event(job_dir, "end");
  ASSERT_TRUE(recovered && end);
  EXPECT_EQ(number(*recovered, "etcd_writes"), 1);
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
