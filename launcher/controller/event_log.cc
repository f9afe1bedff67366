#include "launcher/controller/event_log.h"

#include <google/protobuf/util/json_util.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "launcher/recovery_protocol.h"
#include "proto/events.pb.h"
#include "runtime/logging.h"

namespace keel {

EventLog::EventLog(std::string path) : path_(std::move(path)), out_(path_, std::ios::app) {}

void EventLog::write(const std::string& kind, const EventFields& data) {
  events::Event e;
  e.set_t(recovery::unix_now());
  e.set_kind(kind);
  *e.mutable_data() = data.fields();  // set even when empty: "data":{} on every line
  std::string line;
  const auto printed = google::protobuf::util::MessageToJsonString(e, &line);
  if (!printed.ok()) {
    // Only a number JSON cannot hold (NaN, infinity) gets here: the event still reaches glog.
    LOG(WARNING) << "event " << kind << " not written: " << printed.ToString() << ": "
                 << e.ShortDebugString();
    return;
  }
  std::lock_guard<std::mutex> l(mu_);
  if (!failed_) {
    out_ << line << '\n';
    out_.flush();
    if (out_) {
      VLOG(1) << line;
      return;
    }
    failed_ = true;
    LOG(WARNING) << path_ << ": cannot write (" << std::strerror(errno)
                 << "); the job goes on without it";
  }
  LOG(INFO) << "event: " << line;
}

}  // namespace keel
