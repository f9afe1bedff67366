#include "robust/fault_spec.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "proto/first_error.h"

namespace keel {
namespace {

namespace pb = google::protobuf;

// "crash, exit, hang, ...": every kind, in the enum's order, so the list cannot go stale.
std::string kind_list() {
  const pb::EnumDescriptor* d = faults::Fault::Kind_descriptor();
  std::string out;
  for (int i = 0; i < d->value_count(); ++i) out += (i ? ", " : "") + d->value(i)->name();
  return out;
}

bool parse_int(const std::string& text, int64_t* out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  return !text.empty() && ec == std::errc() && ptr == end;
}

[[noreturn]] void flag_error(const std::string& value, const std::string& why) {
  throw InputError("--fault '" + value + "': " + why);
}

}  // namespace

std::string fault_kind_name(faults::Fault::Kind kind) {
  return faults::Fault::Kind_Name(kind);
}

std::string FaultOrigin::where(const std::string& field) const {
  if (!flag.empty()) return "--fault '" + flag + "': " + field;
  auto it = lines.find(field);
  if (it == lines.end()) it = lines.find("");  // the fault's own line
  std::string at = it == lines.end() ? file : file + ":" + std::to_string(it->second);
  return at + ": fault[" + std::to_string(index) + "]." + field;
}

std::string FaultOrigin::label() const {
  if (!flag.empty()) return "--fault '" + flag + "'";
  auto it = lines.find("");
  std::string at = it == lines.end() ? file : file + ":" + std::to_string(it->second);
  return at + ": fault[" + std::to_string(index) + "]";
}

faults::Fault parse_fault_flag(const std::string& value) {
  auto fail = [&](const std::string& why) { flag_error(value, why); };
  faults::Fault f;
  size_t at = value.find('@');
  if (at == std::string::npos)
    fail("expected KIND@step=S,rank=R[,code=C][,delay_ms=D][,target=T][,once][,message=TEXT]");
  std::string kind = value.substr(0, at);
  faults::Fault::Kind k = faults::Fault::crash;
  if (!faults::Fault::Kind_Parse(kind, &k)) {
    fail("unknown kind '" + kind + "' (" + kind_list() + ")");
  }
  f.set_kind(k);
  bool has_step = false, has_rank = false;
  size_t pos = at + 1;
  while (pos <= value.size()) {
    size_t eq = value.find('=', pos);
    size_t comma = value.find(',', pos);
    std::string key = value.substr(pos, std::min(eq, comma) - pos);
    const bool bare = eq == std::string::npos || (comma != std::string::npos && comma < eq);
    if (bare && key == "once") {
      f.set_once(true);
      if (comma == std::string::npos) break;
      pos = comma + 1;
      continue;
    }
    if (bare) fail("expected key=value, got '" + key + "'");
    if (key == "message") {
      // The rest of the value, commas included: a message is free text.
      f.set_message(value.substr(eq + 1));
      break;
    }
    std::string text =
        value.substr(eq + 1, comma == std::string::npos ? std::string::npos : comma - eq - 1);
    int64_t number = 0;
    if (key == "target") {
      faults::Fault::Target t = faults::Fault::grad;
      if (!faults::Fault::Target_Parse(text, &t))
        fail("target = '" + text + "': not one of grad, activation, param, optimizer");
      f.set_target(t);
      if (comma == std::string::npos) break;
      pos = comma + 1;
      continue;
    }
    if (key != "step" && key != "rank" && key != "code" && key != "delay_ms") {
      fail("unknown key '" + key + "' (step, rank, code, delay_ms, target, once, message)");
    }
    if (!parse_int(text, &number)) fail(key + " = '" + text + "': not an integer");
    bool fits_int = number >= INT32_MIN && number <= INT32_MAX;
    if (key == "step") {
      f.set_step(number);
      has_step = true;
    } else if (!fits_int) {
      fail(key + " = " + text + ": out of range");
    } else if (key == "rank") {
      f.set_rank(int32_t(number));
      has_rank = true;
    } else if (key == "code") {
      f.set_exit_code(int32_t(number));
    } else {
      f.set_delay_ms(int32_t(number));
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (!has_step) fail("missing step=S");
  // A controller crash is the controller's, not a rank's: rank 0 fires it unless told.
  if (!has_rank && k != faults::Fault::controller_crash) fail("missing rank=R");
  return f;
}

faults::FaultSchedule parse_fault_schedule(const std::string& text,
                                           const std::string& name_for_errors,
                                           std::vector<std::map<std::string, int>>* lines) {
  faults::FaultSchedule schedule;
  FirstErrorCollector errors;
  pb::TextFormat::ParseInfoTree tree;
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  parser.WriteLocationsTo(&tree);
  if (!parser.ParseFromString(text, &schedule)) {
    if (errors.has_error) {
      throw InputError(detail::concat(name_for_errors, ":", errors.line + 1, ":", errors.column + 1,
                                      ": ", errors.message));
    }
    throw InputError(name_for_errors + ": not a valid keel.faults.FaultSchedule");
  }
  if (lines) {
    lines->clear();
    const pb::FieldDescriptor* fault_field = schedule.GetDescriptor()->FindFieldByName("fault");
    const pb::Descriptor* d = faults::Fault::descriptor();
    for (int i = 0; i < schedule.fault_size(); ++i) {
      std::map<std::string, int> l;
      pb::TextFormat::ParseLocation own = tree.GetLocation(fault_field, i);
      if (own.line >= 0) l[""] = own.line + 1;
      if (const auto* nested = tree.GetTreeForNested(fault_field, i)) {
        for (int j = 0; j < d->field_count(); ++j) {
          pb::TextFormat::ParseLocation loc = nested->GetLocation(d->field(j), -1);
          if (loc.line >= 0) l[d->field(j)->name()] = loc.line + 1;
        }
      }
      lines->push_back(std::move(l));
    }
  }
  return schedule;
}

void add_fault_flag(FaultPlan* plan, const std::string& value) {
  *plan->schedule.add_fault() = parse_fault_flag(value);
  plan->origins.push_back({.flag = value});
}

void add_fault_file(FaultPlan* plan, const std::string& path) {
  // A directory opens as an empty stream on Linux: the job would run with no faults at all.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw InputError(path +
                     ": is a directory, expected a fault schedule file (text protobuf, "
                     "proto/faults.proto)");
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open: " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw InputError(path + ": read failed: " + std::strerror(errno));
  std::vector<std::map<std::string, int>> lines;
  faults::FaultSchedule s = parse_fault_schedule(ss.str(), path, &lines);
  if (s.fault_size() == 0)
    throw InputError(path +
                     ": holds no fault (expected `fault { kind: crash step: 5 rank: 1 }` "
                     "entries, proto/faults.proto)");
  for (int i = 0; i < s.fault_size(); ++i) {
    *plan->schedule.add_fault() = s.fault(i);
    plan->origins.push_back({.file = path, .index = i, .lines = lines[size_t(i)]});
  }
}

void validate_fault_plan(const FaultPlan& plan, int world_size, int64_t steps) {
  std::string text;
  auto require = [&](bool ok, const FaultOrigin& o, const std::string& field,
                     const std::string& value, const std::string& rule) {
    if (ok) return;
    if (!text.empty()) text += "\n";
    text += o.where(field) + " = " + value + ": " + rule;
  };
  for (int i = 0; i < plan.schedule.fault_size(); ++i) {
    const faults::Fault& f = plan.schedule.fault(i);
    FaultOrigin fallback{.file = "fault schedule", .index = i};
    const FaultOrigin& o = size_t(i) < plan.origins.size() ? plan.origins[size_t(i)] : fallback;
    const std::string kind = fault_kind_name(f.kind());
    require(f.rank() >= 0, o, "rank", std::to_string(f.rank()), "must be >= 0");
    require(f.rank() < world_size, o, "rank", std::to_string(f.rank()),
            "must be < the world size " + std::to_string(world_size));
    require(f.step() >= 0, o, "step", std::to_string(f.step()), "must be >= 0");
    require(steps <= 0 || f.step() < steps, o, "step", std::to_string(f.step()),
            "must be < the job's steps " + std::to_string(steps) + " (it would never fire)");
    if (f.kind() == faults::Fault::slow || f.kind() == faults::Fault::slow_link) {
      require(f.delay_ms() > 0, o, "delay_ms", std::to_string(f.delay_ms()),
              "a " + kind + " fault needs delay_ms > 0");
    } else {
      require(!f.has_delay_ms(), o, "delay_ms", std::to_string(f.delay_ms()),
              "only slow and slow_link faults take delay_ms (this one is " + kind + ")");
    }
    if (f.kind() != faults::Fault::sdc) {
      require(!f.has_target(), o, "target", faults::Fault::Target_Name(f.target()),
              "only an sdc fault takes a target (this one is " + kind + ")");
    }
    if (f.kind() != faults::Fault::sdc && f.kind() != faults::Fault::link_error) {
      require(!f.has_once(), o, "once", f.once() ? "true" : "false",
              "only sdc and link_error faults take once (this one is " + kind + ")");
    }
    if (f.kind() == faults::Fault::exit) {
      require(f.exit_code() >= 1 && f.exit_code() <= 255, o, "exit_code",
              std::to_string(f.exit_code()),
              "must be in [1, 255] (0 would look like a clean exit)");
    } else {
      require(!f.has_exit_code(), o, "exit_code", std::to_string(f.exit_code()),
              "only an exit fault takes exit_code (this one is " + kind + ")");
      require(!f.has_message(), o, "message", "\"" + f.message() + "\"",
              "only an exit fault takes a message (this one is " + kind + ")");
    }
  }
  // The same fault twice fires twice (each copy is claimed on its own): refused. Two faults
  // are the same when every value the kind reads is equal.
  std::map<std::string, int> first;
  for (int i = 0; i < plan.schedule.fault_size(); ++i) {
    const faults::Fault& f = plan.schedule.fault(i);
    const std::string key =
        detail::concat(f.kind(), " ", f.step(), " ", f.rank(), " ", f.exit_code(), " ",
                       f.delay_ms(), " ", f.target(), " ", f.once(), " ", f.message());
    auto [it, fresh] = first.emplace(key, i);
    if (fresh) continue;
    auto origin = [&](int k) {
      return size_t(k) < plan.origins.size()
                 ? plan.origins[size_t(k)].label()
                 : FaultOrigin{.file = "fault schedule", .index = k}.label();
    };
    if (!text.empty()) text += "\n";
    text += origin(i) + ": the same fault as " + origin(it->second) +
            " (given twice, it would fire twice; give it once)";
  }
  if (!text.empty()) throw InputError(text);
}

}  // namespace keel
