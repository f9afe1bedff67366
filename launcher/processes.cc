#include "launcher/processes.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <set>
#include <vector>

#include "ckpt/snapshot_region.h"
#include "launcher/job_env.h"
#include "parallel/job_key.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {

std::string self_exe_path() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  KEEL_CHECK_ERRNO(n);
  std::string path(buf, size_t(n));
  const std::string deleted = " (deleted)";
  if (path.size() > deleted.size() &&
      path.compare(path.size() - deleted.size(), deleted.size(), deleted) == 0)
    path.resize(path.size() - deleted.size());
  return path;
}

void set_process_name(const char* name) {
  // Longer names are cut to 15 characters by the kernel; only a bad pointer fails.
  KEEL_CHECK_ERRNO(prctl(PR_SET_NAME, name, 0, 0, 0));
}

pid_t spawn_child(const std::vector<std::string>& argv,
                  const std::map<std::string, std::string>& env, const std::string& log_path,
                  int death_signal) {
  const pid_t parent = getpid();
  const std::string self = self_exe_path();
  std::vector<std::string> args_owned = argv;
  if (args_owned[0] == "/proc/self/exe") args_owned[0] = self;
  // Built before fork(): the child of a threaded process should not allocate.
  std::vector<char*> args;
  for (const auto& a : args_owned) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const std::string exec_failed = "keel: exec " + args_owned[0];
  // keel's own programs get the job key through a pipe they read at start-up: nothing on a
  // command line, nothing lasting in the environment, nothing for other programs (etcd).
  int key_pipe[2] = {-1, -1};
  std::string key_fd;
  if (args_owned[0] == self ||
      std::filesystem::path(args_owned[0]).filename().string().rfind("keel-", 0) == 0) {
    KEEL_CHECK_ERRNO(::pipe2(key_pipe, O_CLOEXEC));
    const std::string hex = process_job_key().hex();
    // 64 bytes: a pipe's buffer always takes them.
    KEEL_CHECK(::write(key_pipe[1], hex.data(), hex.size()) == ssize_t(hex.size()),
               "the job key's pipe: ", std::strerror(errno));
    ::close(key_pipe[1]);
    key_fd = std::to_string(key_pipe[0]);
  }
  std::fflush(nullptr);
  pid_t pid = fork();
  KEEL_CHECK_ERRNO(pid);
  if (pid != 0) {
    if (key_pipe[0] >= 0) ::close(key_pipe[0]);
    return pid;
  }
  if (key_pipe[0] >= 0) {
    fcntl(key_pipe[0], F_SETFD, 0);  // kept across exec
    setenv(kSecretFdEnv, key_fd.c_str(), 1);
  }
  // Die with the parent, whatever kills it (SIGKILL included); and if it died between
  // fork() and prctl(), the parent is already someone else: leave at once.
  if (prctl(PR_SET_PDEATHSIG, death_signal) != 0 || getppid() != parent) _exit(1);
  for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  if (!log_path.empty()) {
    int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
  }
  execv(args[0], args.data());
  // This binary's file was deleted (a rebuild): /proc/self/exe is still the same binary.
  if (errno == ENOENT && args_owned[0] == self) execv("/proc/self/exe", args.data());
  // Straight to stderr, not through glog: in the child of a threaded process, after fork(),
  // glog's locks may be held by a thread that is not here.
  std::perror(exec_failed.c_str());
  _exit(127);
}

std::string etcd_shm_dir(const std::string& job) {
  return "/dev/shm/keel-etcd-" + job;
}

void remove_stale_segments() {
  DIR* dir = ::opendir("/dev/shm");
  if (!dir) return;
  std::set<std::string> stale;
  std::vector<std::string> stale_etcd;
  while (dirent* e = ::readdir(dir)) {
    // "keel-<job>-<kind>...", the job id "<pid>-<8 hex digits>" (make_job_id); an etcd
    // member's data of a killed job, "keel-etcd-<job>".
    const std::string name = e->d_name, prefix = "keel-", etcd = "keel-etcd-";
    if (name.compare(0, etcd.size(), etcd) == 0) {
      const std::optional<int> pid = job_owner_pid(name.substr(etcd.size()));
      if (pid && ::kill(*pid, 0) != 0 && errno == ESRCH) stale_etcd.push_back(name);
      continue;
    }
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = name.substr(prefix.size());
    const std::optional<int> pid = job_owner_pid(rest);
    const size_t tag_end = rest.find('-', rest.find('-') + 1);
    if (!pid || tag_end == std::string::npos) continue;
    if (::kill(*pid, 0) != 0 && errno == ESRCH) stale.insert(rest.substr(0, tag_end));
  }
  ::closedir(dir);
  for (const auto& name : stale_etcd) {
    std::error_code ec;
    std::filesystem::remove_all("/dev/shm/" + name, ec);
    if (!ec) LOG(INFO) << "removed the etcd data of ended job " << name.substr(10);
  }
  for (const auto& job : stale) {
    const int n = unlink_job_segments(job);
    if (n > 0) LOG(INFO) << "removed " << n << " shared-memory segment(s) of ended job " << job;
  }
}

}  // namespace keel
