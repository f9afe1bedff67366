// The soak's memory picture: resident memory over time of every process of the job that
// lived through most of it, one line each, as a self-contained SVG (DIR/soak-rss.svg).
#pragma once

#include <string>

#include "bench/process_watch.h"

namespace keel::bench {

std::string soak_rss_svg(const ProcessWatch& watch, double wall_s);

}  // namespace keel::bench
