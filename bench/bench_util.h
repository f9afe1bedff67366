// What the benchmark programs share: where their sibling binaries are, a corpus of random
// byte tokens (speed does not depend on the text), and reading a keel report and event log back.
#pragma once

#include <google/protobuf/util/json_util.h>

#include <fcntl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "model/token_shards.h"
#include "proto/events.pb.h"
#include "proto/json_gaps.h"
#include "proto/report.pb.h"
#include "runtime/logging.h"

namespace keel::bench {

// The folder of keel-bench, where keel-worker, keel-launch and the plugin are built too.
inline std::string exe_dir() {
  return std::filesystem::canonical("/proc/self/exe").parent_path().string();
}

// One shard of 2^20 random tokens below 256 in `dir`; returns its glob.
inline std::string random_shards(const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::mt19937 gen(7);
  std::vector<uint16_t> tokens(1 << 20);
  for (auto& t : tokens) t = uint16_t(gen() % 256);
  write_token_shard(dir + "/train_000000.bin", tokens);
  return dir + "/train_*.bin";
}

// A file's whole text; "" if it cannot be read (not there yet, or gone). Plain read(2), not a
// stream: a /proc file of a process that ends between open and read fails the read with
// ESRCH, which libstdc++'s filebuf throws as an exception whatever the stream's mask (it
// ended a soak once).
inline std::string read_text(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      text.clear();
      break;
    }
    if (n == 0) break;
    text.append(buf, size_t(n));
  }
  ::close(fd);
  return text;
}

// Reads a --report JSON file into `r`; false if it is missing or not a report.
inline bool read_report(const std::string& path, report::RunReport* r) {
  return message_from_json(read_text(path), r).empty();
}

// The run directory keel-launch made under `runs` (runs/<job>/), or "" before it has.
inline std::string job_dir_in(const std::string& runs) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(runs, ec))
    if (e.is_directory()) return e.path().string();
  return "";
}

// The controller's endpoint and the job id from the file slot 0's keel-launch writes in its
// run directory (job_dir/controller: the endpoint, then the job, a line each); false until
// it has written both.
inline bool read_controller_file(const std::string& job_dir, std::string* endpoint,
                                 std::string* job) {
  std::istringstream in(read_text(job_dir + "/controller"));
  return std::getline(in, *endpoint) && std::getline(in, *job) && !job->empty();
}

// One line of a job's events.jsonl (launcher/controller/event_log.h); false if it is not one.
inline bool parse_event(const std::string& line, events::Event* e) {
  return google::protobuf::util::JsonStringToMessage(line, e).ok();
}

// A number field of an event's data, or -1 when absent.
inline double event_number(const events::Event& e, const std::string& key) {
  const auto& f = e.data().fields();
  const auto it = f.find(key);
  return it == f.end() ? -1 : it->second.number_value();
}

// A string field of an event's data, or "" when absent.
inline std::string event_string(const events::Event& e, const std::string& key) {
  const auto& f = e.data().fields();
  const auto it = f.find(key);
  return it == f.end() ? std::string() : it->second.string_value();
}

// Runs `program` (keel-worker or keel-launch, next to this benchmark) with `args` under a
// 300 s limit, its report in dir/report.json, its run directories under dir/runs and its
// output in dir/run.log; returns the exit status.
inline int run(const std::string& dir, const std::string& program, const std::string& args) {
  std::filesystem::remove(dir + "/report.json");
  std::filesystem::remove_all(dir + "/runs");
  std::filesystem::create_directories(dir + "/runs");
  const bool launch = program == "keel-launch";
  const std::string cmd = "timeout 300 " + exe_dir() + "/" + program + " --quiet --report " + dir +
                          "/report.json " + (launch ? "--run-dir " + dir + "/runs " : "") + args +
                          " > " + dir + "/run.log 2>&1";
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

// The pid of the running keel-worker serving `rank` (0 if none; a parked standby's is not):
// found in /proc, as an operator would, by its environment.
inline pid_t worker_pid(int rank) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream cmd(e.path() / "cmdline");
    std::string argv0;
    std::getline(cmd, argv0, '\0');
    if (argv0.find("keel-worker") == std::string::npos) continue;
    std::ifstream env(e.path() / "environ", std::ios::binary);
    bool mine = false, standby = false;
    for (std::string kv; std::getline(env, kv, '\0');) {
      mine = mine || kv == "KEEL_RANK=" + std::to_string(rank);
      standby = standby || kv.rfind("KEEL_STANDBY=", 0) == 0;
    }
    if (mine && !standby) return pid_t(std::stoi(name));
  }
  return 0;
}

// run(), and its report; exits the benchmark when the run fails (a benchmark whose runs
// fail measures nothing).
inline report::RunReport must_run(const std::string& dir, const std::string& program,
                                  const std::string& args) {
  report::RunReport r;
  if (run(dir, program, args) != 0 || !read_report(dir + "/report.json", &r)) {
    LOG(ERROR) << "failed: " << program << " " << args << " (see " << dir << "/run.log)";
    std::exit(1);
  }
  return r;
}

}  // namespace keel::bench
