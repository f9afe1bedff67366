// The job's event log, runs/<job>/events.jsonl: one keel.events.Event a line
// (proto/events.proto), printed by protobuf's JSON printer, so that user text in a field
// (a fault spec, a rank's message) is escaped, never pasted into JSON by hand.
#pragma once

#include <fstream>
#include <mutex>
#include <string>

#include "launcher/controller/event_fields.h"

namespace keel {

class EventLog {
 public:
  // Appends to `path` (created if missing).
  explicit EventLog(std::string path);

  // Writes {"t": now, "kind": kind, "data": data} as one line and flushes it. A line that
  // cannot be written (a full disk) costs the log, never the job: that is logged once, and
  // from then on every event goes to the log (glog) instead. Safe from any thread.
  void write(const std::string& kind, const EventFields& data = EventFields());

 private:
  std::mutex mu_;
  const std::string path_;
  std::ofstream out_;
  bool failed_ = false;
};

}  // namespace keel
