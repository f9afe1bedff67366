// Several "machines" on one box for multi-machine tests: each is a network namespace with
// its own address on a private bridge, so a job really talks over IP between machines, a
// cut link is a real partition and a killed namespace is a lost machine.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace keel::test {

// N machines keel<pid>m<i>, each with `eth0` = 10.231.x.(11+i)/24 on a veth pair whose host
// end is on the bridge kl<pid>br (10.231.x.1/24, also each machine's default route). x and
// every name derive from the test process's pid, so test binaries running in parallel
// never share a name or (barring a collision the constructor avoids) a subnet. One lab per
// process at a time. Needs root; tests call available() first and skip otherwise.
class NetnsLab {
 public:
  // True when labs can be built here: root, `ip` (iproute2) present, `ip netns add` works.
  // Otherwise false with the reason in *why (for GTEST_SKIP() << why).
  static bool available(std::string* why);

  // Removes namespaces, veths and bridges left by labs of processes that no longer exist
  // (their names embed the pid), killing whatever still runs inside them. The constructor
  // calls it; it never throws.
  static void cleanup_stale();

  // Builds the bridge and `machines` namespaces (1..200). Throws keel::Error naming the
  // `ip` command that failed, after removing what it had built.
  explicit NetnsLab(int machines);
  // Kills every process inside the machines and deletes namespaces, veths and the bridge,
  // also after a failed test.
  ~NetnsLab();
  NetnsLab(const NetnsLab&) = delete;
  NetnsLab& operator=(const NetnsLab&) = delete;

  int size() const { return static_cast<int>(ns_.size()); }
  // Machine i's IPv4 address, e.g. "10.231.57.11".
  std::string address(int i) const;
  // The host's address on the bridge (every machine's gateway).
  std::string bridge_address() const;
  const std::string& ns_name(int i) const;
  const std::string& bridge_name() const { return bridge_; }
  // The interface that carries a machine's address inside its namespace (for KEEL_IFNAME).
  std::string ifname() const { return "eth0"; }
  // "ip netns exec keel<pid>m<i> ": prefix for a shell command line run on machine i.
  std::string exec_prefix(int i) const;

  // Machine i's own /dev/shm: every program spawned on it sees this directory there (a
  // mount namespace of its own with it bind-mounted), so a process on one machine can never
  // open another machine's shared memory by name.
  std::string shm_dir(int i) const;

  // Starts argv on machine i (PATH is searched for argv[0]) as the leader of a new session,
  // so kill(-pid, sig) reaches everything it starts. `env` entries ("NAME=value") are added
  // to this process's environment, replacing a variable of the same name. stdout and stderr
  // go to log_path (truncated), or stay this process's when it is empty. Throws keel::Error
  // if the program cannot be started. The caller may waitpid() it; the lab reaps it
  // otherwise.
  pid_t spawn(int i, const std::vector<std::string>& argv, const std::vector<std::string>& env = {},
              const std::string& log_path = "");

  // Runs fn on a new thread of this process that has joined machine i's network namespace
  // (sockets it creates live there, also when used later from other threads), waits for
  // it, and rethrows what fn threw. The calling thread stays where it is.
  void run_in(int i, const std::function<void()>& fn);

  // A partition: machine i's link goes down at the bridge, so nothing reaches it or leaves
  // it, while its processes and its own address stay. heal() brings the link back up at both
  // ends, whichever end was taken down (cut() here, or `ip link set eth0 down` from inside,
  // as keel's partition fault does), its processes untouched.
  void cut(int i);
  void heal(int i);

  // SIGKILLs every process inside machine i's namespace (a lost machine) and returns once
  // none is left; throws keel::Error if some survive 5 s.
  void kill_machine(int i);

  // Machine i back from repair, as after a reboot: every process in it killed (kill_machine),
  // its /dev/shm (shm_dir) emptied, and its link up at both ends, whichever end a partition
  // took down (cut() here, or `ip link set eth0 down` from inside). Throws keel::Error as
  // kill_machine does, or naming the `ip` command that failed.
  void repair(int i);

  // Pids of the processes whose network namespace is machine i's.
  std::vector<pid_t> processes_in(int i) const;

 private:
  std::string veth_name(int i) const;
  void teardown() noexcept;
  void reap_spawned() noexcept;

  pid_t pid_;
  int subnet_ = 0;  // x of 10.231.x.0/24
  std::string bridge_;
  std::vector<std::string> ns_;  // names of the namespaces created so far
  std::vector<pid_t> spawned_;
};

}  // namespace keel::test
