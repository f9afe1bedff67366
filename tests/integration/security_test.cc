// Issue 29, from outside: a stranger who has only the job's addresses (found with ss, not from
// keel) and a keel-ctl without the job's secret cannot make a running TP2 x PP2 x DP2 job do
// anything: keel-ctl is refused and the refusal is an event, random bytes, a 4 GiB length, a
// half frame and another job's handshake on every listening port change nothing, and the
// job ends bitwise equal to the same job with no stranger. No keel process shows the secret
// in its command line or environment.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>

#include <zmq.hpp>

#include "launcher/control_plane.h"
#include "parallel/peer_auth.h"
#include "parallel/socket_util.h"
#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using detail::Clock;

// The TCP ports the processes `pids` listen on, from `ss -ltnp`: host and port.
std::set<std::pair<std::string, int>> listening_ports(const std::vector<pid_t>& pids,
                                                      const std::string& dir) {
  const Ran ss = run_in(dir, "ss -ltnpH");
  std::set<std::pair<std::string, int>> out;
  const std::regex addr(R"(\s(\S+):(\d+)\s)"), owner(R"(pid=(\d+))");
  std::istringstream lines(ss.out);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, addr)) continue;
    std::string host = m[1].str();
    const int port = std::stoi(m[2].str());
    bool ours = false;
    for (auto it = std::sregex_iterator(line.begin(), line.end(), owner);
         it != std::sregex_iterator(); ++it)
      ours |= std::find(pids.begin(), pids.end(), pid_t(std::stoi((*it)[1].str()))) != pids.end();
    if (!ours) continue;
    if (host.front() == '[') host = host.substr(1, host.size() - 2);
    out.insert({host, port});
  }
  return out;
}

// Sends `bytes` to host:port and closes; false if nothing listens there.
bool intrude(const std::string& host, int port, const std::string& bytes) {
  try {
    detail::Fd fd = detail::connect_tcp(host, port, Clock::now() + 2s, "intruder");
    std::string err;
    detail::send_all(fd.get(), bytes.data(), bytes.size(), Clock::now() + 1s, &err);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

TEST(Security, StrangersOnEveryPortLeaveTheJobUntouched) {
  const std::string dir = temp_dir("security");
  const std::string cfg = write_config(dir, {{"parallel", "tp: 2 pp: 2 dp: 2"}});
  // Paced (20 ms a step, numbers unchanged), so that the attacks land while it trains.
  const std::string job = "--config " + cfg +
                          " --local 4 --workers-per-slot 2 --set train.steps=400 "
                          "--set train.eval_every=0 --set detect.slow_round_steps=0 "
                          "--fault slow@step=0,rank=0,delay_ms=20";
  JobRun ref = run_launch_job(temp_dir("security-ref"), job);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;

  bool attacked = false;
  std::string secret;
  int ports = 0, sent = 0, leaks = 0, ctl_without = -1, ctl_with = -1;
  std::string ctl_error;
  JobRun r = run_launch_job(dir, job, [&](pid_t leader) {
    const std::string job_dir = launched_job_dir(dir);
    if (attacked || job_dir.empty() || launched_job_step(job_dir) < 5) return;
    attacked = true;
    secret = read_text(job_dir + "/secret");
    secret.erase(secret.find_last_not_of("\n") + 1);
    struct stat st {};
    ASSERT_EQ(::stat((job_dir + "/secret").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    ASSERT_EQ(::stat(job_dir.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);

    // keel-ctl with a copy of the run directory without the secret, then with it.
    const std::string copy = dir + "/copy";
    fs::copy(job_dir, copy, fs::copy_options::recursive);
    fs::remove(copy + "/secret");
    const Ran bad = run_in(dir, bin_dir() + "/keel-ctl status --run " + copy);
    ctl_without = bad.rc;
    ctl_error = bad.err;
    // A stolen endpoint with a secret of its own: the controller refuses it (an event).
    JobKey::generate().save(dir + "/wrong-secret");
    const std::string endpoint =
        read_text(job_dir + "/controller").substr(0, read_text(job_dir + "/controller").find('\n'));
    const Ran wrong = run_in(dir, bin_dir() +
                                      "/keel-ctl inject crash@step=300,rank=3 "
                                      "--controller " +
                                      endpoint + " --secret-file " + dir + "/wrong-secret");
    EXPECT_EQ(wrong.rc, 2) << wrong.out << wrong.err;
    EXPECT_TRUE(contains(wrong.err, "handshake with the controller failed") ||
                contains(wrong.err, "refused this process's key"))
        << wrong.err;
    ctl_with = run_in(dir, bin_dir() + "/keel-ctl status --run " + job_dir).rc;
    // A plain ZeroMQ client and a CURVE client with a key pair of its own (it knows the
    // server's public key) send a valid inject request: neither is read.
    {
      zmq::context_t ctx;
      zmq::socket_t plain(ctx, zmq::socket_type::dealer), own(ctx, zmq::socket_type::dealer);
      std::array<char, 41> pub{}, sec{};
      ASSERT_EQ(zmq_curve_keypair(pub.data(), sec.data()), 0);
      own.set(zmq::sockopt::curve_serverkey,
              zmq::buffer(control_curve_keys(JobKey::from_hex(secret, "secret"), true).pub));
      own.set(zmq::sockopt::curve_publickey, std::string(pub.data(), 40));
      own.set(zmq::sockopt::curve_secretkey, std::string(sec.data(), 40));
      control::Envelope inject = make_envelope(0);
      inject.mutable_inject_request()->set_fault("crash@step=300,rank=2");
      const std::string bytes = inject.SerializeAsString();
      for (zmq::socket_t* s : {&plain, &own}) {
        s->set(zmq::sockopt::linger, 0);
        s->connect(endpoint);
        s->send(zmq::buffer(bytes), zmq::send_flags::dontwait);
      }
      zmq::pollitem_t items[] = {{plain.handle(), 0, ZMQ_POLLIN, 0},
                                 {own.handle(), 0, ZMQ_POLLIN, 0}};
      EXPECT_EQ(zmq::poll(items, 2, std::chrono::milliseconds(1000)), 0)
          << "a stranger got an answer";
    }

    // Every port the job's processes listen on, as ss lists them.
    const std::vector<pid_t> pids = session_processes(leader);
    std::mt19937 rng(5);
    std::string noise(65536, '\0');
    for (char& c : noise) c = char(rng());
    const std::string huge = std::string(4, '\xff') + "GET",
                      half = std::string("\0\0\0\x40", 4) + "x";
    for (const auto& [host, port] : listening_ports(pids, dir)) {
      ++ports;
      for (const std::string& bytes : {noise, huge, half}) sent += intrude(host, port, bytes);
      // A valid handshake of another job.
      try {
        detail::Fd fd = detail::connect_tcp(host, port, Clock::now() + 2s, "intruder");
        authenticate_to_server(fd.get(), {"store", 0}, Clock::now() + 2s, "intruder",
                               JobKey::generate());
        ADD_FAILURE() << host << ":" << port << " accepted another job's key";
      } catch (const std::exception&) {
      }
    }
    // The secret in no command line and no environment of the job's processes.
    for (pid_t p : pids)
      for (const char* part : {"/cmdline", "/environ"})
        leaks += contains(read_text("/proc/" + std::to_string(p) + part), secret);
  });
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(attacked) << "the job ended before the attacks";
  EXPECT_EQ(secret.size(), 64u);
  EXPECT_NE(ctl_without, 0);
  EXPECT_TRUE(contains(ctl_error, "secret")) << ctl_error;
  EXPECT_EQ(ctl_with, 0);
  EXPECT_GE(ports, 8) << "the job's listening ports, from ss";
  EXPECT_EQ(sent, 3 * ports);
  EXPECT_EQ(leaks, 0);
  const std::string job_dir = launched_job_dir(dir);
  const std::string events = read_text(job_dir + "/events.jsonl");
  EXPECT_TRUE(contains(events, "\"refused\"")) << events;
  // The TCP planes' refusals too, reported by the processes that refused them.
  EXPECT_TRUE(contains(events, "\"tcp\"")) << events;
  EXPECT_FALSE(contains(events, "inject_request")) << "a stranger's inject was taken";
  EXPECT_EQ(json_number_field(r.report, "steps_completed"), 400);
  EXPECT_EQ(json_string_field(r.report, "param_checksum"),
            json_string_field(ref.report, "param_checksum"));
  EXPECT_TRUE(json_object_array(r.report, "incidents").empty()) << r.report;
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
  EXPECT_TRUE(r.leftover_shm.empty()) << r.output;
}

// A group- or world-writable plugin is code anyone could have changed: refused by name.
TEST(Security, WritablePluginIsRefused) {
  const std::string dir = temp_dir("security-plugin");
  const std::string plugin = dir + "/open-plugin.so";
  fs::copy_file(bin_dir() + "/libkeel_gpt.so", plugin);
  fs::permissions(plugin, fs::perms::all, fs::perm_options::replace);
  const std::string cfg = write_config(dir);
  const WorkerRun w =
      run_worker(dir, "--config " + cfg + " --set model.plugin=" + plugin + " --set train.steps=2");
  EXPECT_NE(w.exit_code, 0);
  EXPECT_TRUE(contains(w.output, "open-plugin.so")) << w.output;
}

}  // namespace
}  // namespace keel::test
