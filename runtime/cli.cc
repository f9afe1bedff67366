#include "runtime/cli.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

namespace keel::cli {
namespace {

// CLI11 prints each flag's help on one line however long; this wraps it into the column
// after the flag names, so that no line of --help is wider than kWidth.
class WrappingFormatter : public CLI::Formatter {
 public:
  static constexpr std::size_t kNameColumn = 28;
  static constexpr std::size_t kWidth = 96;

  WrappingFormatter() { column_width(kNameColumn); }

  std::string make_option_desc(const CLI::Option* opt) const override {
    return wrap(opt->get_description(), kWidth - kNameColumn);
  }

  // The placeholder and REQUIRED only: what excludes what is said in the flags' help.
  std::string make_option_opts(const CLI::Option* opt) const override {
    if (!opt->get_option_text().empty()) return " " + opt->get_option_text();
    std::string out;
    if (opt->get_type_size() != 0 && !opt->get_type_name().empty())
      out += " " + opt->get_type_name();
    if (opt->get_required()) out += " REQUIRED";
    return out;
  }

  std::string make_subcommand(const CLI::App* sub) const override {
    std::ostringstream out;
    CLI::detail::format_help(out, sub->get_display_name(true),
                             wrap(sub->get_description(), kWidth - kNameColumn), kNameColumn);
    return out.str();
  }

  std::string make_description(const CLI::App* app) const override {
    const std::string d = app->get_description();
    return d.empty() ? d : wrap(d, kWidth) + "\n";
  }

  // Words to lines of at most `width`; a newline in `text` starts a new line.
  static std::string wrap(const std::string& text, std::size_t width) {
    std::string out;
    std::istringstream paragraphs(text);
    for (std::string paragraph; std::getline(paragraphs, paragraph);) {
      if (!out.empty()) out += '\n';
      std::istringstream words(paragraph);
      std::string line;
      for (std::string word; words >> word;) {
        if (!line.empty() && line.size() + 1 + word.size() > width) {
          out += line + '\n';
          line.clear();
        }
        line += (line.empty() ? "" : " ") + word;
      }
      out += line;
    }
    return out;
  }
};

void use_wrapping_formatter(CLI::App& app, const std::shared_ptr<WrappingFormatter>& f) {
  app.formatter(f);
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    use_wrapping_formatter(*sub, f);
}

// A flag of one value given twice keeps the last, as keel's hand-written parsers did: a
// harness or script that appends "--report X" to a command line overrides the one before.
void take_last_values(CLI::App& app) {
  for (CLI::Option* opt : app.get_options())
    if (opt->get_multi_option_policy() == CLI::MultiOptionPolicy::Throw &&
        opt->get_expected_max() <= 1)
      opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) take_last_values(*sub);
}

// A refusal of the number checks starts with this mark, then the value. CLI11 reports a check's
// message as "<flag>: <message>"; parse() turns ": <mark>" into a space, so that the flag and
// its value read together: "--mtbf-s nan: must be a number > 0 (seconds)".
constexpr char kValueFirst = '\x1f';

// The name every number check of this file carries, by which parse() knows that a floating-point
// flag is checked already (see refuse_non_finite).
constexpr char kNumberCheck[] = "keel-number";

std::string refusal(const std::string& text, const std::string& range) {
  return kValueFirst + (text.empty() ? std::string("''") : text) + ": must be " + range;
}

std::string in_brackets(const std::string& unit) {
  return unit.empty() ? "" : " (" + unit + ")";
}

// A bound as a person writes it: 0.001, 86400, 1000000000 (not 1e+09, not 86400.000000).
std::string number_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.15g", v);
  if (std::fabs(v) >= 1 && std::string(buf).find('e') != std::string::npos)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

// The whole text as a finite number; nothing for NaN, infinities, a value past double's range
// (strtod's HUGE_VAL) or text around the number.
std::optional<double> read_number(const std::string& text) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// The whole text as a whole number: decimal digits (exact, whatever their count: past int64 is
// nothing) or a number with no fraction, like 1e6, up to 2^53, where a double is still exact.
std::optional<int64_t> read_whole(const std::string& text) {
  const size_t digits = text[0] == '+' || text[0] == '-' ? 1 : 0;
  if (text.size() > digits && text.find_first_not_of("0123456789", digits) == std::string::npos) {
    errno = 0;
    const long long v = std::strtoll(text.c_str(), nullptr, 10);
    if (errno == ERANGE) return std::nullopt;
    return int64_t(v);
  }
  const std::optional<double> v = read_number(text);
  if (!v || *v != std::floor(*v) || std::fabs(*v) > 9007199254740992.0) return std::nullopt;
  return int64_t(*v);
}

struct Bounds {
  double lo, hi;
  bool lo_open, hi_open;
  std::string words;  // "a number > 0 (seconds)"
};

CLI::Validator number_check(const Bounds& b) {
  return CLI::Validator(
      [b](std::string& text) -> std::string {
        const std::optional<double> v = read_number(text);
        if (!v || (b.lo_open ? *v <= b.lo : *v < b.lo) || (b.hi_open ? *v >= b.hi : *v > b.hi))
          return refusal(text, b.words);
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.17g", *v);  // exact, and read alike by CLI11
        text = buf;
        return "";
      },
      "", kNumberCheck);
}

// CLI11 reads "nan", "inf" and "1e400" into a double flag, and its Range check lets NaN through
// (every comparison with NaN is false), so a flag declared without one of the checks above would
// take them. parse() gives every floating-point flag (CLI11 names their type FLOAT) that has none
// this one, so that no flag of any binary takes a number that is not finite.
CLI::Validator finite_number() {
  return number_check({-HUGE_VAL, HUGE_VAL, false, false, "a finite number"});
}

bool has_number_check(CLI::Option* opt) {
  try {
    opt->get_validator(kNumberCheck);
    return true;
  } catch (const CLI::OptionNotFound&) {
    return false;
  }
}

// Whether CLI11 reads the flag as a float or double: its type name is FLOAT, followed by the
// descriptions of any checks (":FLOAT in [0.5 - 600]").
bool is_floating_point(const CLI::Option* opt) {
  const std::string type = opt->get_type_name();
  return type.rfind("FLOAT", 0) == 0 && (type.size() == 5 || type[5] == ':');
}

void refuse_non_finite(CLI::App& app) {
  for (CLI::Option* opt : app.get_options())
    if (is_floating_point(opt) && !has_number_check(opt))
      opt->transform(finite_number(), kNumberCheck);
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) refuse_non_finite(*sub);
}

}  // namespace

CLI::Validator whole_number(int64_t lo, int64_t hi, const std::string& unit) {
  const std::string words =
      "a whole number from " + std::to_string(lo) + " to " + std::to_string(hi) + in_brackets(unit);
  return CLI::Validator(
      [lo, hi, words](std::string& text) -> std::string {
        const std::optional<int64_t> v = text.empty() ? std::nullopt : read_whole(text);
        if (!v || *v < lo || *v > hi) return refusal(text, words);
        text = std::to_string(*v);  // plain decimal digits, which CLI11 reads as they are
        return "";
      },
      "", kNumberCheck);
}

CLI::Validator number(double lo, double hi, const std::string& unit) {
  return number_check(
      {lo, hi, false, false,
       "a number from " + number_text(lo) + " to " + number_text(hi) + in_brackets(unit)});
}

CLI::Validator number_above(double lo, const std::string& unit) {
  return number_check(
      {lo, HUGE_VAL, true, false, "a number > " + number_text(lo) + in_brackets(unit)});
}

CLI::Validator number_under(double lo, double hi, const std::string& unit) {
  return number_check(
      {lo, hi, false, true,
       "a number >= " + number_text(lo) + " and < " + number_text(hi) + in_brackets(unit)});
}

CLI::Validator must_be(std::function<bool(const std::string&)> ok, const std::string& words) {
  return CLI::Validator(
      [ok = std::move(ok), words](std::string& text) -> std::string {
        return ok(text) ? "" : refusal(text, words);
      },
      "");
}

CLI::Validator refuse_if(std::function<std::string(const std::string&)> why_not) {
  return CLI::Validator(
      [why_not = std::move(why_not)](std::string& text) -> std::string {
        const std::string why = why_not(text);
        return why.empty() ? ""
                           : kValueFirst + (text.empty() ? std::string("''") : text) + ": " + why;
      },
      "");
}

CLI::Validator range(int lo, int hi) {
  // No description: the flag's help says the range, and the type shown stays the placeholder.
  return CLI::Range(lo, hi).description("");
}

void add_job_flags(CLI::App& app, JobFlags* f, bool config_required) {
  // No ExistingFile check: the config loader refuses a missing file or a directory with a
  // message that says which (proto/config_loader.h).
  auto* config =
      app.add_option("--config", f->config, "job config (text protobuf, see proto/config.proto)")
          ->type_name("FILE");
  if (config_required) config->required();
  // One value per --set, so that a following positional is never taken as an override; the
  // order given is the order applied.
  app.add_option("--set", f->set, "override a config field, e.g. --set train.steps=20 (repeatable)")
      ->type_name("PATH=VALUE")
      ->option_text("PATH=VALUE")
      ->allow_extra_args(false)
      ->take_all();
}

void add_slot_flags(CLI::App& app, SlotFlags* f) {
  app.add_option("--local", f->local,
                 "run N slots (machines, 1..4096) on this machine; without it, under mpirun, "
                 "each MPI rank is a slot")
      ->type_name("N")
      ->check(range(1, kMaxCount));
  app.add_option("--standby", f->standby,
                 "the last K slots (0..4096) are warm standbys: their workers load the model, "
                 "check themselves and wait to replace a lost or evicted slot")
      ->type_name("K")
      ->check(range(0, kMaxCount));
  app.add_option("--workers-per-slot", f->workers_per_slot,
                 "ranks per slot (1..4096; default: one per GPU, or 1 on CPU); ranks fill "
                 "slots in Megatron order, so a TP group stays inside a slot where it fits")
      ->type_name("W")
      ->check(range(1, kMaxCount));
}

void add_fault_flags(CLI::App& app, FaultFlags* f) {
  app.add_option("--fault", f->fault,
                 "inject a fault (repeatable): KIND is crash, exit, hang, slow, nan, "
                 "corrupt_snapshot, lose_snapshot, slot_loss, partition, freeze, "
                 "hang_in_collective, spin, sdc, slow_link or link_error (proto/faults.proto); "
                 "also ,code=C ,message=TEXT ,delay_ms=D ,target=T ,once")
      ->type_name("KIND@step=S,rank=R")
      ->option_text("KIND@step=S,rank=R")
      ->allow_extra_args(false)
      ->take_all();
  app.add_option("--inject", f->inject,
                 "inject the faults of a schedule (text protobuf, proto/faults.proto)")
      ->type_name("FILE");
  // No ExistingFile check either: the schedule's loader refuses a directory, a missing or an
  // empty file with a message that says which (robust/fault_spec.h).
}

std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  use_wrapping_formatter(app, std::make_shared<WrappingFormatter>());
  take_last_values(app);
  refuse_non_finite(app);
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << app.help("", CLI::AppFormatMode::All);
    return 0;
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    const size_t mark = what.find(std::string(": ") + kValueFirst);
    if (mark != std::string::npos) what.replace(mark, 3, " ");
    return usage_error(app, what);
  }
}

std::string help(CLI::App& app) {
  use_wrapping_formatter(app, std::make_shared<WrappingFormatter>());
  return app.help();
}

int usage_error(const CLI::App& app, const std::string& what) {
  std::fprintf(stderr, "%s: error: %s\nrun with --help for usage\n", app.get_name().c_str(),
               what.c_str());
  return 2;
}

}  // namespace keel::cli
