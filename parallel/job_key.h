// The job's secret: 32 random bytes that every process of one job holds and nothing else
// does. Every connection a keel process accepts proves it (parallel/peer_auth.h), and the
// control plane's CurveZMQ keys derive from it (launcher/control_plane.cc). keel-launch makes
// it at start and keeps it in the run directory (mode 0600); its children inherit it through
// a pipe (spawn_child), never through a command line or a lasting environment variable.
//
// Each process holds one key, the process key: a process serves one job, and every socket it
// opens belongs to that job. A process that installs none (a test, a single keel-worker)
// gets a random key of its own at load time, so its in-process peers and forked children
// still agree and no one else does.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace keel {

class JobKey {
 public:
  static constexpr size_t kBytes = 32;
  using Bytes = std::array<uint8_t, kBytes>;

  // 32 bytes from the kernel's random source.
  static JobKey generate();
  // 64 hex digits (surrounding whitespace ignored). Throws keel::InputError naming `source`
  // (a file or variable) if the text is not one; the message never contains the text.
  static JobKey from_hex(std::string_view hex, const std::string& source);
  // The 32 bytes themselves; throws keel::InputError naming `source` if there are not 32.
  static JobKey from_bytes(std::string_view bytes, const std::string& source);
  // Reads a key file. Refuses (keel::InputError naming the file and its mode) a file that
  // group or others may read or write, as ssh does with private keys, or that cannot be read.
  static JobKey load(const std::string& path);

  // Writes the key as hex to `path`, created with mode 0600 (replacing a file there).
  // Throws keel::Error naming the file if it cannot.
  void save(const std::string& path) const;

  std::string hex() const;
  const Bytes& bytes() const { return bytes_; }
  // HMAC-SHA256 of `label` under the key: a sub-key for one purpose.
  Bytes derive(std::string_view label) const;

  bool operator==(const JobKey& o) const;

 private:
  Bytes bytes_{};
};

// The key of this process (see the file comment).
const JobKey& process_job_key();
// Makes `key` this process's key. Call at start-up, before any thread or connection.
void set_process_job_key(const JobKey& key);

// Takes the key a parent handed over, if any, and makes it the process key: from the pipe
// named by KEEL_SECRET_FD (spawn_child's way), or from KEEL_JOB_SECRET (a way for launchers
// keel does not control), whose value is overwritten in place and unset at once so that
// /proc/PID/environ no longer shows it. Returns where the key came from ("" if from nowhere:
// the process keeps its own). Throws keel::InputError if what was handed over is not a key.
std::string adopt_inherited_job_key();

// The job key's file in a run directory (runs/<job>/secret, mode 0600).
inline constexpr const char* kSecretFile = "secret";

// The environment variable naming the pipe a child reads its key from.
inline constexpr const char* kSecretFdEnv = "KEEL_SECRET_FD";
inline constexpr const char* kSecretEnv = "KEEL_JOB_SECRET";

}  // namespace keel
