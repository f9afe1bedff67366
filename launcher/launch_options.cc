#include "launcher/launch_options.h"

#include <arpa/inet.h>

#include <filesystem>
#include <map>
#include <string>

#include "runtime/cli.h"
#include "runtime/text.h"

namespace keel {
namespace {

namespace fs = std::filesystem;

// --run-dir: a directory, or one that can be made (its nearest existing part a directory), so
// that a file in the way is a usage error naming the flag, not a filesystem_error later.
std::string run_dir_problem(const std::string& dir) {
  std::error_code ec;
  fs::path existing = fs::absolute(dir, ec);
  if (ec) return "cannot resolve: " + ec.message();
  const fs::path whole = existing;
  while (!fs::exists(existing, ec) && existing.has_relative_path())
    existing = existing.parent_path();
  if (fs::is_directory(existing, ec)) return "";
  return existing == whole ? "is a file, expected a directory (runs/<job>/ goes under it)"
                           : existing.string() + " is a file, so the directory cannot be made";
}

// --etcd: host:port of each member, comma-separated, as the etcd client takes them (an IPv4
// address, optionally after http:// or https://): refused here by the flag, before any slot.
std::string etcd_endpoints_problem(const std::string& list) {
  const std::string want =
      "expected host:port of each member, comma-separated, the host an IPv4 address "
      "(e.g. 127.0.0.1:2379)";
  size_t start = 0;
  while (true) {
    const size_t comma = list.find(',', start);
    std::string e = list.substr(start, comma == std::string::npos ? comma : comma - start);
    for (const char* scheme : {"https://", "http://"})
      if (e.rfind(scheme, 0) == 0) e = e.substr(std::string(scheme).size());
    const size_t colon = e.rfind(':');
    in_addr addr{};
    if (colon == std::string::npos || ::inet_pton(AF_INET, e.substr(0, colon).c_str(), &addr) != 1)
      return want;
    const std::string port = e.substr(colon + 1);
    if (port.empty() || port.size() > 5 ||
        port.find_first_not_of("0123456789") != std::string::npos || std::stoul(port) == 0 ||
        std::stoul(port) > 65535)
      return "'" + e.substr(colon + 1) + "' is not a port (1 to 65535)";
    if (comma == std::string::npos) return "";
    start = comma + 1;
  }
}

// --failure-domain: labels of letters, digits and ._:- (at most 64 each), comma-separated.
std::string failure_domain_problem(const std::string& list) {
  for (const std::string& label : split(list, ',', /*skip_empty=*/false)) {
    if (label.empty() || label.size() > 64 ||
        label.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                "0123456789._:-") != std::string::npos)
      return "'" + label +
             "' is not a failure domain label (1 to 64 letters, digits and ._:-; several "
             "comma-separated under --local)";
  }
  return "";
}

// The flags keel-launch does not read but hands to every keel-worker, in the order given.
constexpr const char* kWorkerFlags[] = {"--report", "--loss-svg", "--fault", "--inject",
                                        "--export-llmc"};

struct LaunchCli {
  CLI::App app{
      "keel-launch: starts a job across slots (machines), supervises it through "
      "failures and writes runs/<job>/ (logs, events.jsonl, report.json).",
      "keel-launch"};
  cli::JobFlags job;
  cli::SlotFlags slots;
  cli::FaultFlags faults;
  std::string report, loss_svg, export_llmc;
};

void add_launch_flags(LaunchCli* c, LaunchOptions* o) {
  CLI::App& app = c->app;
  cli::add_job_flags(app, &c->job);
  cli::add_slot_flags(app, &c->slots);
  app.add_option("--slots", o->slots,
                 "this process is slot 0 of N (controller and agent) on this machine; slots "
                 "1..N-1 are started by hand on their machines with --join (endpoint and job "
                 "id appear in runs/<job>/controller)")
      ->type_name("N")
      ->check(cli::range(1, cli::kMaxCount));
  app.add_option("--run-dir", o->run_dir,
                 "where runs/<job>/ goes (default: runs): logs, events.jsonl, config")
      ->type_name("DIR")
      ->check(cli::refuse_if(run_dir_problem));
  app.add_option("--resume", o->resume,
                 "restart a job from its newest complete persistent checkpoint: DIR is a "
                 "checkpoint directory (checkpoint.dir) or the run directory runs/<job>/ of the "
                 "job (its config.pbtxt names the checkpoint directory, and is the config "
                 "unless --config is given)")
      ->type_name("DIR");
  app.add_option("--report", c->report, "the final report (JSON; default: runs/<job>/report.json)")
      ->type_name("FILE");
  app.add_option("--loss-svg", c->loss_svg, "the loss curve, incidents marked")->type_name("FILE");
  app.add_option("--export-llmc", c->export_llmc,
                 "write the trained weights as an llm.c checkpoint")
      ->type_name("FILE");
  cli::add_fault_flags(app, &c->faults);
  app.add_option("--join", o->join,
                 "start slot K's launcher by hand and join a running job (to bring back a lost "
                 "machine); ENDPOINT and ID are in runs/<job>/controller; needs --slot and --job")
      ->type_name("ENDPOINT");
  app.add_option("--slot", o->slot, "the slot this launcher is (with --join)")
      ->type_name("K")
      ->check(cli::range(0, cli::kMaxCount));
  app.add_option("--job", o->job, "the job to join (with --join)")->type_name("ID");
  app.add_option("--secret-file", o->secret_file,
                 "the job's secret (with --join): a copy of runs/<job>/secret from slot 0's "
                 "machine, mode 0600; or KEEL_JOB_SECRET in the environment (read and unset at "
                 "start); default: RUN_DIR/<job>/secret, where slot 0 wrote it")
      ->type_name("FILE");
  app.add_flag("--quiet", o->quiet, "no per-step lines");
  app.add_flag("--candidate", o->candidate,
               "internal: a slot's controller candidate (its agent starts it once the job's "
               "etcd is up); needs --job, --slot, --host and --etcd");
  app.add_option("--host", o->host, "internal: the candidate's slot address (with --candidate)")
      ->type_name("ADDR");
  app.add_option("--etcd-members", o->etcd_members,
                 "a job of 3+ slots keeps its control state in etcd: this many members (3 "
                 "survive one lost machine, 5 two) start on slots spread over the failure "
                 "domains and slot numbers; default: 5 for jobs of 5+ slots (standbys "
                 "included), else 3 (a job of 1-2 slots keeps it in keel-launch's memory: there "
                 "is nothing to fail over to)")
      ->type_name("N");
  app.add_option("--failure-domain", o->failure_domain,
                 "the failure domain of this machine (a rack, a power feed: what one failure "
                 "takes together), for placing the job's etcd members; under --local one label "
                 "per slot, comma-separated, or one for all; default: the leaf switch of "
                 "Slurm's SLURM_TOPOLOGY_ADDR, else not known")
      ->type_name("LABEL")
      ->check(cli::refuse_if(failure_domain_problem));
  app.add_option("--etcd", o->etcd,
                 "use this etcd cluster (host:port,... of its members) for the job's control "
                 "state instead of starting members")
      ->type_name("ENDPOINTS")
      ->check(cli::refuse_if(etcd_endpoints_problem));
  app.add_option("--etcd-data", o->etcd_data,
                 "where the members keep their data: run (runs/<job>/etcd/) or shm (/dev/shm: no "
                 "disk writes, gone with the machine); default: shm under --local (one machine "
                 "either way), run otherwise")
      ->type_name("run|shm");
}

}  // namespace

std::optional<int> parse_launch_options(int argc, char** argv, LaunchOptions* o) {
  LaunchCli c;
  add_launch_flags(&c, o);
  if (auto rc = cli::parse(c.app, argc, argv)) return rc;
  if (o->candidate && (o->job.empty() || o->slot < 0 || o->host.empty() || o->etcd.empty()))
    return cli::usage_error(c.app, "--candidate needs --job, --slot, --host and --etcd");
  if (c.job.config.empty() && o->resume.empty() && !o->candidate)
    return cli::usage_error(c.app, "--config FILE is required (or --resume runs/<job>)");
  if (o->slots > 0 && (c.slots.local > 0 || !o->join.empty()))
    return cli::usage_error(c.app, "--slots N cannot be combined with --local or --join");
  if (!o->join.empty() && (o->slot < 0 || o->job.empty()))
    return cli::usage_error(c.app, "--join needs --slot K and --job ID");
  if (o->etcd_members != 0 && o->etcd_members != 3 && o->etcd_members != 5)
    return cli::usage_error(c.app, "--etcd-members " + std::to_string(o->etcd_members) +
                                       ": 3 or 5 (a quorum survives the loss of 1 or 2)");
  if (!o->etcd_data.empty() && o->etcd_data != "run" && o->etcd_data != "shm")
    return cli::usage_error(c.app, "--etcd-data " + o->etcd_data + ": run or shm");
  o->config_path = c.job.config;
  o->overrides = c.job.set;
  o->local = c.slots.local;
  const size_t domains = split(o->failure_domain, ',').size();
  if (!o->failure_domain.empty() && domains > 1 && domains != size_t(o->local))
    return cli::usage_error(
        c.app, "--failure-domain " + o->failure_domain + ": " + std::to_string(domains) +
                   " labels; one for this machine, or under --local one per slot (" +
                   std::to_string(o->local) + ")");
  o->standby = c.slots.standby;
  o->workers_per_slot = c.slots.workers_per_slot;
  // Each occurrence of a passthrough flag, in the order given across all of them: the k-th
  // time parse_order() names a flag, its value is that flag's k-th result.
  std::map<const CLI::Option*, size_t> seen;
  for (const CLI::Option* opt : c.app.parse_order())
    for (const char* flag : kWorkerFlags)
      if (opt->check_name(flag)) {
        o->worker_args.push_back(flag);
        o->worker_args.push_back(opt->results().at(seen[opt]++));
      }
  return std::nullopt;
}

}  // namespace keel
