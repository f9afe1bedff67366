// keel's command lines: every binary parses with CLI11 (Debian libcli11-dev), so --help is
// generated and the flags that mean the same thing have the same name and check everywhere.
// A binary builds a CLI::App, adds the shared flag groups below and its own flags, and calls
// parse():
//
//   CLI::App app("keel-launch: starts a job ...", "keel-launch");
//   cli::JobFlags job;   cli::add_job_flags(app, &job);
//   cli::SlotFlags slots; cli::add_slot_flags(app, &slots);
//   if (auto rc = cli::parse(app, argc, argv)) return *rc;
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace keel::cli {

// --config FILE (a text-protobuf JobConfig) and --set PATH=VALUE (repeatable overrides).
struct JobFlags {
  std::string config;
  std::vector<std::string> set;
};
void add_job_flags(CLI::App& app, JobFlags* f, bool config_required = false);

// --local N (slots on this machine), --standby K (the last K are warm standbys),
// --workers-per-slot W (ranks per slot). 0 means "not given".
struct SlotFlags {
  int local = 0;
  int standby = 0;
  int workers_per_slot = 0;
};
void add_slot_flags(CLI::App& app, SlotFlags* f);

// --fault KIND@step=S,rank=R (repeatable) and --inject FILE (a FaultSchedule text protobuf).
struct FaultFlags {
  std::vector<std::string> fault;
  std::string inject;
};
void add_fault_flags(CLI::App& app, FaultFlags* f);

// The bound of every count of slots, workers or processes a flag asks for, so that a typo like
// --local 20000 is refused at once rather than forking until the machine gives out.
constexpr int kMaxCount = 4096;

// A Range(lo, hi) check for integer flags that leaves the flag's placeholder alone in --help
// and in "--local: 1 required N missing" (CLI::Range would show "N:INT in [1 - 4096]"). The
// flag's help text should say the range.
CLI::Validator range(int lo, int hi);

// Checks of number flags that refuse NaN, infinities and values too large for the flag's type
// like any other value out of range, and say the range in words, naming the flag and the value:
//   keel-bench: error: --mtbf-s nan: must be a number > 0 (seconds)
//   keel-bench: error: --soak 1.5: must be a whole number from 1 to 100000
// Attach them with transform(), not check(): transform() runs a check before any other and
// lets it write the value back as CLI11 reads it (CLI11 alone takes 010 for octal 8 and
// cannot read 1e6 as an integer), so a value that passes converts to what was checked.
//   app.add_option("--soak", o.soak, "...")->transform(cli::whole_number(1, 100'000));
// `unit`, if given, ends the range in brackets: "(seconds)".
CLI::Validator whole_number(int64_t lo, int64_t hi, const std::string& unit = "");
// lo <= x <= hi: "a number from 0.001 to 86400 (seconds)".
CLI::Validator number(double lo, double hi, const std::string& unit = "");
// x > lo, finite: "a number > 0 (seconds)".
CLI::Validator number_above(double lo, const std::string& unit = "");
// lo <= x < hi: "a number >= 0 and < 1".
CLI::Validator number_under(double lo, double hi, const std::string& unit = "");

// Any other check of a flag's value with the same message, "<flag> <value>: must be <words>":
//   app.add_option("--prefix", ...)->check(cli::must_be(no_slash, "a name without '/'"));
CLI::Validator must_be(std::function<bool(const std::string&)> ok, const std::string& words);
// A check whose words depend on the value: `why_not` returns "" to take it, else the reason,
// said as "<flag> <value>: <reason>" ("--plugin x.so: no such file").
CLI::Validator refuse_if(std::function<std::string(const std::string&)> why_not);

// Parses argv. Returns nothing to go on, or the exit status to end with: 0 after --help
// (the generated help on stdout), 2 (recovery::kExitInputError) after a usage error, which
// goes to stderr as "<program>: error: <what is wrong, naming the flag and value>" and then
// "run with --help for usage". <program> is the App's name. A flag of one value given twice
// keeps the last (a script may append one to override), as before CLI11. Every floating-point
// flag without a check of its own above is given one that refuses NaN and infinities
// ("--steady-s nan: must be a finite number"): CLI11 reads them, and CLI::Range passes NaN.
std::optional<int> parse(CLI::App& app, int argc, char** argv);

// The --help text parse() prints, for a binary that shows it elsewhere too.
std::string help(CLI::App& app);

// Reports a usage error that CLI11 cannot see (one flag needs another, two exclude each
// other, ...) the way parse() reports its own: "<program>: error: <what>" and the --help hint
// on stderr. Returns 2, the exit status to end with.
int usage_error(const CLI::App& app, const std::string& what);

}  // namespace keel::cli
