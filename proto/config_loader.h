// Reads, overrides and validates a job config (proto/config.proto). Every error is a
// keel::InputError that names where the value came from, the field and the value, e.g.
//   examples/configs/tiny.pbtxt:7: model.num_heads = 5: must divide model.hidden_size = 64
//   examples/configs/tiny.pbtxt (--set model.num_heads=5): model.num_heads = 5: ...
//   examples/configs/tiny.pbtxt (default): model.num_heads = 4: ...
#pragma once

#include <map>
#include <string>
#include <vector>

#include "proto/config.pb.h"
#include "runtime/check.h"  // keel::InputError, which these functions throw

namespace keel {

// Where each field of a config got its value, so that a validation error can point at it.
struct ConfigOrigin {
  std::string name;                         // the file (or label) the text came from
  std::map<std::string, int> lines;         // "model.num_heads" → 1-based line in the text
  std::map<std::string, std::string> sets;  // "model.num_heads" → "model.num_heads=5"
  // "name:7", "name (--set model.num_heads=5)" or "name (default)"; the last --set wins
  // over the text, as it does for the value.
  std::string where(const std::string& path) const;
};

// Reads a text-format JobConfig, applies `overrides` ("path=value") in order, fills derived
// defaults (model.ffn_hidden_size 0 → 4·hidden_size; model.padded_vocab_size 0 → vocab_size
// rounded up to a multiple of 128) and validates. Parse errors carry line and column.
config::JobConfig load_config(const std::string& path, const std::vector<std::string>& overrides);
// The same for text in memory; `name_for_errors` stands for the file in messages.
config::JobConfig parse_config_text(const std::string& text, const std::string& name_for_errors,
                                    const std::vector<std::string>& overrides);

// Applies one "path.to.field=value" assignment. The path is resolved through the schema
// (an unknown component is named in the error); the value is parsed as text format would
// (enums by name, e.g. optim.schedule=cosine; a message as {a: 1 b: 2}), except that string
// fields take the value verbatim unless it is in double quotes, and repeated fields take a
// comma-separated list, bare or in brackets, that replaces the old one
// (parallel.stage_layers=1,2 or =[1,2]; an empty value or [] clears it). On error *cfg is
// unchanged. Returns the paths of the fields it assigned.
std::vector<std::string> apply_override(config::JobConfig* cfg, const std::string& assignment);

// The SDC check period when the config leaves it unset in deterministic mode: its measured cost
// at this period is in bench/RESULTS.md (issue 15).
inline constexpr int kDefaultSdcCheckEverySteps = 100;

// Replaces the 0 ("derive me") values of model.ffn_hidden_size and model.padded_vocab_size,
// and an unset sdc.check_every_steps (kDefaultSdcCheckEverySteps in deterministic mode).
void fill_derived_defaults(config::JobConfig* cfg);

// Checks every constraint keel relies on (positive dims, divisibility by the parallel sizes,
// batch arithmetic, optimizer ranges, device/precision pairing, ...) and throws one
// InputError listing every violation, one per line, each located through `origin`.
void validate_config(const config::JobConfig& cfg, const ConfigOrigin& origin = {});

// The config as text format with every field written out, defaults included, so that a log
// records exactly what ran; parse_config_text reads it back to an equal config.
std::string config_to_text(const config::JobConfig& cfg);

}  // namespace keel
