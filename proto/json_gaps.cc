#include "proto/json_gaps.h"

#include <cctype>
#include <vector>

#include <google/protobuf/util/json_util.h>

namespace keel {
namespace {

// Copies `json` to the result, replacing each array element that is the value `from` by `to`:
// the per-step arrays are where keel leaves values unmeasured, and an object's text (a
// reason that reads "NaN") or key is left alone. `from` is either a whole string token
// ("\"NaN\"") or a bare one ("null").
std::string replace_values(const std::string& json, const std::string& from,
                           const std::string& to) {
  std::string out;
  out.reserve(json.size());
  std::vector<char> open;  // '[' or '{' of each enclosing container
  size_t i = 0;
  while (i < json.size()) {
    const char c = json[i];
    const bool in_array = !open.empty() && open.back() == '[';
    if (in_array && json.compare(i, from.size(), from) == 0) {
      const size_t after = i + from.size();
      const bool whole =
          after >= json.size() || !std::isalnum(static_cast<unsigned char>(json[after]));
      if (whole) {
        out += to;
        i = after;
        continue;
      }
    }
    if (c == '"') {
      // A string: copied whole, escapes included.
      size_t j = i + 1;
      while (j < json.size() && json[j] != '"') j += json[j] == '\\' ? 2 : 1;
      out.append(json, i, j + 1 - i);
      i = j + 1;
      continue;
    }
    if (c == '[' || c == '{') open.push_back(c);
    if ((c == ']' || c == '}') && !open.empty()) open.pop_back();
    out += c;
    ++i;
  }
  return out;
}

}  // namespace

std::string nan_as_null(const std::string& json) {
  return replace_values(json, "\"NaN\"", "null");
}

std::string null_as_nan(const std::string& json) {
  return replace_values(json, "null", "\"NaN\"");
}

std::string message_from_json(const std::string& json, google::protobuf::Message* m) {
  google::protobuf::util::JsonParseOptions o;
  o.ignore_unknown_fields = true;
  const auto st = google::protobuf::util::JsonStringToMessage(null_as_nan(json), m, o);
  return st.ok() ? "" : std::string(st.message());
}

}  // namespace keel
