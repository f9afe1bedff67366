// How keel's library code speaks to operators: glog, written to stderr, one prefix for every
// process. Progress lines meant for people (step, loss, MFU) stay on stdout and do not go
// through here.
//
//   LOG(WARNING) << "rank " << r << ": " << why;
//
// A line reads "keel-worker W 23:42:14.123 worker.cc:247] rank 3: ...": the program, the
// severity letter, the wall time and the source line, then the message. Every binary calls
// init_logging() first thing in main(); a test binary that does not still logs (glog's
// default prefix), so library code never depends on it.
#pragma once

#include <glog/logging.h>

namespace keel {

// Sets glog up for this process: everything to stderr (no log files in /tmp), keel's prefix
// with `program` (e.g. "keel-worker") in front. Idempotent; later calls change nothing.
void init_logging(const char* program);

}  // namespace keel
