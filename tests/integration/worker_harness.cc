#include "worker_harness.h"

#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "model/token_shards.h"
#include "test_paths.h"

namespace keel::test {

const std::string& demo_data_dir() {
  static const std::string dir = [] {
    namespace fs = std::filesystem;
    std::string d = temp_dir("data");
    std::string text;
    std::vector<fs::path> files;
    const fs::path src = "/usr/share/games/fortunes";
    if (fs::exists(src))
      for (const auto& e : fs::directory_iterator(src))
        if (e.path().extension().empty() && fs::is_regular_file(fs::canonical(e.path())))
          files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      text.append(std::istreambuf_iterator<char>(in), {});
      if (text.size() > 600000) break;
    }
    if (text.size() < 100000)
      throw std::runtime_error("test corpus: install Debian's fortunes (scripts/install-deps.sh)");
    std::vector<uint16_t> tokens(text.begin(), text.end());
    for (auto& t : tokens) t &= 0xff;
    size_t split = tokens.size() * 9 / 10;
    write_token_shard(d + "/train_000000.bin", tokens.data(), split);
    write_token_shard(d + "/val_000000.bin", tokens.data() + split, tokens.size() - split);
    return d;
  }();
  return dir;
}

std::string test_model_name(TestModel m) {
  return m == TestModel::kLlama ? "llama" : "gpt";
}

void PrintTo(TestModel m, std::ostream* os) {
  *os << test_model_name(m);
}

std::string write_config(const std::string& dir, const std::map<std::string, std::string>& extra,
                         TestModel model) {
  auto more = [&](const std::string& section) {
    auto it = extra.find(section);
    return it == extra.end() ? std::string() : " " + it->second;
  };
  // SwiGLU's width: ~8/3 of hidden_size, a multiple of 16 (the GPT derives its own 4x).
  const std::string plugin =
      model == TestModel::kLlama ? "libkeel_llama.so\" ffn_hidden_size: 96" : "libkeel_gpt.so\"";
  std::string path = dir + "/job.pbtxt";
  std::ofstream f(path);
  f << "model { plugin: \"" << bin_dir() << "/" << plugin << " num_layers: 2 hidden_size: 32 "
    << "num_heads: 4 seq_len: 32 vocab_size: 256" << more("model") << " }\n"
    << "train { micro_batch_size: 2 global_batch_size: 8 steps: 10 seed: 1234 eval_every: 5 "
    << "eval_batches: 2" << more("train") << " }\n"
    << "optim { lr: 3e-3 warmup_steps: 2 schedule: cosine" << more("optim") << " }\n"
    << "data { train_files: \"" << demo_data_dir() << "/train_*.bin\" val_files: \""
    << demo_data_dir() << "/val_*.bin\" order: sequential" << more("data") << " }\n"
    << "parallel { comm_timeout_ms: 20000" << more("parallel") << " }\n"
    << "runtime { threads: 1" << more("runtime") << " }\n";
  return path;
}

WorkerRun run_worker(const std::string& dir, const std::string& args) {
  WorkerRun r;
  std::string report = dir + "/report.json";
  std::filesystem::remove(report);
  std::string cmd = bin_dir() + "/keel-worker --quiet --report " + report + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed: " + cmd);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream in(report);
  if (in) r.report.assign(std::istreambuf_iterator<char>(in), {});
  return r;
}

namespace {

std::set<std::string> keel_shm() {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
    if (e.path().filename().string().rfind("keel-", 0) == 0) out.insert(e.path().string());
  return out;
}

}  // namespace

// Processes whose session id is `sid` (field 6 of /proc/PID/stat), zombies aside.
std::vector<pid_t> session_processes(pid_t sid) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(e.path() / "stat");
    std::string line;
    if (!std::getline(f, line)) continue;
    size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    std::string state;
    long ppid = 0, pgrp = 0, session = 0;
    rest >> state >> ppid >> pgrp >> session;
    if (session == sid && state != "Z") out.push_back(pid_t(std::stol(name)));
  }
  return out;
}

pid_t start_session(const std::vector<std::string>& argv, const std::string& log) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    setsid();
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

pid_t join_slot(const std::string& dir, int slot, const std::string& args) {
  std::error_code ec;
  for (const auto& d : std::filesystem::directory_iterator(dir + "/runs", ec)) {
    std::ifstream in(d.path() / "controller");
    std::string endpoint, job;
    std::getline(in, endpoint);
    std::getline(in, job);
    if (job.empty()) continue;
    return start_session(
        {"/bin/sh", "-c",
         "exec " + bin_dir() + "/keel-launch --join " + endpoint + " --slot " +
             std::to_string(slot) + " --job " + job + " --run-dir " + dir + "/runs " + args},
        dir + "/join.log");
  }
  return -1;
}

namespace {
JobRun run_program(const std::string& dir, const std::string& cmd,
                   const std::function<void(pid_t)>& poll, int timeout_s);
std::string program_cmd(const std::string& dir, const std::string& program,
                        const std::string& args) {
  return bin_dir() + "/" + program + " --quiet --report " + dir + "/report.json " + args;
}
}  // namespace

JobRun run_command(const std::string& dir, const std::string& command,
                   const std::function<void(pid_t)>& poll, int timeout_s) {
  return run_program(dir, command, poll, timeout_s);
}

JobRun run_job(const std::string& dir, const std::string& args,
               const std::function<void(pid_t)>& poll, int timeout_s) {
  return run_program(dir, program_cmd(dir, "keel-worker", args), poll, timeout_s);
}

JobRun run_launch_job(const std::string& dir, const std::string& args,
                      const std::function<void(pid_t)>& poll, int timeout_s) {
  return run_program(dir, program_cmd(dir, "keel-launch", "--run-dir " + dir + "/runs " + args),
                     poll, timeout_s);
}

namespace {
JobRun run_program(const std::string& dir, const std::string& command,
                   const std::function<void(pid_t)>& poll, int timeout_s) {
  JobRun r;
  const std::set<std::string> shm_before = keel_shm();
  const std::string report = dir + "/report.json", log = dir + "/job.log";
  std::filesystem::remove(report);
  const pid_t pid = start_session({"/bin/sh", "-c", "exec " + command}, log);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (poll) poll(pid);
    if (std::chrono::steady_clock::now() > deadline) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  // A rank that outlived its supervisor would still be in the session. PDEATHSIG may still
  // be on its way to the ranks of a supervisor that just ended: wait for the session to
  // empty, with a deadline, and count what is left then (normally nothing, at once).
  std::vector<pid_t> left = wait_for_empty_session(pid);
  r.leftover_processes = int(left.size());
  for (pid_t p : left) kill(p, SIGKILL);
  // The supervisor names its job's segments after its PID (the session's leader, as `exec`
  // keeps it); other keel processes on the machine (parallel tests) are not this job's.
  const std::string mine = "/dev/shm/keel-" + std::to_string(pid) + "-";
  for (const auto& path : keel_shm())
    if (!shm_before.count(path) && path.rfind(mine, 0) == 0) {
      r.leftover_shm.push_back(path);
      std::filesystem::remove(path);
    }
  std::ifstream lf(log);
  r.output.assign(std::istreambuf_iterator<char>(lf), {});
  std::ifstream in(report);
  if (in) r.report.assign(std::istreambuf_iterator<char>(in), {});
  return r;
}
}  // namespace

namespace {
size_t value_pos(const std::string& json, const std::string& key) {
  size_t k = json.find("\"" + key + "\":");
  if (k == std::string::npos) throw std::runtime_error("report has no field " + key);
  return k + key.size() + 3;
}
}  // namespace

std::string json_string_field(const std::string& json, const std::string& key) {
  size_t a = json.find('"', value_pos(json, key));
  size_t b = json.find('"', a + 1);
  return json.substr(a + 1, b - a - 1);
}

double json_number_field(const std::string& json, const std::string& key) {
  return std::stod(json.substr(value_pos(json, key)));
}

std::vector<double> json_array_field(const std::string& json, const std::string& key) {
  size_t a = json.find('[', value_pos(json, key));
  size_t b = json.find(']', a);
  std::vector<double> out;
  std::stringstream ss(json.substr(a + 1, b - a - 1));
  std::string item;
  while (std::getline(ss, item, ','))
    if (item.find_first_not_of(" \n") != std::string::npos) out.push_back(std::stod(item));
  return out;
}

std::vector<std::string> json_object_array(const std::string& json, const std::string& key) {
  std::vector<std::string> out;
  size_t k = json.find("\"" + key + "\":");
  if (k == std::string::npos) return out;  // an empty repeated field is left out
  size_t i = json.find('[', k), end = json.size();
  int depth = 0;
  size_t start = 0;
  for (; i < end; ++i) {
    const char c = json[i];
    if (c == '{') {
      if (depth++ == 0) start = i;
    } else if (c == '}') {
      if (--depth == 0) out.push_back(json.substr(start, i - start + 1));
    } else if (c == ']' && depth == 0) {
      break;
    }
  }
  return out;
}

std::vector<float> read_llmc_floats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  in.seekg(256 * 4);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

std::map<int, std::string> rank_sources(const std::string& incident) {
  std::map<int, std::string> out;
  const size_t k = incident.find("\"rank_sources\":");
  if (k == std::string::npos) return out;
  const size_t open = incident.find('{', k), close = incident.find('}', open);
  if (open == std::string::npos || close == std::string::npos) return out;
  // {"0": "memory", "1": "backup"}: quoted keys and values in turn.
  std::vector<std::string> quoted;
  for (size_t a = incident.find('"', open); a < close; a = incident.find('"', a + 1)) {
    const size_t b = incident.find('"', a + 1);
    quoted.push_back(incident.substr(a + 1, b - a - 1));
    a = b;
  }
  for (size_t i = 0; i + 1 < quoted.size(); i += 2) out[std::stoi(quoted[i])] = quoted[i + 1];
  return out;
}

namespace {
bool one_of(const std::string& got, const std::string& alternatives) {
  std::stringstream ss(alternatives);
  for (std::string a; std::getline(ss, a, '|');)
    if (got == a) return true;
  return false;
}
}  // namespace

void expect_restored(const std::string& incident, const RestorePoint& want) {
  SCOPED_TRACE("incident: " + incident);
  ASSERT_TRUE(contains(incident, "\"restored_step\":")) << "no restored_step";
  const int step = int(json_number_field(incident, "restored_step"));
  if (want.step >= 0) {
    EXPECT_EQ(step, want.step) << "restored_step";
  } else {
    EXPECT_GE(step, want.min_step) << "restored_step";
    if (want.max_step >= 0) {
      EXPECT_LE(step, want.max_step) << "restored_step";
    }
  }
  EXPECT_FALSE(want.from.empty()) << "the test must say where the state came from";
  EXPECT_EQ(json_string_field(incident, "restored_from"), want.from) << "restored_from";
  EXPECT_GT(want.world, 0) << "the test must say how many ranks restored";
  const std::map<int, std::string> got = rank_sources(incident);
  for (int r = 0; r < want.world; ++r) {
    auto named = want.ranks.find(r);
    const std::string& expected = named != want.ranks.end() ? named->second : want.others;
    EXPECT_FALSE(expected.empty()) << "no source expected for rank " << r;
    auto g = got.find(r);
    if (g == got.end()) {
      ADD_FAILURE() << "rank " << r << " reported no source (want " << expected << ")";
      continue;
    }
    EXPECT_TRUE(one_of(g->second, expected))
        << "rank " << r << " restored from " << g->second << ", want " << expected;
  }
  for (const auto& [r, source] : got)
    EXPECT_LT(r, want.world) << "a source for rank " << r << " of " << want.world;
}

void expect_resumed(const std::string& report, int first_step, int steps) {
  SCOPED_TRACE("report: " + report);
  EXPECT_EQ(json_number_field(report, "first_step"), first_step) << "first_step";
  EXPECT_EQ(json_number_field(report, "steps_completed"), steps) << "steps_completed";
  EXPECT_EQ(json_array_field(report, "losses").size(), size_t(steps - first_step))
      << "losses: one per step run, from first_step on";
}

std::vector<pid_t> wait_for_empty_session(pid_t sid, std::chrono::milliseconds deadline) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  std::vector<pid_t> left = session_processes(sid);
  while (!left.empty() && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    left = session_processes(sid);
  }
  return left;
}

bool rank_source_is(const std::string& incident, int rank, const std::string& source) {
  std::ostringstream want;
  want << '"' << rank << "\": \"" << source << '"';
  return incident.find(want.str()) != std::string::npos;
}

std::string launched_job_dir(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/runs", ec))
    if (std::filesystem::exists(e.path() / "controller")) return e.path().string();
  return "";
}

int launched_job_step(const std::string& job_dir) {
  if (job_dir.empty()) return -1;
  FILE* p = popen((bin_dir() + "/keel-ctl status --run " + job_dir + " 2>/dev/null").c_str(), "r");
  if (!p) return -1;
  char line[512];
  int step = -1;
  while (fgets(line, sizeof(line), p))
    if (std::sscanf(line, "state %*s | epoch %*d | step %d", &step) == 1) break;
  pclose(p);
  return step;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace keel::test
