#include "robust/diagnostics.h"

#include <algorithm>
#include <cstdio>

#include "runtime/check.h"

namespace keel::diag {
namespace {

std::string rate_text(double bytes_per_s) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.1f MB/s", bytes_per_s / 1e6);
  return b;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string slot_list(const std::set<int>& slots) {
  std::string s;
  for (int x : slots) s += detail::concat(s.empty() ? "" : ", ", x);
  return s;
}

}  // namespace

Verdict judge(const std::vector<report::Diagnostic>& rows, const std::set<int>& suspect_slots,
              double slow_factor) {
  // Every slot's findings, suspect or not: the summary names both.
  std::map<int, std::vector<std::string>> found;
  std::map<int, int> slot_of_rank;
  for (const report::Diagnostic& d : rows) slot_of_rank[d.rank()] = d.slot();

  struct Member {
    int rank, slot;
    const report::DiagnosticGroup* g;
  };
  std::map<std::string, std::vector<Member>> groups;
  for (const report::Diagnostic& d : rows) {
    const int r = d.rank();
    auto& f = found[d.slot()];
    if (!d.answered()) {
      f.push_back(detail::concat("rank ", r, " did not answer"));
      continue;
    }
    if (!d.error().empty()) {
      f.push_back(detail::concat("rank ", r, ": ", d.error()));
      continue;
    }
    if (!d.gemm_ok())
      f.push_back(detail::concat("rank ", r, ": GEMM off by ", d.gemm_max_rel_error()));
    if (!d.golden_ok()) f.push_back(detail::concat("rank ", r, ": golden mini-GPT differs"));
    for (const report::DiagnosticGroup& g : d.groups())
      groups[g.group()].push_back({r, d.slot(), &g});
  }

  std::vector<std::string> notes;  // what failed without failing a slot
  for (const auto& [name, members] : groups) {
    // A failed test: the rank more than half of its failing members name.
    std::map<int, int> votes;
    int failing = 0;
    for (const Member& m : members)
      if (!m.g->ok()) {
        ++failing;
        if (m.g->blamed_rank() >= 0) ++votes[m.g->blamed_rank()];
      }
    // A member that names itself knows its links are broken; its peers' failures after it
    // may be blamed on one another (a ring passes the break along) and need not agree.
    std::set<int> confessed;
    for (const Member& m : members)
      if (!m.g->ok() && m.g->blamed_rank() == m.rank) {
        confessed.insert(m.rank);
        found[m.slot].push_back(detail::concat("rank ", m.rank, " broke its links in ", name));
      }
    if (failing > 0) {
      int blamed = -1;
      for (const auto& [r, n] : votes)
        if (2 * n > failing) blamed = r;
      const auto at = slot_of_rank.find(blamed);
      if (blamed >= 0 && !confessed.count(blamed) && at != slot_of_rank.end())
        found[at->second].push_back(detail::concat("rank ", blamed, " named by ", votes[blamed],
                                                   " of ", failing, " failing member",
                                                   failing == 1 ? "" : "s", " of ", name));
      else if (confessed.empty())
        notes.push_back(detail::concat(name, " failed for ", failing, " member",
                                       failing == 1 ? "" : "s", " without a culprit"));
    }
    // A slow link: a member well below its group's median send rate.
    std::vector<double> rates;
    for (const Member& m : members)
      if (m.g->ok() && m.g->bytes_per_s() > 0) rates.push_back(m.g->bytes_per_s());
    if (rates.size() < 3) continue;
    const double med = median(rates);
    for (const Member& m : members)
      if (m.g->ok() && m.g->bytes_per_s() > 0 && m.g->bytes_per_s() < med / slow_factor)
        found[m.slot].push_back(detail::concat("rank ", m.rank, ": slow link in ", name, " (",
                                               rate_text(m.g->bytes_per_s()), ", median ",
                                               rate_text(med), ")"));
  }

  Verdict v;
  std::set<int> passed, unchecked = suspect_slots;
  std::string others;
  for (const auto& [slot, why] : found) {
    unchecked.erase(slot);
    if (!suspect_slots.count(slot)) {
      for (const std::string& w : why)
        others += detail::concat(others.empty() ? "" : "; ", "slot ", slot, " ", w);
      continue;
    }
    if (why.empty()) {
      passed.insert(slot);
      continue;
    }
    v.failed_slots.push_back(slot);
    v.reasons[slot] = why;
  }

  std::string s;
  for (int slot : v.failed_slots) {
    std::string w;
    for (const std::string& x : v.reasons[slot]) w += detail::concat(w.empty() ? "" : "; ", x);
    s += detail::concat(s.empty() ? "" : ", ", "slot ", slot, " fails (", w, ")");
  }
  if (v.failed_slots.empty())
    s = passed.empty() ? "no suspect slot was checked"
                       : detail::concat("suspect slot", passed.size() == 1 ? " " : "s ",
                                        slot_list(passed), " passed");
  else if (!passed.empty())
    s += detail::concat("; slot", passed.size() == 1 ? " " : "s ", slot_list(passed), " passed");
  s += detail::concat(" (", rows.size(), " process", rows.size() == 1 ? "" : "es", ")");
  if (!unchecked.empty())
    s += detail::concat("; slot", unchecked.size() == 1 ? " " : "s ", slot_list(unchecked),
                        " not checked (no process)");
  for (const std::string& n : notes) s += "; " + n;
  if (!others.empty()) s += "; not suspect: " + others;
  v.summary = s;
  return v;
}

}  // namespace keel::diag
