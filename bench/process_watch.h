// The processes of one job, found by a tag in their environment, and their resident memory
// over time. A job's processes fork, exec, start their own sessions and outlive their parents,
// so neither the process tree nor a session id finds them all; the environment is inherited
// through all of that. The soak starts keel-launch with KEEL_SOAK_TAG=<tag>.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace keel::bench {

class ProcessWatch {
 public:
  struct Sample {
    double t;     // seconds since the watch began
    int64_t rss;  // anonymous resident bytes (RssAnon)
  };
  struct Process {
    pid_t pid = 0;
    std::string name;  // /proc/<pid>/comm
    std::vector<Sample> samples;
  };

  // Watches processes whose environment holds `tag` (as "NAME=VALUE").
  explicit ProcessWatch(std::string tag);

  // Samples the resident memory of every tagged process alive now; returns how many.
  int sample();
  // The tagged processes alive now, as "name (pid)".
  std::vector<std::string> alive() const;
  // Every process ever seen, by (pid, start time): a long soak starts tens of thousands of
  // processes, and pids wrap, so a pid alone names several of them.
  using Key = std::pair<pid_t, unsigned long long>;
  const std::map<Key, Process>& seen() const { return seen_; }

 private:
  std::vector<pid_t> tagged() const;
  std::string tag_;
  double t0_;
  std::map<Key, Process> seen_;
};

}  // namespace keel::bench
