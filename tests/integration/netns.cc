// NetnsLab (see netns.h): machines as network namespaces, built and torn down with
// iproute2, and processes put into them with setns().
#include "integration/netns.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "parallel/net_address.h"
#include "runtime/check.h"

extern char** environ;

namespace keel::test {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Runs argv (PATH searched) with stdout and stderr captured into *out; returns the exit
// code (-1 when it died of a signal or could not start).
int run(const std::vector<std::string>& argv, std::string* out) {
  int pipefd[2];
  KEEL_CHECK_ERRNO(::pipe2(pipefd, O_CLOEXEC));
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(pipefd[1], 1);
    ::dup2(pipefd[1], 2);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  int fork_errno = errno;
  ::close(pipefd[1]);
  if (pid < 0) {
    ::close(pipefd[0]);
    throw Error(detail::concat("fork for ", argv[0], ": ", std::strerror(fork_errno)));
  }
  out->clear();
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(pipefd[0], buf, sizeof(buf));
    if (n > 0) {
      out->append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(pipefd[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string joined(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

// `ip <args>`; throws keel::Error with the command and what ip printed when it fails.
void ip(std::vector<std::string> args) {
  args.insert(args.begin(), "ip");
  std::string out;
  int rc = run(args, &out);
  if (rc != 0) throw Error(detail::concat("`", joined(args), "` failed (exit ", rc, "): ", out));
}

// The same for teardown, where a failure must not stop the rest of the cleanup.
void ip_quiet(std::vector<std::string> args) noexcept {
  try {
    args.insert(args.begin(), "ip");
    std::string out;
    run(args, &out);
  } catch (...) {
  }
}

std::string ns_path(const std::string& ns) {
  return "/var/run/netns/" + ns;
}

// True when no live process has this pid. A crashed test binary may stay a zombie until
// its parent reaps it, and its leftovers are stale by then already.
bool pid_gone(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(f, stat)) return true;
  const size_t paren = stat.rfind(')');  // the command name may contain spaces and ')'
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] == 'Z' ||
         stat[paren + 2] == 'X';
}

// Pids whose network namespace is the one bind-mounted at `ns` (same nsfs device and
// inode as /proc/<pid>/ns/net). Zombies have left their namespaces and are not listed.
std::vector<pid_t> pids_in_netns(const std::string& ns) {
  struct stat target {};
  if (::stat(ns_path(ns).c_str(), &target) != 0) return {};
  std::vector<pid_t> pids;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    struct stat st {};
    if (::stat((e.path() / "ns" / "net").c_str(), &st) != 0) continue;  // gone or a zombie
    if (st.st_dev == target.st_dev && st.st_ino == target.st_ino) {
      pids.push_back(static_cast<pid_t>(std::stol(name)));
    }
  }
  return pids;
}

// SIGKILLs everything in `ns` until nothing is left (a process may fork while we kill) or
// `patience` passes. Never kills this process. Returns the survivors.
std::vector<pid_t> kill_all_in(const std::string& ns, Clock::duration patience) {
  const auto deadline = Clock::now() + patience;
  for (;;) {
    std::vector<pid_t> pids = pids_in_netns(ns);
    std::erase(pids, ::getpid());
    if (pids.empty() || Clock::now() > deadline) return pids;
    for (pid_t p : pids) ::kill(p, SIGKILL);
    std::this_thread::sleep_for(5ms);
  }
}

// Bridged frames must not go through the host's iptables (br_netfilter would apply the
// host's FORWARD policy to traffic between two machines on the bridge). Best effort: if
// the module is absent the file is absent and nothing filters; if it cannot be written the
// tests will say which traffic did not pass.
void disable_bridge_netfilter() {
  const char* path = "/proc/sys/net/bridge/bridge-nf-call-iptables";
  if (!fs::exists(path)) return;
  std::ofstream f(path);
  f << "0\n";
}

const std::regex kStaleNs(R"(^keel(\d+)(m\d+|probe)\b)");
const std::regex kStaleLink(R"(^\d+: (kl(\d+)(br|v\d+))[@:])");

}  // namespace

bool NetnsLab::available(std::string* why) {
  static int state = -1;  // -1 unknown, 0 no, 1 yes
  static std::string reason;
  if (state < 0) {
    std::string out;
    const std::string probe = "keel" + std::to_string(::getpid()) + "probe";
    if (::geteuid() != 0) {
      reason = "network namespaces need root";
    } else if (run({"ip", "-V"}, &out) != 0) {
      reason = "`ip` (iproute2) is not installed: " + out;
    } else if (run({"ip", "netns", "add", probe}, &out) != 0) {
      reason = "`ip netns add` does not work here: " + out;
    }
    run({"ip", "netns", "del", probe}, &out);
    state = reason.empty() ? 1 : 0;
  }
  if (why) *why = reason;
  return state == 1;
}

void NetnsLab::cleanup_stale() {
  try {
    std::string out;
    std::smatch m;
    run({"ip", "netns", "list"}, &out);
    std::istringstream ns_lines(out);
    for (std::string line; std::getline(ns_lines, line);) {
      if (!std::regex_search(line, m, kStaleNs)) continue;
      if (!pid_gone(static_cast<pid_t>(std::stol(m[1].str())))) continue;
      const std::string ns = line.substr(0, line.find(' '));
      kill_all_in(ns, 2s);
      ip_quiet({"netns", "del", ns});
    }
    run({"ip", "-o", "link", "show"}, &out);
    std::istringstream link_lines(out);
    for (std::string line; std::getline(link_lines, line);) {
      if (!std::regex_search(line, m, kStaleLink)) continue;
      if (!pid_gone(static_cast<pid_t>(std::stol(m[2].str())))) continue;
      ip_quiet({"link", "del", m[1].str()});
    }
  } catch (...) {
    // A leftover we could not remove only costs a name or a subnet; never fail a test here.
  }
}

NetnsLab::NetnsLab(int machines) : pid_(::getpid()) {
  KEEL_CHECK(machines >= 1 && machines <= 200, "a NetnsLab has 1..200 machines, not ", machines);
  cleanup_stale();
  bridge_ = "kl" + std::to_string(pid_) + "br";
  // Interface names are limited to 15 characters (IFNAMSIZ - 1).
  KEEL_CHECK(bridge_.size() <= 15 && veth_name(machines - 1).size() <= 15,
             "interface names of pid ", pid_, " too long");
  // Leftovers of an earlier lab of this same process (one that could not be torn down).
  for (int i = 0; i < machines; ++i) {
    ip_quiet({"link", "del", veth_name(i)});
    ip_quiet({"netns", "del", "keel" + std::to_string(pid_) + "m" + std::to_string(i)});
  }
  ip_quiet({"link", "del", bridge_});

  // x from the pid, moved on past subnets that another lab already uses on this host.
  std::set<int> used;
  const std::regex ours(R"(^10\.231\.(\d+)\.)");
  for (const auto& [name, addr] : ipv4_interfaces()) {
    std::smatch m;
    if (std::regex_search(addr, m, ours)) used.insert(std::stoi(m[1].str()));
  }
  subnet_ = 1 + pid_ % 254;
  for (int tries = 0; tries < 254 && used.count(subnet_); ++tries) subnet_ = subnet_ % 254 + 1;
  KEEL_CHECK(!used.count(subnet_), "every subnet 10.231.x.0/24 is in use");

  try {
    ip({"link", "add", bridge_, "type", "bridge", "forward_delay", "0"});
    ip({"addr", "add", bridge_address() + "/24", "dev", bridge_});
    ip({"link", "set", bridge_, "up"});
    disable_bridge_netfilter();
    for (int i = 0; i < machines; ++i) {
      const std::string ns = "keel" + std::to_string(pid_) + "m" + std::to_string(i);
      ip({"netns", "add", ns});
      ns_.push_back(ns);
      // The machine's end is created inside its namespace, so it can be called eth0 there
      // while the host has an eth0 of its own.
      ip({"link", "add", veth_name(i), "type", "veth", "peer", "name", "eth0", "netns", ns});
      ip({"link", "set", veth_name(i), "master", bridge_});
      ip({"link", "set", veth_name(i), "up"});
      ip({"-n", ns, "addr", "add", address(i) + "/24", "dev", "eth0"});
      ip({"-n", ns, "link", "set", "lo", "up"});
      ip({"-n", ns, "link", "set", "eth0", "up"});
      ip({"-n", ns, "route", "add", "default", "via", bridge_address()});
    }
  } catch (...) {
    teardown();
    throw;
  }
}

NetnsLab::~NetnsLab() {
  teardown();
  std::error_code ec;
  for (int i = 0; i < size(); ++i) std::filesystem::remove_all(shm_dir(i), ec);
}

std::string NetnsLab::shm_dir(int i) const {
  return "/tmp/keel-netns-shm/" + ns_name(i);
}

std::string NetnsLab::veth_name(int i) const {
  return "kl" + std::to_string(pid_) + "v" + std::to_string(i);
}

std::string NetnsLab::address(int i) const {
  KEEL_CHECK(i >= 0 && i < size(), "no machine ", i);
  return "10.231." + std::to_string(subnet_) + "." + std::to_string(11 + i);
}

std::string NetnsLab::bridge_address() const {
  return "10.231." + std::to_string(subnet_) + ".1";
}

const std::string& NetnsLab::ns_name(int i) const {
  KEEL_CHECK(i >= 0 && i < size(), "no machine ", i);
  return ns_[static_cast<size_t>(i)];
}

std::string NetnsLab::exec_prefix(int i) const {
  return "ip netns exec " + ns_name(i) + " ";
}

pid_t NetnsLab::spawn(int i, const std::vector<std::string>& argv,
                      const std::vector<std::string>& env, const std::string& log_path) {
  KEEL_CHECK(!argv.empty(), "spawn needs a program");
  // Everything the child needs is prepared here: between fork and exec it may only make
  // async-signal-safe calls (other threads of a test may hold malloc's locks).
  std::vector<std::string> env_strs;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const std::string name = kv.substr(0, kv.find('='));
    bool replaced = false;
    for (const auto& o : env) replaced = replaced || o.substr(0, o.find('=')) == name;
    if (!replaced) env_strs.push_back(kv);
  }
  env_strs.insert(env_strs.end(), env.begin(), env.end());
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : env_strs) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  const std::string shm = shm_dir(i);
  std::filesystem::create_directories(shm);
  int ns_fd = ::open(ns_path(ns_name(i)).c_str(), O_RDONLY | O_CLOEXEC);
  KEEL_CHECK(ns_fd >= 0, "open ", ns_path(ns_name(i)), ": ", std::strerror(errno));
  int log_fd = -1;
  if (!log_path.empty()) {
    log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      int e = errno;
      ::close(ns_fd);
      throw Error(detail::concat("open ", log_path, ": ", std::strerror(e)));
    }
  }
  // The child reports a failed setns or exec through this pipe; exec closes it (CLOEXEC),
  // so an empty read means the program is running.
  int err_pipe[2];
  KEEL_CHECK_ERRNO(::pipe2(err_pipe, O_CLOEXEC));
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setsid();
    int stage = 0;
    if (::setns(ns_fd, CLONE_NEWNET) != 0) {
      stage = 1;
    } else if (::unshare(CLONE_NEWNS) != 0 ||
               ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
               ::mount(shm.c_str(), "/dev/shm", nullptr, MS_BIND, nullptr) != 0) {
      stage = 3;
    } else {
      if (log_fd >= 0) {
        ::dup2(log_fd, 1);
        ::dup2(log_fd, 2);
      }
      ::execvpe(args[0], args.data(), envp.data());
      stage = 2;
    }
    int report[2] = {stage, errno};
    ssize_t n = ::write(err_pipe[1], report, sizeof(report));
    (void)n;
    ::_exit(127);
  }
  int fork_errno = errno;
  ::close(err_pipe[1]);
  ::close(ns_fd);
  if (log_fd >= 0) ::close(log_fd);
  if (pid < 0) {
    ::close(err_pipe[0]);
    throw Error(detail::concat("fork for ", argv[0], ": ", std::strerror(fork_errno)));
  }
  int report[2] = {0, 0};
  ssize_t n;
  do {
    n = ::read(err_pipe[0], report, sizeof(report));
  } while (n < 0 && errno == EINTR);
  ::close(err_pipe[0]);
  if (n > 0) {
    ::waitpid(pid, nullptr, 0);
    throw Error(detail::concat(report[0] == 1   ? "setns into " + ns_name(i)
                               : report[0] == 3 ? "a /dev/shm of its own for " + ns_name(i)
                                                : "exec " + argv[0],
                               " failed: ", std::strerror(report[1])));
  }
  spawned_.push_back(pid);
  return pid;
}

void NetnsLab::run_in(int i, const std::function<void()>& fn) {
  const std::string path = ns_path(ns_name(i));
  std::exception_ptr error;
  std::thread t([&] {
    try {
      int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      KEEL_CHECK(fd >= 0, "open ", path, ": ", std::strerror(errno));
      // setns(CLONE_NEWNET) moves only this thread; the test's other threads stay put.
      int rc = ::setns(fd, CLONE_NEWNET);
      int e = errno;
      ::close(fd);
      KEEL_CHECK(rc == 0, "setns into ", path, ": ", std::strerror(e));
      fn();
    } catch (...) {
      error = std::current_exception();
    }
  });
  t.join();
  if (error) std::rethrow_exception(error);
}

void NetnsLab::cut(int i) {
  ip({"link", "set", veth_name(i), "down"});
}

void NetnsLab::heal(int i) {
  ip({"-n", ns_name(i), "link", "set", "eth0", "up"});
  ip({"link", "set", veth_name(i), "up"});
}

void NetnsLab::repair(int i) {
  kill_machine(i);
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(shm_dir(i), ec))
    std::filesystem::remove_all(e.path(), ec);
  heal(i);
}

std::vector<pid_t> NetnsLab::processes_in(int i) const {
  std::vector<pid_t> pids = pids_in_netns(ns_name(i));
  std::erase(pids, ::getpid());
  return pids;
}

void NetnsLab::kill_machine(int i) {
  std::vector<pid_t> left = kill_all_in(ns_name(i), 5s);
  KEEL_CHECK(left.empty(), left.size(), " processes survived SIGKILL in ", ns_name(i),
             ", e.g. pid ", left.empty() ? 0 : left[0]);
}

void NetnsLab::reap_spawned() noexcept {
  for (pid_t p : spawned_) {
    // Skip what the test has reaped itself: that pid may belong to someone else by now. An
    // unreaped child keeps its pid (and its session's id), so killing those is safe.
    siginfo_t si{};
    if (::waitid(P_PID, static_cast<id_t>(p), &si, WEXITED | WNOHANG | WNOWAIT) != 0) continue;
    ::kill(-p, SIGKILL);
    ::kill(p, SIGKILL);
    while (::waitpid(p, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  spawned_.clear();
}

void NetnsLab::teardown() noexcept {
  for (int i = 0; i < size(); ++i) {
    try {
      kill_all_in(ns_[static_cast<size_t>(i)], 5s);
    } catch (...) {
    }
  }
  reap_spawned();
  for (int i = 0; i < size(); ++i) {
    // Deleting one end of a veth pair deletes both.
    ip_quiet({"link", "del", veth_name(i)});
    ip_quiet({"netns", "del", ns_[static_cast<size_t>(i)]});
  }
  ns_.clear();
  if (!bridge_.empty()) ip_quiet({"link", "del", bridge_});
}

}  // namespace keel::test
