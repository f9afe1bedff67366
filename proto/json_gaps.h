// Values keel did not measure, in JSON: a per-step array's missing value is NaN in the message
// (a double has no null) and null in the JSON keel writes (reports, keel-bench's files), so
// that no reader takes it for data. Protobuf's JSON printer writes NaN as the string "NaN" and
// its parser refuses null inside an array: these two turn one into the other, in arrays only
// (an object's text that reads "NaN" stays a text).
#pragma once

#include <string>

#include <google/protobuf/message.h>

namespace keel {

// `json` (as MessageToJsonString printed it) with every "NaN" array element written as null.
std::string nan_as_null(const std::string& json);
// `json` with every null array element written as "NaN", for JsonStringToMessage.
std::string null_as_nan(const std::string& json);

// Parses `json` (a report keel wrote, nulls and all; fields it does not know ignored, as a
// newer keel's) into `m`. Returns "" or why it could not.
std::string message_from_json(const std::string& json, google::protobuf::Message* m);

}  // namespace keel
