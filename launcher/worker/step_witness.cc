#include "launcher/worker/step_witness.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "parallel/comm_error.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "runtime/logging.h"

namespace keel {

int record_witness(const membership::Membership& m) {
  const int world = m.rank_slot_size();
  if (world == 0) return m.tp() * m.pp() * m.dp() > 1 ? 1 : -1;
  for (int r = 1; r < world; ++r)
    if (m.rank_slot(r) != m.rank_slot(0)) return r;
  return -1;
}

void StepWitness::step(Store& store, const report::StepRecord& r) {
  // A step run again (after a rollback) replaces its record and every later one.
  while (!kept_.empty() && kept_.back().step() >= r.step()) kept_.pop_back();
  kept_.push_back(r);
  if (kept_.size() > kKept) kept_.pop_front();
  if (owed_ && std::chrono::steady_clock::now() - tried_at_ >= std::chrono::seconds(1))
    write_missing(store);
}

bool StepWitness::write_missing(Store& store) {
  owed_ = true;
  tried_at_ = std::chrono::steady_clock::now();
  try {
    // Rank 0's progress covers its records of its own epoch only: a rolled-back epoch's
    // progress (further on than the rerun, or written by a rank 0 that has died since) says
    // nothing of the rerun's steps.
    const auto progress = try_get_message<store::Step>(store, keys::kProgress);
    std::vector<std::pair<std::string, std::string>> kvs;
    for (const report::StepRecord& r : kept_)
      if (!progress || r.epoch() != progress->epoch() || r.step() >= progress->step())
        kvs.emplace_back(keys::step_copy_key(r.step()), r.SerializeAsString());
    if (!kvs.empty()) store.set_all(kvs);
  } catch (const CommError& e) {
    LOG(WARNING) << "the witness's copies of the steps' records wait: " << e.what();
    return false;
  }
  // Each kept record is now in the store, rank 0's or its copy: the next failure writes the
  // steps after this one.
  kept_.clear();
  owed_ = false;
  return true;
}

}  // namespace keel
