#include "launcher/etcd/etcd_members.h"

#include <arpa/inet.h>
#include <glog/logging.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "launcher/etcd/etcd_client.h"
#include "launcher/etcd/etcd_tls.h"
#include "launcher/processes.h"

namespace keel {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

namespace {

std::string url(const std::string& host, int port, bool tls) {
  return (tls ? kEtcdTlsScheme : "http://") + host + ":" + std::to_string(port);
}

// `binary` itself if it names a path, else the first executable of that name in PATH.
std::string find_binary(const std::string& binary) {
  if (binary.find('/') != std::string::npos) return binary;
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + binary;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  throw InputError("etcd member: '" + binary +
                   "' not found in PATH (scripts/install-deps.sh installs etcd-server)");
}

// The process has exited (reaped here), or was reaped by someone else.
bool exited(pid_t pid) {
  int status = 0;
  const pid_t r = ::waitpid(pid, &status, WNOHANG);
  if (r == -1 && errno == ECHILD) return true;
  KEEL_CHECK_ERRNO(r);
  return r == pid;
}

}  // namespace

std::string etcd_cluster(const std::vector<EtcdMemberSpec>& members) {
  std::string out;
  for (const auto& m : members)
    out += (out.empty() ? "" : ",") + m.name + "=" + url(m.host, m.peer_port, m.tls);
  return out;
}

std::vector<int> free_tcp_ports(const std::string& host, int n) {
  in_addr addr{};
  if (::inet_pton(AF_INET, host.c_str(), &addr) != 1)
    throw InputError("free_tcp_ports: '" + host + "' is no IPv4 address");
  // All held open until every port is known, so that the kernel hands out n distinct ones.
  std::vector<int> fds, ports;
  for (int i = 0; i < n; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    KEEL_CHECK_ERRNO(fd);
    fds.push_back(fd);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr = addr;
    sa.sin_port = 0;
    KEEL_CHECK_ERRNO(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)));
    socklen_t len = sizeof(sa);
    KEEL_CHECK_ERRNO(::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len));
    ports.push_back(ntohs(sa.sin_port));
  }
  for (int fd : fds) KEEL_CHECK_ERRNO(::close(fd));
  return ports;
}

EtcdMember::EtcdMember(EtcdMemberSpec spec) : spec_(std::move(spec)) {
  in_addr addr{};
  if (spec_.name.empty()) throw InputError("etcd member: no name");
  if (::inet_pton(AF_INET, spec_.host.c_str(), &addr) != 1 || addr.s_addr == INADDR_ANY)
    throw InputError("etcd member " + spec_.name + ": host '" + spec_.host +
                     "' must be one IPv4 address of this machine (never 0.0.0.0)");
  if (spec_.client_port <= 0 || spec_.peer_port <= 0 || spec_.client_port == spec_.peer_port)
    throw InputError("etcd member " + spec_.name + ": client and peer ports must be two ports");
  if (spec_.data_dir.empty() || spec_.log_path.empty() || spec_.cluster.empty() ||
      spec_.token.empty())
    throw InputError("etcd member " + spec_.name + ": data dir, log, cluster and token needed");
  if (fs::exists(spec_.data_dir) && !fs::is_empty(spec_.data_dir))
    throw InputError("etcd member " + spec_.name + ": data dir " + spec_.data_dir +
                     " is not empty (a stale member's data would rejoin its old cluster)");
  start();
}

void EtcdMember::restart() {
  KEEL_CHECK(!running(), "etcd member ", spec_.name, ": restart while it runs");
  // Its data dir holds its member id and log: it rejoins its cluster as itself (the
  // --initial-cluster flags are ignored once a data dir exists), and catches up from the
  // leader.
  start();
}

void EtcdMember::start() {
  const std::string peer = url(spec_.host, spec_.peer_port, spec_.tls);
  const std::string client = url(spec_.host, spec_.client_port, spec_.tls);
  std::vector<std::string> argv = {
      find_binary(spec_.binary),
      "--name=" + spec_.name,
      "--data-dir=" + spec_.data_dir,
      "--listen-client-urls=" + client,
      "--advertise-client-urls=" + client,
      "--listen-peer-urls=" + peer,
      "--initial-advertise-peer-urls=" + peer,
      "--initial-cluster=" + spec_.cluster,
      "--initial-cluster-token=" + spec_.token,
      spec_.join_existing ? "--initial-cluster-state=existing" : "--initial-cluster-state=new",
      "--heartbeat-interval=" + std::to_string(spec_.heartbeat_ms),
      "--election-timeout=" + std::to_string(spec_.election_timeout_ms),
      // A lost member is removed and a new one added at once (launcher/controller/
      // etcd_upkeep.h), one change at a time, each keeping a quorum; etcd's strict check
      // would refuse them until its leader had had a quorum for 5 s, too late when machines
      // fail seconds apart.
      "--strict-reconfig-check=false",
      // A member cut off by a partition campaigns alone and raises its term; back, it would
      // depose the leader and cost seconds without one (seen: the ranks' store calls timed
      // out and four ranks restarted). With pre-vote it asks before it campaigns, and is told
      // that a leader leads.
      "--pre-vote=true",
      // Memory bounded over a job of thousands of recoveries: old revisions compacted every
      // minute, the Raft log cut to a snapshot every 1,000 entries (etcd's default keeps
      // 100,000 in memory).
      "--auto-compaction-mode=periodic",
      "--auto-compaction-retention=1m",
      "--snapshot-count=1000",
      // Structured logs to stderr, which spawn_child sends to the log file (etcd 3.4's
      // default logger is deprecated and warns about it).
      "--logger=zap",
      "--log-outputs=stderr",
  };
  if (spec_.tls) {
    // The job's CA and a certificate of this member's own (launcher/etcd/etcd_tls.h); every
    // client and every peer must show one too.
    const std::string dir = tls_dir();
    write_etcd_certs(issue_etcd_certs(spec_.host), dir);
    for (const char* side : {"", "peer-"})
      argv.insert(argv.end(), {std::string("--") + side + "cert-file=" + dir + "/cert.pem",
                               std::string("--") + side + "key-file=" + dir + "/key.pem",
                               std::string("--") + side + "trusted-ca-file=" + dir + "/ca.pem",
                               std::string("--") + side + "client-cert-auth=true"});
  }
  started_ = steady_clock::now();
  // SIGKILL with its parent: a member outliving its launcher would hold a quorum vote for a
  // job that is gone.
  pid_ = spawn_child(argv, {}, spec_.log_path, SIGKILL);
  LOG(INFO) << "etcd member " << spec_.name << " (pid " << pid_ << ") starting on " << client
            << ", log " << spec_.log_path;
}

bool EtcdMember::running() {
  return pid_ > 0 && !exited(pid_);
}

EtcdMember::~EtcdMember() {
  try {
    stop();
  } catch (const std::exception& e) {
    LOG(ERROR) << "etcd member " << spec_.name << ": stop failed: " << e.what();
  }
}

std::string EtcdMember::endpoint() const {
  return (spec_.tls ? kEtcdTlsScheme : "") + spec_.host + ":" + std::to_string(spec_.client_port);
}

std::string EtcdMember::tls_dir() const {
  return spec_.data_dir + ".tls";
}

void EtcdMember::wait_healthy(milliseconds timeout) {
  KEEL_CHECK(pid_ > 0, "etcd member ", spec_.name, ": not running");
  const auto deadline = steady_clock::now() + timeout;
  // Short calls, so that a member that exits is noticed within a fraction of the timeout.
  EtcdClient probe({endpoint()}, milliseconds(200));
  std::string last = "no answer";
  for (;;) {
    if (exited(pid_)) {
      pid_ = -1;
      throw EtcdUnavailable("etcd member " + spec_.name + " exited while starting; its log (" +
                                spec_.log_path + ") ends:\n" + log_tail(),
                            0);
    }
    try {
      const EtcdStatus s = probe.status();
      if (s.leader_id != 0) break;
      last = "answers, knows no leader yet";
      // The other members are still starting: ask again shortly, not in a tight loop.
      std::this_thread::sleep_for(milliseconds(20));
    } catch (const EtcdError& e) {
      last = e.what();
    }
    if (steady_clock::now() >= deadline)
      throw EtcdUnavailable("etcd member " + spec_.name + " not healthy within " +
                                std::to_string(timeout.count()) + " ms (" + last + "); its log (" +
                                spec_.log_path + ") ends:\n" + log_tail(),
                            0);
  }
  startup_time_ = std::chrono::duration_cast<milliseconds>(steady_clock::now() - started_);
  LOG(INFO) << "etcd member " << spec_.name << " healthy after " << startup_time_.count() << " ms";
}

void EtcdMember::stop() {
  if (pid_ > 0) {
    // SIGKILL, not SIGTERM: its data is removed next, so a graceful stop saves nothing, and a
    // member whose peers are gone would try to reach them for seconds before it exits.
    if (::kill(pid_, SIGKILL) == -1) KEEL_CHECK(errno == ESRCH, "kill etcd member");
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, 0);
    KEEL_CHECK(r == pid_ || (r == -1 && errno == ECHILD), "waitpid etcd member");
    pid_ = -1;
  }
  std::error_code ec;
  fs::remove_all(spec_.data_dir, ec);
  KEEL_CHECK(!ec, "remove etcd data dir ", spec_.data_dir, ": ", ec.message());
  fs::remove_all(tls_dir(), ec);
  KEEL_CHECK(!ec, "remove etcd certificates ", tls_dir(), ": ", ec.message());
}

std::string EtcdMember::log_tail() const {
  std::ifstream in(spec_.log_path);
  if (!in) return "(no log)";
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  constexpr size_t kTail = 2000;
  return text.size() > kTail ? "..." + text.substr(text.size() - kTail) : text;
}

}  // namespace keel
