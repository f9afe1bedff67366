// keel-ctl: talks to a running job's controller over the control plane.
//   keel-ctl status [--run runs/<job> | --controller tcp://host:port]
//   keel-ctl inject KIND@step=S,rank=R [--run ... | --controller ...]
//   keel-ctl stacks [--name NAME] [--run ... | --controller ...]
//   keel-ctl replay [--run ... | --controller ...]
//   keel-ctl update --plugin PATH [--urgent | --lazy] [--at-step S] [--run ... | --controller ...]
//   keel-ctl plan-standby --machines N --mtbf-hours H --recovery-minutes R [--percentile P]
// Without --run or --controller it finds the newest job under ./runs whose controller answers
// (status also reads an ended job's report). Every error is one line
// on stderr, "keel-ctl: error: ...": exit 2 for bad input or a request the controller refused
// (inject at a step already passed, ...), 1 when no controller answers. The command line is
// CLI11's (runtime/cli.h): one subcommand, each with its own --help.
#include <unistd.h>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "launcher/control_plane.h"
#include "launcher/run_dir_finder.h"
#include "robust/standby_plan.h"
#include "runtime/check.h"
#include "runtime/cli.h"
#include "runtime/logging.h"

namespace {

namespace fs = std::filesystem;

// Every error keel-ctl reports, from here or from the controller's answer: one line on
// stderr under one prefix, then the exit status (2: refused, bad input; 1: no answer).
int fail(int code, const std::string& why) {
  std::fprintf(stderr, "keel-ctl: error: %s\n", why.c_str());
  return code;
}

// The job a command talks to: --controller's, --run's, or the newest under ./runs whose
// controller answers (keel-ctl status also takes the newest ended one, to read its report).
keel::FoundRun find_job(const std::string& run, const std::string& controller,
                        const std::string& secret_file, bool status) {
  if (!controller.empty()) {
    // A malformed endpoint is the user's input, not a controller that did not answer.
    try {
      keel::endpoint_host(controller);
    } catch (const keel::InputError& e) {
      throw keel::InputError(std::string("--controller: ") + e.what());
    }
    keel::FoundRun r;
    r.endpoint = controller;
    if (!secret_file.empty()) {
      r.key = keel::JobKey::load(secret_file);
    } else if (!keel::adopt_inherited_job_key().empty()) {
      r.key = keel::process_job_key();
    } else {
      r.key_error =
          "--controller needs the job's secret: --secret-file FILE (runs/<job>/secret) or "
          "KEEL_JOB_SECRET in the environment";
    }
    return r;
  }
  keel::FoundRun r = run.empty() ? keel::find_run("runs", status) : keel::read_run(run);
  if (r.end_code && !status)
    throw keel::InputError(r.dir + ": the job has ended (exit " + std::to_string(*r.end_code) +
                           "); there is no controller to ask");
  return r;
}

// keel-ctl status of a job that has ended: its report, which needs no controller.
int ended_status(const keel::FoundRun& r) {
  std::printf("state ended | exit %d | run %s\n", *r.end_code, r.dir.c_str());
  const auto rep = keel::read_run_report(r.dir);
  if (!rep) {
    std::printf("no report in %s/report.json (--report put it elsewhere, or none was written)\n",
                r.dir.c_str());
    return 0;
  }
  std::printf("%s after %d step(s) | final loss %.6f | ETTR %.3f | %d incident(s)%s%s\n",
              rep->stopped() ? "stopped" : "done", rep->steps_completed(), rep->final_loss(),
              rep->ettr(), rep->incidents_size(), rep->param_checksum().empty() ? "" : " | params ",
              rep->param_checksum().c_str());
  if (rep->stopped()) std::printf("why: %s\n", rep->stop_reason().c_str());
  return 0;
}

// How long keel-ctl waits for the controller's answer. The controller answers from its loop,
// which never blocks longer than a poll, so a status or an inject comes back at once; a
// stacks request waits for every agent's capture (each bounded under the slot timeout); a
// replay request is taken before the replay runs; an update request first checks the plugin
// with every rank (each loads it and compares its parameter table).
constexpr std::chrono::seconds kAnswerWait{3};
constexpr std::chrono::seconds kStacksWait{15};
constexpr std::chrono::seconds kReplayWait{5};
constexpr std::chrono::seconds kUpdateWait{30};

int no_answer(keel::ControlClient& c, std::chrono::seconds waited) {
  // A refused key is the user's to fix (exit 2), not a controller that is not there.
  if (const std::string why = c.handshake_refused(); !why.empty()) return fail(2, why);
  return fail(1, "the controller did not answer within " + std::to_string(waited.count()) + " s");
}

int status(keel::ControlClient& c) {
  keel::control::Envelope req = keel::make_envelope(0);
  req.mutable_status_request();
  auto rep = c.request(req, kAnswerWait);
  if (!rep || !rep->has_status_reply()) return no_answer(c, kAnswerWait);
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
  auto rep = c.request(req, kAnswerWait);
  if (!rep || !rep->has_inject_reply()) return no_answer(c, kAnswerWait);
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
  auto rep = c.request(req, kStacksWait);
  if (!rep || !rep->has_stacks_reply()) return no_answer(c, kStacksWait);
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
  auto rep = c.request(req, kReplayWait);
  if (!rep || !rep->has_replay_reply()) return no_answer(c, kReplayWait);
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
  auto rep = c.request(req, kUpdateWait);
  if (!rep || !rep->has_update_reply()) return no_answer(c, kUpdateWait);
  if (!rep->update_reply().ok()) return fail(2, rep->update_reply().message());
  std::printf("%s\n", rep->update_reply().message().c_str());
  return 0;
}

// keel-ctl plan-standby: sizes the warm spares for N machines; it talks to no controller.
// Bad input throws keel::InputError, which main reports with exit status 2.
int plan_standby_command(double machines, double mtbf, double recovery, double percentile) {
  // plan_standby takes an int: a fraction, or a count beyond int's range, would not be the
  // value given, so refuse them here.
  if (machines != std::floor(machines))
    throw keel::InputError(
        keel::detail::concat("plan-standby: --machines ", machines, ": not a whole number"));
  if (std::fabs(machines) > keel::kMaxStandbyMachines)
    throw keel::InputError(keel::detail::concat("plan-standby: --machines ", machines,
                                                ": must be between 1 and ",
                                                keel::kMaxStandbyMachines));
  // plan_standby's errors name "plan-standby:" already; main adds keel-ctl's prefix.
  const keel::StandbyPlan plan =
      keel::plan_standby(static_cast<int>(machines), mtbf, recovery, percentile);
  std::fputs(keel::format_standby_plan(plan).c_str(), stdout);
  return 0;
}

// Which job a command talks to: --run DIR or --controller ENDPOINT (default: the newest job
// under ./runs).
struct Target {
  std::string run, controller, secret_file;
};

CLI::App* add_command(CLI::App& app, const std::string& name, const std::string& what, Target* t) {
  CLI::App* sub = app.add_subcommand(name, what);
  auto* run = sub->add_option("--run", t->run,
                              "the job's run directory runs/<job> (default: the newest under "
                              "./runs)")
                  ->type_name("DIR");
  sub->add_option("--controller", t->controller,
                  "the job's controller, as runs/<job>/controller names it (instead of --run)")
      ->type_name("ENDPOINT")
      ->excludes(run);
  sub->add_option("--secret-file", t->secret_file,
                  "the job's secret, runs/<job>/secret (with --controller; --run reads it from "
                  "the run directory)")
      ->type_name("FILE")
      ->excludes(run);
  return sub;
}

// --at-step: the whole text a step count >= 1 ("10x", "0" and "-3" are refused).
CLI::Validator step_count() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || *end != '\0' || errno == ERANGE || v < 1)
          return "'" + text + "': not a step count >= 1";
        return "";
      },
      "");
}

// update --plugin: a file that is there and is no directory, checked before the job is asked,
// so that a typo is told as such and not as the controller's answer to something else (an
// update still on probation answers every request alike). keel-ctl and the controller share
// the file system the path is on (keel-ctl finds the job by its run directory).
CLI::Validator plugin_file() {
  return keel::cli::refuse_if([](const std::string& path) -> std::string {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (!fs::exists(st)) return "no such file";
    if (fs::is_directory(st)) return "is a directory, expected a plugin's shared object (.so)";
    return "";
  });
}

}  // namespace

int main(int argc, char** argv) {
  keel::init_logging(argv[0]);
  CLI::App app(
      "keel-ctl: talks to a running job's controller (status, inject, stacks, replay, "
      "update), or sizes warm standbys (plan-standby).",
      "keel-ctl");
  app.require_subcommand(0, 1);
  Target target;
  add_command(app, "status", "the job's state, slots and ranks", &target);

  std::string fault;
  add_command(app, "inject", "inject a fault into the running job", &target)
      ->add_option("fault", fault,
                   "KIND@step=S,rank=R[,...], as keel-launch --fault takes it, e.g. "
                   "crash@step=40,rank=3")
      ->type_name("FAULT");

  std::string name;
  add_command(app, "stacks", "capture every worker's native stacks, grouped", &target)
      ->add_option("--name", name, "the capture's name: it goes to runs/<job>/stacks/NAME")
      ->type_name("NAME");

  add_command(app, "replay",
              "suspected silent data corruption: replay the newest step on groups of machines "
              "and evict the one found",
              &target);

  std::string plugin;
  bool lazy = false, urgent = false;
  int64_t at_step = 0;
  CLI::App* update_cmd = add_command(
      app, "update", "swap the job's model plugin, checked first with every rank", &target);
  update_cmd->add_option("--plugin", plugin, "the new plugin (a shared library)")
      ->type_name("PATH")
      ->required()
      ->check(plugin_file());
  auto* lazy_flag = update_cmd->add_flag(
      "--lazy", lazy, "switch with the next recovery, not at a step boundary (not with --urgent)");
  update_cmd->add_flag("--urgent", urgent, "switch at the next step boundary (the default)")
      ->excludes(lazy_flag);
  update_cmd->add_option("--at-step", at_step, "switch at step S")
      ->type_name("S")
      ->check(step_count());

  // Placeholders by option_text, not type_name: parse() knows a floating-point flag by its type
  // name (FLOAT) to refuse NaN and infinities (runtime/cli.h).
  double machines = 0, mtbf = 0, recovery = 0, percentile = 99;
  CLI::App* plan = app.add_subcommand(
      "plan-standby", "size the warm spares for N machines (binomial model); needs no job");
  plan->add_option("--machines", machines, "machines in the job")->option_text("N")->required();
  plan->add_option("--mtbf-hours", mtbf, "mean time between failures of one machine")
      ->option_text("H")
      ->required();
  plan->add_option("--recovery-minutes", recovery, "time to bring back a lost machine")
      ->option_text("R")
      ->required();
  plan->add_option("--percentile", percentile, "cover this percentile of failures (default 99)")
      ->option_text("P");

  if (auto rc = keel::cli::parse(app, argc, argv)) return *rc;
  try {
    if (app.got_subcommand(plan)) return plan_standby_command(machines, mtbf, recovery, percentile);
    if (app.get_subcommands().empty())
      return keel::cli::usage_error(
          app, "a command is needed: status, inject, stacks, replay, update or plan-standby");
    const std::string cmd = app.get_subcommands().front()->get_name();
    if (cmd == "inject" && fault.empty())
      return keel::cli::usage_error(app, "inject needs a fault, e.g. crash@step=40,rank=3");
    const keel::FoundRun job =
        find_job(target.run, target.controller, target.secret_file, cmd == "status");
    if (job.end_code) return ended_status(job);
    // The control plane admits only the job's keys (launcher/control_plane.h).
    if (!job.key) throw keel::InputError(job.key_error);
    keel::set_process_job_key(*job.key);
    keel::ControlClient c(job.endpoint, "ctl/" + std::to_string(getpid()));
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
