#include "robust/etcd_member_place.h"

#include <algorithm>
#include <map>

#include "runtime/check.h"

namespace keel {
namespace {

// `n` of the `size` items 0..size-1, spread evenly: item floor(k * size / n) for each k, so
// that the first is always taken and the gaps differ by at most one.
std::vector<size_t> spread(size_t n, size_t size) {
  std::vector<size_t> at;
  for (size_t k = 0; k < n; ++k) at.push_back(k * size / n);
  return at;
}

std::string domain_of(int slot, const std::vector<std::string>& domains) {
  return slot >= 0 && size_t(slot) < domains.size() ? domains[size_t(slot)] : std::string();
}

}  // namespace

int etcd_member_count(int slots, int asked) {
  if (slots < 3) return 0;
  if (asked > 0) return std::min(asked, slots);
  return slots >= 5 ? 5 : 3;
}

std::vector<int> place_etcd_members(int n, const std::vector<std::string>& domains) {
  KEEL_CHECK(n >= 1 && size_t(n) <= domains.size(), "etcd members: ", n, " on ", domains.size(),
             " slots");
  // Each domain's slots, the domains in the order of their first slot.
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> slots_of;
  for (size_t k = 0; k < domains.size(); ++k) {
    if (!slots_of.count(domains[k])) order.push_back(domains[k]);
    slots_of[domains[k]].push_back(int(k));
  }
  // How many members each domain gets: one each while members are left, the domains taken
  // spread over the slot numbers when there are more domains than members; then round after
  // round to the domains with slots to spare, in order.
  std::map<std::string, size_t> share;
  size_t left = size_t(n);
  if (order.size() >= left) {
    for (size_t i : spread(left, order.size())) share[order[i]] = 1;
    left = 0;
  }
  while (left > 0) {
    for (const std::string& d : order) {
      if (left == 0) break;
      if (share[d] < slots_of[d].size()) {
        ++share[d];
        --left;
      }
    }
  }
  std::vector<int> at;
  for (const auto& [d, count] : share)
    for (size_t i : spread(count, slots_of[d].size())) at.push_back(slots_of[d][i]);
  std::sort(at.begin(), at.end());
  return at;
}

int etcd_replacement_slot(const std::vector<int>& candidates, const std::vector<int>& kept_slots,
                          const std::vector<std::string>& domains) {
  int best = -1;
  size_t best_count = 0;
  for (int c : candidates) {
    const std::string d = domain_of(c, domains);
    const size_t count = size_t(std::count_if(kept_slots.begin(), kept_slots.end(),
                                              [&](int k) { return domain_of(k, domains) == d; }));
    if (best < 0 || count < best_count || (count == best_count && c < best)) {
      best = c;
      best_count = count;
    }
  }
  return best;
}

std::string etcd_members_survive(int n) {
  const int lost = (n - 1) / 2;
  if (lost <= 0) return "no lost machine";
  static const char* const kWords[] = {"", "one", "two", "three", "four"};
  const std::string count = lost < 5 ? kWords[lost] : std::to_string(lost);
  return count + (lost == 1 ? " lost machine" : " lost machines");
}

}  // namespace keel
