#include "robust/stack_groups.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <sstream>
#include <string_view>
#include <utility>

#include "robust/hang_rules.h"

namespace keel {
namespace {

// Only the innermost keel frames say whether a rank waits: an outer frame's name (the
// worker's run loop, say) could match a marker on every rank.
constexpr size_t kWaitDepth = 8;
// Frames of a group shown in a one-line reason.
constexpr size_t kWhereFrames = 3;

// "f(int) (keel-worker)" -> "f(int)"; "?? (lib.so+0x1a)" stays whole.
std::string function_of(const std::string& frame) {
  const auto p = frame.rfind(" (");
  if (p == std::string::npos || frame.compare(0, 2, "??") == 0) return frame;
  return frame.substr(0, p);
}

std::string module_of(const std::string& frame) {
  const auto p = frame.rfind(" (");
  if (p == std::string::npos || frame.back() != ')') return "";
  std::string m = frame.substr(p + 2, frame.size() - p - 3);
  if (const auto plus = m.rfind("+0x"); plus != std::string::npos) m.resize(plus);
  return m;
}

bool contains_any(const std::string& text, const std::vector<std::string>& needles) {
  for (const auto& n : needles)
    if (!n.empty() && text.find(n) != std::string::npos) return true;
  return false;
}

bool is_waiting(const std::vector<std::string>& signature, const StackGroupOptions& o) {
  for (size_t i = 0; i < signature.size() && i < kWaitDepth; ++i)
    if (contains_any(function_of(signature[i]), o.wait_markers)) return true;
  return false;
}

// "keel::spin_forever() <- keel::StepLoop::run() <- ...": where a group's main threads are.
std::string where(const StackGroup& g) {
  if (g.signature.empty()) return "(no frames)";
  std::string out;
  for (size_t i = 0; i < g.signature.size() && i < kWhereFrames; ++i)
    out += (i ? " <- " : "") + short_function(function_of(g.signature[i]));
  if (g.signature.size() > kWhereFrames) out += " <- ...";
  return out;
}

std::string ranks_phrase(const std::vector<int>& ranks) {
  return ranks.size() == 1 ? "rank " + format_ranks(ranks) : "ranks " + format_ranks(ranks);
}

// "rank 5's main thread is in X" / "ranks 3,5's main threads are in X (3), Y (5)".
std::string culprits_phrase(const std::vector<const StackGroup*>& groups,
                            const std::vector<int>& culprits) {
  std::string out = ranks_phrase(culprits) +
                    (culprits.size() == 1 ? "'s main thread is in " : "'s main threads are in ");
  if (groups.size() == 1) return out + where(*groups[0]);
  for (size_t i = 0; i < groups.size(); ++i)
    out += (i ? ", " : "") + where(*groups[i]) + " (" + format_ranks(groups[i]->ranks) + ")";
  return out;
}

// "7 ranks wait in X (5), Y (2)" or "7 ranks are in X".
std::string healthy_phrase(const std::vector<const StackGroup*>& groups, size_t n, bool wait) {
  std::string out = std::to_string(n) + (n == 1 ? " rank " : " ranks ") +
                    (wait ? (n == 1 ? "waits in " : "wait in ") : (n == 1 ? "is in " : "are in "));
  if (groups.size() == 1) return out + where(*groups[0]);
  for (size_t i = 0; i < groups.size(); ++i)
    out +=
        (i ? ", " : "") + where(*groups[i]) + " (" + std::to_string(groups[i]->ranks.size()) + ")";
  return out;
}

// Largest first, then by lowest rank (then name): the order the summary shows them in.
template <typename Key>
std::vector<StackGroup> sorted_groups(std::map<Key, StackGroup> by_key) {
  std::vector<StackGroup> out;
  for (auto& [key, g] : by_key) {
    std::sort(g.ranks.begin(), g.ranks.end());
    out.push_back(std::move(g));
  }
  std::sort(out.begin(), out.end(), [](const StackGroup& a, const StackGroup& b) {
    if (a.ranks.size() != b.ranks.size()) return a.ranks.size() > b.ranks.size();
    if (a.ranks.front() != b.ranks.front()) return a.ranks.front() < b.ranks.front();
    return a.name < b.name;
  });
  return out;
}

}  // namespace

std::string normalise_frame(const std::string& frame) {
  const auto p = frame.rfind(" (");
  if (p == std::string::npos || frame.compare(0, 2, "??") == 0) return frame;
  const auto plus = frame.rfind("+0x", p);
  if (plus == std::string::npos || plus + 3 == p) return frame;
  for (size_t i = plus + 3; i < p; ++i)
    if (!std::isxdigit(static_cast<unsigned char>(frame[i]))) return frame;
  return frame.substr(0, plus) + frame.substr(p);
}

std::string short_function(const std::string& function) {
  std::string f = function;
  if (f.compare(0, 2, "??") == 0) return f;
  if (const auto p = f.find(" [clone"); p != std::string::npos) f.resize(p);
  const std::string_view konst = " const";
  if (f.size() > konst.size() && f.compare(f.size() - konst.size(), konst.size(), konst) == 0)
    f.resize(f.size() - konst.size());
  const std::string anon = "(anonymous namespace)::";
  for (auto p = f.find(anon); p != std::string::npos; p = f.find(anon)) f.erase(p, anon.size());
  // Drop what is inside brackets at any depth (arguments, template arguments), and a return
  // type: whatever precedes the last space outside brackets.
  std::string flat;
  int depth = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    const char c = f[i];
    // "operator()" and "operator<" are names, not brackets.
    if (f.compare(i, 8, "operator") == 0) {
      size_t j = i + 8;
      if (f.compare(j, 2, "()") == 0 || f.compare(j, 2, "[]") == 0)
        j += 2;
      else
        while (j < f.size() && j < i + 11 &&
               std::string_view("<>=!+-*/%&|^~,").find(f[j]) != std::string_view::npos)
          ++j;
      if (depth == 0) flat += f.substr(i, j - i);
      i = j - 1;
      continue;
    }
    if (c == '(' || c == '<' || c == '{' || c == '[') ++depth;
    if (depth == 0) {
      if (c == ' ')
        flat.clear();  // a return type, or "unsigned long" in a name: keep the last
      else
        flat += c;
    }
    if ((c == ')' || c == '>' || c == '}' || c == ']') && depth > 0) --depth;
  }
  // At most the last two scopes: "SocketCommunicator::all_reduce", not keel::...
  std::vector<std::string> parts;
  for (size_t p = 0; p <= flat.size();) {
    size_t q = flat.find("::", p);
    if (q == std::string::npos) q = flat.size();
    if (q > p) parts.push_back(flat.substr(p, q - p));  // a lambda's scope leaves "::::"
    p = q + 2;
  }
  if (parts.empty()) return function;
  std::string out = parts.size() > 1 ? parts[parts.size() - 2] + "::" : "";
  out += parts.back();
  return out.find("operator") != std::string::npos ? out : out + "()";
}

std::vector<std::string> stack_signature(const std::vector<std::string>& frames,
                                         const StackGroupOptions& options) {
  std::vector<std::string> all;
  for (const auto& f : frames) all.push_back(normalise_frame(f));
  // Everything from main() outward (libc's start-up) is the same on every rank.
  size_t end = all.size();
  for (size_t i = 0; i < all.size(); ++i)
    if (function_of(all[i]) == "main") {
      end = i;
      break;
    }
  // Inner frames of libraries (poll, recv, a futex) differ by timing, not by where the rank
  // is: start at the innermost frame of keel's own code.
  size_t begin = 0;
  while (begin < end && !contains_any(module_of(all[begin]), options.own_modules)) ++begin;
  if (begin == end) begin = 0;   // no keel frame at all: the library frames are all we have
  if (begin == end) return all;  // main() itself, or nothing before it
  return std::vector<std::string>(all.begin() + long(begin), all.begin() + long(end));
}

StackVerdict group_stacks(const std::vector<RankThreads>& ranks, const StackGroupOptions& options) {
  StackVerdict v;
  std::map<std::vector<std::string>, StackGroup> mains;
  std::map<std::pair<std::string, std::vector<std::string>>, StackGroup> helpers;
  for (const RankThreads& r : ranks) {
    bool have_main = false;
    for (const auto& t : r.threads) {
      if (t.frames.empty()) continue;
      std::vector<std::string> sig = stack_signature(t.frames, options);
      if (t.main && !have_main) {
        have_main = true;
        StackGroup& g = mains[sig];
        g.signature = sig;
        g.ranks.push_back(r.rank);
        g.waiting = is_waiting(sig, options);
      } else if (!t.main) {
        StackGroup& g = helpers[{t.name, sig}];
        g.name = t.name;
        g.signature = std::move(sig);
        if (g.ranks.empty() || g.ranks.back() != r.rank) g.ranks.push_back(r.rank);
      }
    }
    if (!have_main) v.unknown.push_back(r.rank);
  }
  v.groups = sorted_groups(std::move(mains));
  v.helpers = sorted_groups(std::move(helpers));
  std::sort(v.unknown.begin(), v.unknown.end());
  const std::string unknown_note =
      v.unknown.empty() ? "" : "; no stack from " + ranks_phrase(v.unknown);

  size_t n = 0;
  for (const auto& g : v.groups) n += g.ranks.size();
  if (n < 2) {
    v.reason = "fewer than 2 ranks' main-thread stacks: nothing to compare" + unknown_note;
    return v;
  }

  // Rule 1: ranks that wait on the others, and fewer that do not.
  std::vector<const StackGroup*> waiting, active;
  std::vector<int> waiting_ranks, active_ranks;
  for (const auto& g : v.groups) {
    (g.waiting ? waiting : active).push_back(&g);
    auto& into = g.waiting ? waiting_ranks : active_ranks;
    into.insert(into.end(), g.ranks.begin(), g.ranks.end());
  }
  std::sort(waiting_ranks.begin(), waiting_ranks.end());
  std::sort(active_ranks.begin(), active_ranks.end());
  // One rank outside every wait while another waits is the one waited for, even at 1:1.
  if (!waiting.empty() && !active.empty() &&
      (active_ranks.size() < waiting_ranks.size() || active_ranks.size() == 1)) {
    v.culprits = active_ranks;
    v.healthy = waiting_ranks;
    v.reason = culprits_phrase(active, v.culprits) + " while " +
               healthy_phrase(waiting, waiting_ranks.size(), /*wait=*/true) + unknown_note;
    return v;
  }

  // Rule 2: a signature shared by more than half of the ranks; the rest are outliers.
  const StackGroup& top = v.groups.front();
  if (2 * top.ranks.size() > n) {
    v.healthy = top.ranks;
    std::vector<const StackGroup*> others;
    for (size_t i = 1; i < v.groups.size(); ++i) {
      others.push_back(&v.groups[i]);
      v.culprits.insert(v.culprits.end(), v.groups[i].ranks.begin(), v.groups[i].ranks.end());
    }
    std::sort(v.culprits.begin(), v.culprits.end());
    if (v.culprits.empty()) {
      v.reason = "all " + std::to_string(n) + " ranks' main threads are in " + where(top) +
                 ": no outlier" + unknown_note;
    } else {
      v.reason = culprits_phrase(others, v.culprits) + " while " +
                 healthy_phrase({&top}, top.ranks.size(), top.waiting) + unknown_note;
    }
    return v;
  }

  // Rule 3: no majority, so no outlier.
  if (top.ranks.size() == 1) {
    v.reason = "every rank's main thread is somewhere else (" + std::to_string(n) +
               " different stacks): no outlier" + unknown_note;
  } else {
    std::string sizes;
    for (const auto& g : v.groups)
      sizes += (sizes.empty() ? "" : ", ") + std::to_string(g.ranks.size());
    v.reason = "no main-thread stack is shared by more than half of the " + std::to_string(n) +
               " ranks (groups of " + sizes + "): no outlier" + unknown_note;
  }
  return v;
}

std::string format_verdict(const StackVerdict& v) {
  std::ostringstream os;
  auto list = [](const std::vector<int>& r) {
    return r.empty() ? std::string("-") : format_ranks(r);
  };
  os << "verdict: " << v.reason << "\n"
     << "culprits: " << list(v.culprits) << "\n"
     << "healthy: " << list(v.healthy) << "\n"
     << "no stack: " << list(v.unknown) << "\n\n"
     << "main threads, " << v.groups.size() << " group(s):\n";
  for (const auto& g : v.groups) {
    os << "  " << g.ranks.size() << " rank(s) " << format_ranks(g.ranks)
       << (g.waiting ? " (waiting)" : "") << ":\n";
    for (const auto& f : g.signature) os << "      " << f << "\n";
  }
  os << "\nother threads, " << v.helpers.size() << " group(s):\n";
  for (const auto& g : v.helpers) {
    os << "  " << g.ranks.size() << " rank(s) " << format_ranks(g.ranks) << ", thread \"" << g.name
       << "\":\n";
    for (const auto& f : g.signature) os << "      " << f << "\n";
  }
  return os.str();
}

}  // namespace keel
