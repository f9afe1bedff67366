// The fields of one event of the job's event log (runs/<job>/events.jsonl), as a protobuf
// Struct printed with protobuf's JSON printer: user text (a fault spec, a rank's message)
// is escaped, never pasted into JSON by hand.
#pragma once

#include <google/protobuf/struct.pb.h>

#include <string>

namespace keel {

class EventFields {
 public:
  EventFields& add(const std::string& key, double v) {
    (*s_.mutable_fields())[key].set_number_value(v);
    return *this;
  }
  EventFields& add(const std::string& key, const std::string& v) {
    (*s_.mutable_fields())[key].set_string_value(v);
    return *this;
  }
  EventFields& add(const std::string& key, const char* v) { return add(key, std::string(v)); }
  // The fields as a Struct, e.g. to nest them in a larger message
  // (launcher/controller/event_log.h).
  const google::protobuf::Struct& fields() const { return s_; }

 private:
  google::protobuf::Struct s_;
};

}  // namespace keel
