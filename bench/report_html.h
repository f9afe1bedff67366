// keel-bench's report.html: one self-contained page (inline SVG and CSS, no scripts, nothing
// fetched) that a person reads: loss and MFU over time per run with incidents marked, an
// incident timeline by phase, ETTR per policy and the per-incident table.
#pragma once

#include <string>

#include "proto/bench.pb.h"

namespace keel::bench {

// The page for `rep`; well-formed XHTML (it parses as XML).
std::string report_html(const BenchReport& rep);

}  // namespace keel::bench
