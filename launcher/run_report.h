// What a training run reports: the JSON file of --report (proto/report.proto through
// protobuf's JSON printer, for tests, benchmarks and later tools) and the loss curve of
// --loss-svg (for a person).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/topology.h"
#include "proto/report.pb.h"
#include "runtime/check.h"

namespace keel {

using RunReport = report::RunReport;

// The report's name of a layout, e.g. "tp2 pp2 dp2".
inline std::string layout_name(const Topology& t) {
  return detail::concat("tp", t.tp(), " pp", t.pp(), " dp", t.dp());
}

// Each writes `path` whole or leaves it as it was; a failure (a full disk) throws keel::Error
// naming the file and why, and leaves no temporary file behind.
void write_report_json(const std::string& path, const RunReport& r);

// A self-contained SVG line chart of the losses by step.
void write_loss_svg(const std::string& path, const RunReport& r);

// FNV-1a 64 over each tensor's name and float bytes, in the order given: a digest of the
// parameters that does not depend on the parallel layout.
class ParamDigest {
 public:
  void add(const std::string& name, const std::vector<float>& values);
  std::string hex() const;

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

}  // namespace keel
