#include "proto/config_loader.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "proto/first_error.h"
#include "runtime/check.h"
#include "runtime/cpu/blas_core.h"

namespace keel {
namespace {

namespace pb = google::protobuf;

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

void record_lines(const pb::Descriptor* d, const pb::TextFormat::ParseInfoTree* tree,
                  const std::string& prefix, std::map<std::string, int>* lines) {
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    std::string path = prefix + f->name();
    pb::TextFormat::ParseLocation loc = tree->GetLocation(f, f->is_repeated() ? 0 : -1);
    if (loc.line >= 0) (*lines)[path] = loc.line + 1;
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE && !f->is_repeated()) {
      if (const auto* nested = tree->GetTreeForNested(f, -1)) {
        record_lines(f->message_type(), nested, path + ".", lines);
      }
    }
  }
}

// The paths of every field set in `m` (recursively), for a --set that assigned a message.
void list_set_paths(const pb::Message& m, const std::string& prefix,
                    std::vector<std::string>* out) {
  std::vector<const pb::FieldDescriptor*> fields;
  m.GetReflection()->ListFields(m, &fields);
  for (const auto* f : fields) {
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE && !f->is_repeated()) {
      list_set_paths(m.GetReflection()->GetMessage(m, f), prefix + f->name() + ".", out);
    } else {
      out->push_back(prefix + f->name());
    }
  }
}

// Sets every unset singular field to its default, so that printing shows it.
void materialize_defaults(pb::Message* m) {
  const pb::Reflection* r = m->GetReflection();
  const pb::Descriptor* d = m->GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) continue;
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_MESSAGE:
        materialize_defaults(r->MutableMessage(m, f));
        continue;
      default:
        break;
    }
    if (r->HasField(*m, f)) continue;
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32:
        r->SetInt32(m, f, r->GetInt32(*m, f));
        break;
      case pb::FieldDescriptor::CPPTYPE_INT64:
        r->SetInt64(m, f, r->GetInt64(*m, f));
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT32:
        r->SetUInt32(m, f, r->GetUInt32(*m, f));
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT64:
        r->SetUInt64(m, f, r->GetUInt64(*m, f));
        break;
      case pb::FieldDescriptor::CPPTYPE_FLOAT:
        r->SetFloat(m, f, r->GetFloat(*m, f));
        break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE:
        r->SetDouble(m, f, r->GetDouble(*m, f));
        break;
      case pb::FieldDescriptor::CPPTYPE_BOOL:
        r->SetBool(m, f, r->GetBool(*m, f));
        break;
      case pb::FieldDescriptor::CPPTYPE_ENUM:
        r->SetEnum(m, f, r->GetEnum(*m, f));
        break;
      case pb::FieldDescriptor::CPPTYPE_STRING:
        r->SetString(m, f, r->GetString(*m, f));
        break;
      case pb::FieldDescriptor::CPPTYPE_MESSAGE:
        break;
    }
  }
}

// Protobuf reports an unknown field or enum value once it has read past it, at the next
// token, which may be on the next line ("schedule: cosin\n}" is reported at the "}"). Move the
// position back to the last occurrence of the quoted name before that point.
void point_at_culprit(const std::string& text, FirstErrorCollector* e) {
  std::string name;
  for (const char* marker : {"Unknown enumeration value of \"", "has no field named \""}) {
    size_t at = e->message.find(marker);
    if (at == std::string::npos) continue;
    at += std::strlen(marker);
    size_t end = e->message.find('"', at);
    if (end != std::string::npos) name = e->message.substr(at, end - at);
  }
  if (name.empty()) return;
  size_t offset = 0;
  for (int line = 0; line < e->line && offset != std::string::npos; ++line) {
    offset = text.find('\n', offset);
    if (offset != std::string::npos) ++offset;
  }
  if (offset == std::string::npos) return;
  offset = std::min(text.size(), offset + size_t(std::max(0, e->column)));
  size_t found = offset == 0 ? std::string::npos : text.rfind(name, offset - 1);
  if (found == std::string::npos) return;
  size_t line_start = text.rfind('\n', found);
  line_start = line_start == std::string::npos ? 0 : line_start + 1;
  e->line = int(std::count(text.begin(), text.begin() + long(found), '\n'));
  e->column = int(found - line_start);
}

[[noreturn]] void override_error(const std::string& assignment, const std::string& why) {
  throw InputError("--set " + assignment + ": " + why);
}

}  // namespace

std::string ConfigOrigin::where(const std::string& path) const {
  std::string label = name.empty() ? "config" : name;
  // A --set of a whole message ("model={...}") is recorded per field it set, so an exact
  // match is enough here.
  if (auto it = sets.find(path); it != sets.end()) return label + " (--set " + it->second + ")";
  if (auto it = lines.find(path); it != lines.end())
    return label + ":" + std::to_string(it->second);
  return label + " (default)";
}

std::vector<std::string> apply_override(config::JobConfig* cfg, const std::string& assignment) {
  auto fail = [&](const std::string& why) { override_error(assignment, why); };
  size_t eq = assignment.find('=');
  if (eq == std::string::npos) fail("expected path.to.field=value");
  std::string path = trim(assignment.substr(0, eq));
  std::string value = trim(assignment.substr(eq + 1));
  if (path.empty()) fail("empty field path");

  // Work on a copy so that a failed assignment leaves *cfg as it was.
  config::JobConfig work = *cfg;
  // Walk the path through the schema, creating sub-messages as needed.
  pb::Message* msg = &work;
  const pb::FieldDescriptor* field = nullptr;
  std::string walked;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    std::string here = walked.empty() ? part : walked + "." + part;
    field = msg->GetDescriptor()->FindFieldByName(part);
    if (!field) {
      fail("unknown field " + here + " (" + (walked.empty() ? "the config" : walked) +
           " has no field \"" + part + "\")");
    }
    walked = here;
    if (dot == std::string::npos) break;
    if (field->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE || field->is_repeated()) {
      fail(walked + " has no fields (it is not a message)");
    }
    msg = msg->GetReflection()->MutableMessage(msg, field);
    start = dot + 1;
  }

  const pb::Reflection* refl = msg->GetReflection();
  FirstErrorCollector errors;
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  auto parse_into = [&](pb::Message* target, const std::string& text) {
    bool quoted = text.size() >= 2 && text.front() == '"' && text.back() == '"';
    if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING && !quoted) {
      // Paths and globs on a command line come unquoted; take them as they are.
      if (field->is_repeated()) {
        target->GetReflection()->AddString(target, field, text);
      } else {
        target->GetReflection()->SetString(target, field, text);
      }
      return;
    }
    if (!parser.ParseFieldValueFromString(text, field, target)) {
      fail(walked + " = " + text + ": " +
           (errors.has_error ? errors.message : std::string("not a valid value")));
    }
  };

  std::vector<std::string> assigned;
  if (field->is_repeated()) {
    if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      fail(walked + " is a repeated message; set it in the config file");
    }
    refl->ClearField(msg, field);
    // The list as text format and the config print it, [2, 2], is taken too.
    std::string items = trim(value);
    if (items.size() >= 2 && items.front() == '[' && items.back() == ']')
      items = trim(items.substr(1, items.size() - 2));
    if (!items.empty()) {
      std::stringstream ss(items);
      std::string item;
      while (std::getline(ss, item, ',')) parse_into(msg, trim(item));
    }
    assigned.push_back(walked);
  } else if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
    // Parsed into a scratch copy first, to learn which fields the text sets.
    std::unique_ptr<pb::Message> scratch(msg->New());
    parse_into(scratch.get(), value);
    const pb::Message& part = scratch->GetReflection()->GetMessage(*scratch, field);
    refl->MutableMessage(msg, field)->MergeFrom(part);
    list_set_paths(part, walked + ".", &assigned);
  } else {
    parse_into(msg, value);
    assigned.push_back(walked);
  }
  *cfg = std::move(work);
  return assigned;
}

void fill_derived_defaults(config::JobConfig* cfg) {
  config::ModelConfig* m = cfg->mutable_model();
  if (m->ffn_hidden_size() == 0 && m->hidden_size() > 0)
    m->set_ffn_hidden_size(4 * m->hidden_size());
  if (m->padded_vocab_size() == 0 && m->vocab_size() > 0) {
    // llm.c pads 50257 to 50304 so that the head's matmul tiles evenly.
    m->set_padded_vocab_size((m->vocab_size() + 127) / 128 * 128);
  }
  if (!cfg->sdc().has_check_every_steps())
    cfg->mutable_sdc()->set_check_every_steps(cfg->deterministic() ? kDefaultSdcCheckEverySteps
                                                                   : 0);
}

config::JobConfig parse_config_text(const std::string& text, const std::string& name_for_errors,
                                    const std::vector<std::string>& overrides) {
  config::JobConfig cfg;
  FirstErrorCollector errors;
  pb::TextFormat::ParseInfoTree tree;
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  parser.WriteLocationsTo(&tree);
  if (!parser.ParseFromString(text, &cfg)) {
    if (errors.has_error) {
      point_at_culprit(text, &errors);
      throw InputError(detail::concat(name_for_errors, ":", errors.line + 1, ":", errors.column + 1,
                                      ": ", errors.message));
    }
    throw InputError(name_for_errors + ": not a valid keel.config.JobConfig");
  }
  ConfigOrigin origin;
  origin.name = name_for_errors;
  record_lines(cfg.GetDescriptor(), &tree, "", &origin.lines);
  for (const auto& o : overrides) {
    for (const auto& path : apply_override(&cfg, o)) origin.sets[path] = trim(o);
  }
  fill_derived_defaults(&cfg);
  validate_config(cfg, origin);
  return cfg;
}

config::JobConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  // A directory opens as an empty stream on Linux and would parse as the built-in default
  // config: the job would train something nobody asked for.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw InputError(path + ": is a directory, expected a config file (text protobuf)");
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open: " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw InputError(path + ": read failed");
  return parse_config_text(ss.str(), path, overrides);
}

namespace {

// Longest sequence keel accepts: attention keeps B·NH·T² floats, so beyond this even one
// head of one sequence needs 16 GiB.
constexpr int kMaxSeqLen = 1 << 16;
// CPU threads of one worker. Each is an OpenMP thread with its own stack; tens of thousands
// exhaust the process's address space or thread limit (100000 crashed, 20000 hung), and no
// machine keel runs on has a quarter of this many cores. A fixed bound, not one relative to
// this machine, so that a config valid on one machine is valid on all.
constexpr int kMaxThreads = 1024;
// Token shards store tokens as uint16.
constexpr int kMaxVocab = 1 << 16;
// Agents send a heartbeat, and workers a liveness report, every this many milliseconds
// (launcher/agent/agent.cc, launcher/worker/progress_reporter.h); the controller answers each
// heartbeat.
constexpr int kReportPeriodMs = 200;
// The longest timeout: a day is "never" for a job, and code that scales a budget in int
// milliseconds (3/4 of it, say) stays far from overflow.
constexpr int kMaxTimeoutMs = 24 * 3600 * 1000;

// A value shown as is (an enum name, a list), where a string would be quoted.
struct Raw {
  std::string text;
};
std::string show(const Raw& v) {
  return v.text;
}
std::string show(const std::string& v) {
  return "\"" + v + "\"";
}
template <typename T>
std::string show(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// Collects violations, each located by the origin of the field it blames.
class Violations {
 public:
  explicit Violations(const ConfigOrigin& origin) : origin_(origin) {}
  template <typename T>
  void require(bool ok, const std::string& path, const T& value, const std::string& rule) {
    if (ok) return;
    if (!text_.empty()) text_ += "\n";
    text_ += origin_.where(path) + ": " + path + " = " + show(value) + ": " + rule;
  }
  void throw_if_any() const {
    if (!text_.empty()) throw InputError(text_);
  }

 private:
  const ConfigOrigin& origin_;
  std::string text_;
};

}  // namespace

void validate_config(const config::JobConfig& cfg, const ConfigOrigin& origin) {
  Violations v(origin);
  const auto& m = cfg.model();
  const auto& p = cfg.parallel();
  const auto& t = cfg.train();
  const auto& o = cfg.optim();
  auto ref = [](const std::string& path, auto value) { return path + " = " + show(value); };

  v.require(!m.plugin().empty(), "model.plugin", m.plugin(), "must name a plugin .so");
  const int sdc_every = cfg.sdc().check_every_steps();
  v.require(sdc_every >= 0, "sdc.check_every_steps", sdc_every, "must be >= 0 (0: off)");
  v.require(sdc_every <= 0 || cfg.deterministic(), "sdc.check_every_steps", sdc_every,
            "needs deterministic: true (a recomputation is compared bit for bit)");
  bool dims_ok = true;
  for (auto [path, value] : {std::pair{"model.num_layers", m.num_layers()},
                             {"model.hidden_size", m.hidden_size()},
                             {"model.num_heads", m.num_heads()},
                             {"model.seq_len", m.seq_len()},
                             {"model.vocab_size", m.vocab_size()}}) {
    v.require(value > 0, path, value, "must be positive");
    dims_ok = dims_ok && value > 0;
  }
  // 0 means "derive" (fill_derived_defaults); a 0 that cannot be derived because its source
  // is bad is reported through the source alone.
  config::JobConfig derived;
  *derived.mutable_model() = m;
  fill_derived_defaults(&derived);
  const int ffn = derived.model().ffn_hidden_size();
  const int padded = derived.model().padded_vocab_size();
  v.require(m.ffn_hidden_size() >= 0, "model.ffn_hidden_size", m.ffn_hidden_size(),
            "must be positive (0: 4·model.hidden_size)");
  v.require(m.padded_vocab_size() >= 0, "model.padded_vocab_size", m.padded_vocab_size(),
            "must be positive (0: model.vocab_size rounded up to 128)");
  dims_ok = dims_ok && ffn > 0 && padded > 0;
  v.require(m.seq_len() <= kMaxSeqLen, "model.seq_len", m.seq_len(),
            "must be at most " + show(kMaxSeqLen));
  v.require(m.vocab_size() <= kMaxVocab, "model.vocab_size", m.vocab_size(),
            "must be at most 65536 (token shards hold uint16 tokens)");
  v.require(std::isfinite(m.init_std()) && m.init_std() >= 0, "model.init_std", m.init_std(),
            "must be >= 0");
  if (dims_ok) {
    v.require(m.hidden_size() % m.num_heads() == 0, "model.num_heads", m.num_heads(),
              "must divide " + ref("model.hidden_size", m.hidden_size()));
    v.require(padded >= m.vocab_size(), "model.padded_vocab_size", padded,
              "must be >= " + ref("model.vocab_size", m.vocab_size()));
  }

  bool sizes_ok = true;
  for (auto [path, value] :
       {std::pair{"parallel.tp", p.tp()}, {"parallel.pp", p.pp()}, {"parallel.dp", p.dp()}}) {
    v.require(value >= 1, path, value, "must be >= 1");
    sizes_ok = sizes_ok && value >= 1;
  }
  if (dims_ok && sizes_ok) {
    v.require(m.num_heads() % p.tp() == 0, "parallel.tp", p.tp(),
              "must divide " + ref("model.num_heads", m.num_heads()));
    v.require(padded % p.tp() == 0, "parallel.tp", p.tp(),
              "must divide " + ref("model.padded_vocab_size", padded));
    v.require(ffn % p.tp() == 0, "parallel.tp", p.tp(),
              "must divide " + ref("model.ffn_hidden_size", ffn));
    v.require(p.pp() <= m.num_layers(), "parallel.pp", p.pp(),
              "must be <= " + ref("model.num_layers", m.num_layers()));
  }
  if (p.stage_layers_size() > 0) {
    std::string list = "[";
    int64_t sum = 0;
    bool each_ok = true;
    for (int i = 0; i < p.stage_layers_size(); ++i) {
      if (i > 0) list += ",";
      list += show(p.stage_layers(i));
      sum += p.stage_layers(i);
      each_ok = each_ok && p.stage_layers(i) >= 1;
    }
    list += "]";
    // Printed as a raw list, not a quoted string.
    auto require_list = [&](bool ok, const std::string& rule) {
      v.require(ok, "parallel.stage_layers", Raw{list}, rule);
    };
    require_list(p.stage_layers_size() == p.pp(),
                 "must have one entry per stage, " + ref("parallel.pp", p.pp()));
    require_list(each_ok, "every stage needs at least one layer");
    require_list(sum == m.num_layers(), "must sum to " + ref("model.num_layers", m.num_layers()));
  }
  v.require(p.bucket_mb() > 0, "parallel.bucket_mb", p.bucket_mb(), "must be positive");
  // A time field must be long enough to work: a timeout shorter than a few report periods (or
  // than a healthy step's skew) fires on a healthy job and blames the wrong machine.
  auto require_ms = [&](const std::string& path, int value, int min, const std::string& why,
                        bool zero_is_off = false) {
    v.require(value >= min || (zero_is_off && value == 0), path, value,
              std::string("must be ") + (zero_is_off ? "0 (off) or " : "") + ">= " + show(min) +
                  " (" + why + ")");
    v.require(value <= kMaxTimeoutMs, path, value,
              "must be at most " + show(kMaxTimeoutMs) + " (one day)");
  };
  require_ms("parallel.comm_timeout_ms", p.comm_timeout_ms(), 1000,
             "every collective waits this long for its slowest peer, whose step may lag by "
             "seconds; shorter, a healthy job times out");

  v.require(t.micro_batch_size() >= 1, "train.micro_batch_size", t.micro_batch_size(),
            "must be >= 1");
  v.require(t.global_batch_size() >= 1, "train.global_batch_size", t.global_batch_size(),
            "must be >= 1");
  if (t.micro_batch_size() >= 1 && t.global_batch_size() >= 1 && p.dp() >= 1) {
    int64_t unit = int64_t(t.micro_batch_size()) * p.dp();
    v.require(t.global_batch_size() % unit == 0, "train.global_batch_size", t.global_batch_size(),
              "must be a multiple of train.micro_batch_size · parallel.dp = " +
                  show(t.micro_batch_size()) + " · " + show(p.dp()) + " = " + show(unit));
  }
  v.require(t.steps() >= 0, "train.steps", t.steps(), "must be >= 0");
  v.require(t.log_every() >= 1, "train.log_every", t.log_every(), "must be >= 1");
  v.require(t.eval_every() >= 0, "train.eval_every", t.eval_every(), "must be >= 0 (0 disables)");
  v.require(t.eval_batches() >= 1, "train.eval_batches", t.eval_batches(), "must be >= 1");
  if (t.eval_every() > 0)
    v.require(!cfg.data().val_files().empty(), "data.val_files", cfg.data().val_files(),
              "must name the validation shards when train.eval_every > 0");

  v.require(std::isfinite(o.lr()) && o.lr() > 0, "optim.lr", o.lr(), "must be positive");
  v.require(o.beta1() >= 0 && o.beta1() < 1, "optim.beta1", o.beta1(), "must be in [0, 1)");
  v.require(o.beta2() >= 0 && o.beta2() < 1, "optim.beta2", o.beta2(), "must be in [0, 1)");
  v.require(o.eps() > 0, "optim.eps", o.eps(), "must be positive");
  v.require(o.warmup_steps() >= 0, "optim.warmup_steps", o.warmup_steps(), "must be >= 0");
  v.require(o.min_lr_ratio() >= 0 && o.min_lr_ratio() <= 1, "optim.min_lr_ratio", o.min_lr_ratio(),
            "must be in [0, 1]");
  v.require(o.weight_decay() >= 0, "optim.weight_decay", o.weight_decay(), "must be >= 0");
  v.require(o.grad_clip() >= 0, "optim.grad_clip", o.grad_clip(), "must be >= 0 (0 disables)");

  v.require(!cfg.data().train_files().empty(), "data.train_files", cfg.data().train_files(),
            "must name the training shards");

  const auto& c = cfg.checkpoint();
  v.require(c.persistent_every_steps() >= 0, "checkpoint.persistent_every_steps",
            c.persistent_every_steps(), "must be >= 0 (0 disables)");
  v.require(c.persistent_every_steps() == 0 || !c.dir().empty(), "checkpoint.dir", c.dir(),
            "must be set when checkpoint.persistent_every_steps > 0");
  v.require(c.keep() >= 0, "checkpoint.keep", c.keep(), "must be >= 0 (0 keeps all)");

  const auto& rc = cfg.recovery();
  require_ms("recovery.abort_timeout_ms", rc.abort_timeout_ms(), 500,
             "a survivor answers the abort through the store once its current call returns; "
             "shorter, healthy survivors are killed as hung");
  v.require(rc.max_incidents() >= 0, "recovery.max_incidents", rc.max_incidents(), "must be >= 0");
  v.require(rc.abort_timeout_steps() >= 1, "recovery.abort_timeout_steps", rc.abort_timeout_steps(),
            "must be >= 1");
  const auto& dc = cfg.detect();
  const std::string period = show(kReportPeriodMs) + " ms";
  require_ms(
      "detect.slot_timeout_ms", dc.slot_timeout_ms(), 5 * kReportPeriodMs,
      "agents send a heartbeat every " + period + ": a few late ones must not lose a healthy slot");
  require_ms("detect.controller_timeout_ms", dc.controller_timeout_ms(), 5 * kReportPeriodMs,
             "the controller answers a heartbeat every " + period +
                 ": a few late answers must not stop a healthy slot");
  require_ms("detect.liveness_timeout_ms", dc.liveness_timeout_ms(), 3 * kReportPeriodMs,
             "workers report every " + period + ": a late report must not make a rank hung");
  require_ms("detect.hang_grace_ms", dc.hang_grace_ms(), 3 * kReportPeriodMs,
             "the controller sees the step count through reports every " + period +
                 ": a shorter grace takes a healthy job between two reports for stalled; "
                 "0 leaves hangs to parallel.comm_timeout_ms",
             /*zero_is_off=*/true);
  require_ms("detect.quorum_timeout_ms", dc.quorum_timeout_ms(), 5000,
             "etcd elects a new Raft leader within seconds: a shorter wait stops a job that a "
             "member's loss only paused");
  v.require(dc.slow_round_steps() >= 0, "detect.slow_round_steps", dc.slow_round_steps(),
            "must be >= 0 (0 turns fail-slow detection off)");
  v.require(dc.slow_factor() > 1.0, "detect.slow_factor", dc.slow_factor(),
            "must be > 1 (a rank this many times its peers' median is slow)");
  v.require(dc.decline_factor() > 1.0, "detect.decline_factor", dc.decline_factor(),
            "must be > 1 (the job this many times slower than its recent median declines)");
  v.require(dc.slow_window() >= 1 && dc.slow_window() <= 100, "detect.slow_window",
            dc.slow_window(), "must be in [1, 100] rounds");
  v.require(dc.slow_rounds() >= 1 && dc.slow_rounds() <= dc.slow_window(), "detect.slow_rounds",
            dc.slow_rounds(),
            "must be in [1, detect.slow_window = " + show(dc.slow_window()) + "]");
  v.require(rc.repeat_window_steps() >= 0, "recovery.repeat_window_steps", rc.repeat_window_steps(),
            "must be >= 0 (0: a failure never counts as a repeat)");
  require_ms("recovery.diagnostics_timeout_ms", rc.diagnostics_timeout_ms(), 4000,
             "three group tests of at least a second each run in three quarters of it",
             /*zero_is_off=*/true);
  require_ms("recovery.standby_wait_ms", rc.standby_wait_ms(), 10000,
             "a standby's self-check (GEMM, golden mini-GPT, all-reduce) takes seconds: a "
             "shorter wait gives up on a standby that was about to be ready");
  require_ms("sdc.replay_timeout_ms", cfg.sdc().replay_timeout_ms(), 5000,
             "each phase starts a worker per machine, loads the plugin and data and runs a "
             "step");
  const auto& u = cfg.update();
  v.require(u.probation_steps() >= 0, "update.probation_steps", u.probation_steps(),
            "must be >= 0 (0: no probation)");
  v.require(std::isfinite(u.max_loss_jump()) && u.max_loss_jump() > 0, "update.max_loss_jump",
            u.max_loss_jump(), "must be positive (a loss above (1 + this) × the mean is a jump)");
  v.require(rc.on_no_standby() != config::RecoveryConfig::shrink_dp || !cfg.parallel().zero1(),
            "recovery.on_no_standby", Raw{"shrink_dp"},
            "needs parallel.zero1 = false (a ZeRO-1 shard of the dropped replica would be lost)");
  // Settings the chosen recovery.mode never reads are refused, not ignored: whoever set them
  // expects a behaviour the job would not have.
  using RC = config::RecoveryConfig;
  const std::string mode = RC::Mode_Name(rc.mode());
  v.require(dc.on_slot_loss() != config::DetectConfig::wait || rc.mode() == RC::in_place,
            "detect.on_slot_loss", Raw{"wait"},
            "needs recovery.mode = in_place, not " + mode + " (" + mode +
                " replaces a lost slot by a standby; to wait for one, set "
                "recovery.on_no_standby = wait)");
  v.require(rc.evict() == RC::culprit || rc.mode() == RC::hot_swap, "recovery.evict",
            Raw{RC::Evict_Name(rc.evict())},
            "needs recovery.mode = hot_swap, not " + mode + " (" + mode +
                (rc.mode() == RC::in_place ? " never evicts a slot)"
                                           : " restarts every rank; it evicts only lost slots)"));
  v.require(rc.on_no_standby() == RC::fail || rc.mode() != RC::in_place, "recovery.on_no_standby",
            Raw{RC::OnNoStandby_Name(rc.on_no_standby())},
            "needs recovery.mode = hot_swap or restart_all, not in_place (in_place never "
            "evicts a slot, so never looks for a standby; a lost slot follows "
            "detect.on_slot_loss)");
  v.require(rc.on_no_standby() != RC::shrink_dp || rc.mode() != RC::restart_all,
            "recovery.on_no_standby", Raw{"shrink_dp"},
            "needs recovery.mode = hot_swap, not restart_all (restart_all restarts every rank "
            "in the full layout; it cannot drop a replica)");
  v.require(rc.on_no_standby() != RC::reshape || rc.mode() == RC::hot_swap,
            "recovery.on_no_standby", Raw{"reshape"},
            "needs recovery.mode = hot_swap, not " + mode +
                " (the survivors re-lay their state out from each other's memory)");
  v.require(rc.on_no_standby() != RC::reshape || cfg.checkpoint().snapshot_every_step(),
            "recovery.on_no_standby", Raw{"reshape"},
            "needs checkpoint.snapshot_every_step = true (the new layout is read from the "
            "ranks' snapshots in memory)");

  const auto& r = cfg.runtime();
  v.require(
      r.precision() != config::RuntimeConfig::bf16 || r.device() == config::RuntimeConfig::cuda,
      "runtime.precision", Raw{config::RuntimeConfig::Precision_Name(r.precision())},
      "needs runtime.device = cuda, not " + config::RuntimeConfig::Device_Name(r.device()));
  v.require(r.threads() >= 0, "runtime.threads", r.threads(), "must be >= 0 (0: automatic)");
  v.require(r.threads() <= kMaxThreads, "runtime.threads", r.threads(),
            "must be at most " + show(kMaxThreads) + " (0: automatic)");
  v.require(r.blas_core() == "auto" || blas_core_rank(r.blas_core()) >= 0, "runtime.blas_core",
            r.blas_core(),
            "must be \"auto\" or an OpenBLAS x86-64 core (e.g. SkylakeX, Haswell, Zen, Prescott)");
  v.throw_if_any();
}

std::string config_to_text(const config::JobConfig& cfg) {
  config::JobConfig full = cfg;
  materialize_defaults(&full);
  pb::TextFormat::Printer printer;
  printer.SetUseShortRepeatedPrimitives(true);
  std::string out;
  printer.PrintToString(full, &out);
  return out;
}

}  // namespace keel
