#include "launcher/run_dir_finder.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "launcher/control_plane.h"
#include "proto/events.pb.h"
#include "proto/json_gaps.h"
#include "runtime/check.h"

namespace keel {
namespace {

namespace fs = std::filesystem;

// How long a run's controller gets to answer the probe, and how many unanswering runs are
// probed before giving up: each dead one costs the wait.
constexpr std::chrono::milliseconds kProbeWait{1000};
constexpr int kMaxProbes = 4;

// The exit code in the event log's `end` event, written last by keel-launch.
std::optional<int> end_code(const fs::path& dir) {
  std::ifstream in(dir / "events.jsonl");
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  events::Event e;
  google::protobuf::util::JsonParseOptions opts;
  opts.ignore_unknown_fields = true;
  if (last.empty() || !google::protobuf::util::JsonStringToMessage(last, &e, opts).ok() ||
      e.kind() != "end")
    return std::nullopt;
  const auto& f = e.data().fields();
  auto it = f.find("code");
  return it == f.end() ? 0 : int(it->second.number_value());
}

bool answers(const std::string& endpoint) {
  try {
    ControlClient c(endpoint, "ctl/probe/" + std::to_string(::getpid()));
    control::Envelope req = make_envelope(0);
    req.mutable_status_request();
    auto rep = c.request(req, kProbeWait);
    return rep && rep->has_status_reply();
  } catch (const std::exception&) {
    return false;  // a malformed endpoint file: not a job to talk to
  }
}

}  // namespace

FoundRun read_run(const std::string& dir) {
  FoundRun r;
  r.dir = dir;
  std::ifstream in(fs::path(dir) / "controller");
  if (!std::getline(in, r.endpoint) || r.endpoint.empty())
    throw InputError((fs::path(dir) / "controller").string() +
                     ": missing or empty (is it a keel-launch run directory?)");
  r.end_code = end_code(dir);
  try {
    r.key = JobKey::load((fs::path(dir) / kSecretFile).string());
  } catch (const InputError& e) {
    r.key_error =
        std::string(e.what()) + "; only who can read the job's run directory may command the job";
  }
  return r;
}

FoundRun find_run(const std::string& runs_dir, bool accept_ended) {
  // Newest first, by the controller file, written once when the controller binds.
  std::vector<std::pair<fs::file_time_type, fs::path>> runs;
  std::error_code ec;
  if (fs::is_directory(runs_dir, ec))
    for (const auto& e : fs::directory_iterator(runs_dir, ec)) {
      const fs::file_time_type t = fs::last_write_time(e.path() / "controller", ec);
      if (!ec) runs.emplace_back(t, e.path());
    }
  if (runs.empty())
    throw InputError("no job under ./" + runs_dir + "; say which with --run or --controller");
  std::sort(runs.begin(), runs.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  std::optional<FoundRun> ended;
  std::string key_error;
  int probes = 0;
  for (const auto& [t, dir] : runs) {
    FoundRun r;
    try {
      r = read_run(dir.string());
    } catch (const InputError&) {
      continue;
    }
    if (r.end_code) {
      if (!ended) ended = r;
      continue;
    }
    if (!r.key) {
      // Not ours to ask: its controller would refuse us.
      if (key_error.empty()) key_error = r.key_error;
      continue;
    }
    if (probes++ == kMaxProbes) break;
    set_process_job_key(*r.key);
    if (answers(r.endpoint)) return r;
  }
  if (accept_ended && ended) return *ended;
  throw InputError(detail::concat(
      "no running job under ./", runs_dir, " answers (newest: ", runs.front().second.string(),
      ended ? detail::concat("; newest ended: ", ended->dir) : std::string(),
      key_error.empty() ? std::string() : "; " + key_error,
      "); say which with --run or --controller"));
}

std::optional<report::RunReport> read_run_report(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "report.json");
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  report::RunReport r;
  if (!message_from_json(text.str(), &r).empty()) return std::nullopt;
  return r;
}

}  // namespace keel
