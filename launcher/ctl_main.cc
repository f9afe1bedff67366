// keel-ctl: talks to a running job's controller over the control plane.
//   keel-ctl status [--run runs/<job> | --controller tcp://host:port]
//   keel-ctl inject KIND@step=S,rank=R [--run ... | --controller ...]
//   keel-ctl stacks [--name NAME] [--run ... | --controller ...]
//   keel-ctl replay [--run ... | --controller ...]
//   keel-ctl update --plugin PATH [--urgent | --lazy] [--at-step S] [--run ... | --controller ...]
//   keel-ctl plan-standby --machines N --mtbf-hours H --recovery-minutes R [--percentile P]
// Without --run or --controller it finds the newest job under ./runs. Every error is one line
// on stderr, "keel-ctl: error: ...": exit 2 for bad input or a request the controller refused
// (inject at a step already passed, ...), 1 when no controller answers.
#include <unistd.h>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "launcher/control_plane.h"
#include "launcher/standby_plan.h"
#include "runtime/check.h"

namespace {

namespace fs = std::filesystem;

const char* kUsage =
    "usage: keel-ctl status [--run DIR | --controller ENDPOINT]\n"
    "       keel-ctl inject KIND@step=S,rank=R[,...] [--run DIR | --controller ENDPOINT]\n"
    "       keel-ctl stacks [--name NAME] [--run DIR | --controller ENDPOINT]\n"
    "       keel-ctl replay [--run DIR | --controller ENDPOINT]\n"
    "       keel-ctl update --plugin PATH [--urgent | --lazy] [--at-step S]\n"
    "                       [--run DIR | --controller ENDPOINT]\n"
    "       keel-ctl plan-standby --machines N --mtbf-hours H --recovery-minutes R\n"
    "                             [--percentile P (default 99)]\n"
    "DIR is a job's run directory (runs/<job>); by default the newest under ./runs.\n"
    "plan-standby needs no job: it sizes the warm spares for N machines (binomial model).\n";

// Every error keel-ctl reports, from here or from the controller's answer: one line on
// stderr under one prefix, then the exit status (2: refused, bad input; 1: no answer).
int fail(int code, const std::string& why) {
  std::fprintf(stderr, "keel-ctl: error: %s\n", why.c_str());
  return code;
}

std::string find_endpoint(const std::string& run, const std::string& controller) {
  if (!controller.empty()) return controller;
  fs::path dir = run;
  if (dir.empty()) {
    fs::file_time_type newest{};
    if (fs::is_directory("runs"))
      for (const auto& e : fs::directory_iterator("runs"))
        if (fs::exists(e.path() / "controller") && e.last_write_time() >= newest)
          newest = e.last_write_time(), dir = e.path();
    if (dir.empty())
      throw keel::InputError("no job under ./runs; say which with --run or --controller");
  }
  std::ifstream in(dir / "controller");
  std::string ep;
  if (!std::getline(in, ep) || ep.empty())
    throw keel::InputError((dir / "controller").string() +
                           ": missing or empty (is it a keel-launch run directory?)");
  return ep;
}

int status(keel::ControlClient& c) {
  keel::control::Envelope req = keel::make_envelope(0);
  req.mutable_status_request();
  auto rep = c.request(req, std::chrono::seconds(3));
  if (!rep || !rep->has_status_reply()) return fail(1, "the controller did not answer within 3 s");
  const auto& s = rep->status_reply();
  std::printf(
      "state %s | epoch %d | step %lld | loss %.6f | %.0f tok/s | MFU %.1f%% | ETTR %.3f | "
      "%d incident(s)\n",
      s.state().c_str(), s.epoch(), static_cast<long long>(s.step()), s.loss(), s.tokens_per_s(),
      100 * s.mfu(), s.ettr(), s.incidents());
  for (const auto& sl : s.slots()) {
    std::string ranks;
    for (int r : sl.ranks()) {
      if (!ranks.empty()) ranks += ',';
      ranks += std::to_string(r);
    }
    std::printf("slot %2d  %-8s %-16s heartbeat %.1f s ago  ranks %s\n", sl.slot(),
                sl.state().c_str(), sl.host().c_str(), sl.last_heartbeat_age_s(), ranks.c_str());
  }
  for (const auto& r : s.ranks())
    std::printf("rank %3d  slot %2d  pid %7d  step %6lld  %s\n", r.rank(), r.slot(), r.pid(),
                static_cast<long long>(r.step()), r.in_collective() ? "in a collective" : "");
  return 0;
}

int inject(keel::ControlClient& c, const std::string& fault) {
  keel::control::Envelope req = keel::make_envelope(0);
  req.mutable_inject_request()->set_fault(fault);
  auto rep = c.request(req, std::chrono::seconds(3));
  if (!rep || !rep->has_inject_reply()) return fail(1, "the controller did not answer within 3 s");
  // A refusal (a bad fault, a step already passed) names its reason; nothing was injected.
  if (!rep->inject_reply().ok()) return fail(2, rep->inject_reply().message());
  std::printf("%s\n", rep->inject_reply().message().c_str());
  return 0;
}

// Every worker's native stacks, captured by the agents and grouped by the controller: the
// reply names the directory (DIR/stacks/NAME) and the outlier ranks.
int stacks(keel::ControlClient& c, const std::string& name) {
  keel::control::Envelope req = keel::make_envelope(0);
  req.mutable_stacks_request()->set_name(name);
  // The capture itself is bounded by the controller (under the slot timeout per agent).
  auto rep = c.request(req, std::chrono::seconds(15));
  if (!rep || !rep->has_stacks_reply()) return fail(1, "the controller did not answer within 15 s");
  const auto& s = rep->stacks_reply();
  if (s.ok()) std::printf("stacks of every worker in %s\n", s.dir().c_str());
  std::fputs(s.summary().c_str(), stdout);
  if (!s.ok()) return fail(1, "stacks: " + s.message());
  return 0;
}

// Suspected silent data corruption: the controller replays the newest step on groups of
// machines and evicts the one found; this returns once it has taken the request.
int replay(keel::ControlClient& c) {
  keel::control::Envelope req = keel::make_envelope(0);
  req.mutable_replay_request();
  auto rep = c.request(req, std::chrono::seconds(5));
  if (!rep || !rep->has_replay_reply()) return fail(1, "the controller did not answer within 5 s");
  if (!rep->replay_reply().ok()) return fail(2, rep->replay_reply().message());
  std::printf("%s\n", rep->replay_reply().message().c_str());
  return 0;
}

// Swaps the job's model plugin: the controller checks it with every rank, then every rank
// switches at a step boundary (or with the next recovery: --lazy; or at --at-step). This
// returns once the controller has taken the request; the outcome is in the report.
int update(keel::ControlClient& c, const std::string& plugin, bool lazy, int64_t at_step) {
  keel::control::Envelope req = keel::make_envelope(0);
  auto* u = req.mutable_update_request();
  std::error_code ec;
  const fs::path abs = fs::absolute(plugin, ec);
  u->set_plugin(ec ? plugin : abs.string());
  u->set_lazy(lazy);
  u->set_at_step(at_step);
  auto rep = c.request(req, std::chrono::seconds(30));
  if (!rep || !rep->has_update_reply()) return fail(1, "the controller did not answer within 30 s");
  if (!rep->update_reply().ok()) return fail(2, rep->update_reply().message());
  std::printf("%s\n", rep->update_reply().message().c_str());
  return 0;
}

// keel-ctl plan-standby: parses its own flags (it talks to no controller) and prints the
// plan. Bad input throws keel::InputError, which main reports with exit status 2.
int plan_standby_command(int argc, char** argv) {
  auto fail = [](const std::string& what) { throw keel::InputError("plan-standby: " + what); };
  // The whole text must be the number: "10x" or "" is refused, not read as 10 or 0.
  auto parse = [&](const std::string& flag, const char* text) {
    char* end = nullptr;
    errno = 0;
    double v = std::strtod(text, &end);
    if (end == text || *end != '\0' || errno == ERANGE)
      fail(flag + " '" + text + "': not a number");
    return v;
  };
  double machines = -1, mtbf = -1, recovery = -1, percentile = 99;
  bool have_machines = false, have_mtbf = false, have_recovery = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a != "--machines" && a != "--mtbf-hours" && a != "--recovery-minutes" &&
        a != "--percentile")
      fail("unknown argument '" + a + "'\n" + kUsage);
    if (i + 1 >= argc) fail(a + " needs a value");
    const double v = parse(a, argv[++i]);
    if (a == "--machines") {
      if (v != std::floor(v)) fail("--machines " + std::string(argv[i]) + ": not a whole number");
      // Beyond int's range plan_standby would not see the value given, so refuse it here.
      if (std::fabs(v) > keel::kMaxStandbyMachines)
        fail("--machines " + std::string(argv[i]) + ": must be between 1 and " +
             std::to_string(keel::kMaxStandbyMachines));
      machines = v, have_machines = true;
    } else if (a == "--mtbf-hours") {
      mtbf = v, have_mtbf = true;
    } else if (a == "--recovery-minutes") {
      recovery = v, have_recovery = true;
    } else {
      percentile = v;
    }
  }
  if (!have_machines || !have_mtbf || !have_recovery)
    fail(std::string("missing ") +
         (!have_machines ? "--machines"
          : !have_mtbf   ? "--mtbf-hours"
                         : "--recovery-minutes") +
         "\n" + kUsage);
  // plan_standby's errors name "plan-standby:" already; main adds keel-ctl's prefix.
  const keel::StandbyPlan plan =
      keel::plan_standby(static_cast<int>(machines), mtbf, recovery, percentile);
  std::fputs(keel::format_standby_plan(plan).c_str(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 2) return fail(2, std::string("a command is needed\n") + kUsage);
    const std::string cmd = argv[1];
    if (cmd == "plan-standby") return plan_standby_command(argc, argv);
    std::string run, controller, fault, name, plugin;
    bool lazy = false;
    int64_t at_step = 0;
    for (int i = 2; i < argc; ++i) {
      std::string a = argv[i];
      if ((a == "--run" || a == "--controller") && i + 1 < argc) {
        (a == "--run" ? run : controller) = argv[++i];
      } else if (cmd == "stacks" && a == "--name" && i + 1 < argc) {
        name = argv[++i];
      } else if (cmd == "update" && a == "--plugin" && i + 1 < argc) {
        plugin = argv[++i];
      } else if (cmd == "update" && (a == "--lazy" || a == "--urgent")) {
        lazy = a == "--lazy";
      } else if (cmd == "update" && a == "--at-step" && i + 1 < argc) {
        char* end = nullptr;
        at_step = std::strtoll(argv[++i], &end, 10);
        if (!end || *end || at_step < 1)
          return fail(2, std::string("--at-step '") + argv[i] + "': not a step count >= 1");
      } else if (cmd == "inject" && fault.empty() && a.rfind("--", 0) != 0) {
        fault = a;
      } else {
        return fail(2, "unknown argument '" + a + "'\n" + kUsage);
      }
    }
    if (cmd != "status" && cmd != "inject" && cmd != "stacks" && cmd != "replay" &&
        cmd != "update") {
      return fail(2, "unknown command '" + cmd + "'\n" + kUsage);
    }
    if (cmd == "inject" && fault.empty())
      return fail(2, "inject needs a fault, e.g. crash@step=40,rank=3");
    if (cmd == "update" && plugin.empty()) return fail(2, "update needs --plugin PATH");
    keel::ControlClient c(find_endpoint(run, controller), "ctl/" + std::to_string(getpid()));
    if (cmd == "update") return update(c, plugin, lazy, at_step);
    if (cmd == "stacks") return stacks(c, name);
    if (cmd == "replay") return replay(c);
    return cmd == "status" ? status(c) : inject(c, fault);
  } catch (const keel::InputError& e) {
    return fail(2, e.what());
  } catch (const std::exception& e) {
    return fail(1, e.what());
  }
}
