#include "ckpt/checkpoint_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "proto/checkpoint.pb.h"
#include "runtime/check.h"

namespace keel {
namespace {

double unix_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string owner_text(int fd) {
  ckpt::DirOwner o;
  std::string bytes;
  char buf[512];
  ssize_t n = 0;
  while ((n = ::pread(fd, buf, sizeof(buf), off_t(bytes.size()))) > 0) bytes.append(buf, size_t(n));
  if (!o.ParseFromString(bytes) || o.job().empty()) return "another job";
  return detail::concat("job ", o.job(), " (lineage ", o.lineage(), ", pid ", o.pid(), " on ",
                        o.host(), ")");
}

}  // namespace

CheckpointDirLock::CheckpointDirLock(const std::string& dir, const std::string& job,
                                     const std::string& lineage) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw InputError(detail::concat("checkpoint.dir ", dir, ": cannot create: ", ec.message()));
  const std::string path = (std::filesystem::path(dir) / ".keel-owner").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ == -1)
    throw InputError(
        detail::concat("checkpoint.dir ", dir, ": cannot open ", path, ": ", std::strerror(errno)));
  if (::flock(fd_, LOCK_EX | LOCK_NB) == -1) {
    const int err = errno;
    const std::string holder = err == EWOULDBLOCK ? owner_text(fd_) : std::strerror(err);
    ::close(fd_);
    fd_ = -1;
    throw InputError(detail::concat(
        "checkpoint.dir ", dir, ": ", holder,
        " is writing its checkpoints there; two jobs in one directory would overwrite each "
        "other's steps: give this job its own checkpoint.dir (--set checkpoint.dir=...), or "
        "stop that job first"));
  }
  ckpt::DirOwner o;
  o.set_job(job);
  o.set_lineage(lineage);
  char host[256] = {};
  KEEL_CHECK_ERRNO(::gethostname(host, sizeof(host) - 1));
  o.set_host(host);
  o.set_pid(int(::getpid()));
  o.set_since(unix_seconds());
  const std::string bytes = o.SerializeAsString();
  KEEL_CHECK_ERRNO(::ftruncate(fd_, 0));
  KEEL_CHECK(::pwrite(fd_, bytes.data(), bytes.size(), 0) == ssize_t(bytes.size()), path,
             ": cannot write the owner: ", std::strerror(errno));
}

CheckpointDirLock::~CheckpointDirLock() {
  if (fd_ != -1) ::close(fd_);  // closing drops the flock
}

}  // namespace keel
