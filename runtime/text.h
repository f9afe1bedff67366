// Small text helpers shared by the command lines, the environment values the processes pass
// each other and lists of addresses (etcd endpoints).
#pragma once

#include <string>
#include <vector>

namespace keel {

// `text` cut at every `sep`: "a:b::c" gives a, b, "", c (a field per separator, so that a
// value's arity can be checked); with skip_empty, the empty fields are left out ("a,,b" gives
// a, b: a list the user typed).
inline std::vector<std::string> split(const std::string& text, char sep, bool skip_empty = false) {
  std::vector<std::string> out;
  size_t from = 0;
  while (true) {
    const size_t at = text.find(sep, from);
    std::string field = text.substr(from, at == std::string::npos ? std::string::npos : at - from);
    if (!skip_empty || !field.empty()) out.push_back(std::move(field));
    if (at == std::string::npos) return out;
    from = at + 1;
  }
}

// `parts` with `sep` between them: split's inverse ("a", "b" gives "a,b"); for prose, a
// longer separator ("a, b").
inline std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (const auto& p : parts) {
    if (!out.empty()) out += sep;
    out += p;
  }
  return out;
}
inline std::string join(const std::vector<std::string>& parts, char sep) {
  return join(parts, std::string(1, sep));
}

}  // namespace keel
