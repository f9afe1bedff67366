#include "launcher/worker/sdc_checker.h"

#include <chrono>
#include <utility>

#include "parallel/word_gather.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "runtime/logging.h"

namespace keel {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Every rank's `n` floats, gathered over the world group, in rank order.
std::vector<float> gather(Communicator& world, const float* mine, size_t n) {
  std::vector<float> all(size_t(world.size()) * n);
  std::copy(mine, mine + n, all.begin() + long(size_t(world.rank()) * n));
  world.all_gather(all.data(), n);
  return all;
}

// The newest verified step, for the controller's SDC restore bound. A store out of reach
// (etcd without quorum) keeps the one before: an older bound is safe, and training goes on.
void set_verified(Store& store, int64_t step) {
  store::Step v;
  v.set_step(step);
  try {
    set_message(store, keys::kSdcVerified, v);
  } catch (const CommError& e) {
    LOG(WARNING) << "sdc: verified step " << step << " not recorded: " << e.what();
  }
}

}  // namespace

SdcChecker::SdcChecker(int every, bool zero1, bool injected,
                       std::function<GoldenCheckResult()> golden)
    : every_(every), zero1_(zero1), injected_(injected), golden_(std::move(golden)) {}

void SdcChecker::start(const SdcRank& r) {
  if (every_ <= 0 || !r.snapshotter) return;
  seconds_ += r.snapshotter->keep_verified(r.state->step());
  last_passed_ = r.state->step();
  if (r.leader) set_verified(*r.store, r.state->step());
}

void SdcChecker::before_step(int64_t s, const SdcRank& r) {
  // A check step that failed (a peer died) leaves nothing armed for the step run after the
  // recovery, which may be another one.
  armed_ = false;
  r.trainer->record_first_micro_batch(false);
  if (!sdc::is_check_step(s, every_)) return;
  const auto t0 = Clock::now();
  const Coord c = r.topo->coord(r.rank);
  const int target = sdc::recompute_target(c.dp, r.topo->dp(), sdc::check_index(s, every_));
  recomputed_ = target >= 0 ? r.trainer->recompute_first_micro_batch(target) : MicroBatchDigest{};
  r.trainer->record_first_micro_batch();
  armed_ = true;
  before_step_s_ = seconds_since(t0);
  seconds_ += before_step_s_;
}

void SdcChecker::before_update(int64_t s, const SdcRank& r) {
  if (!armed_) return;
  armed_ = false;
  const auto t0 = Clock::now();
  const int64_t k = sdc::check_index(s, every_);
  const Topology& topo = *r.topo;
  Communicator& world = *r.world;
  sdc::RankReport me;
  me.own = r.trainer->first_micro_batch();
  me.recomputed = recomputed_;
  const TrainState::Digests dg = r.state->digests();
  me.params = dg.spans[0];
  me.m = dg.spans[1];
  me.v = dg.spans[2];
  if (r.region)
    if (std::optional<SlotView> v = r.region->find(s)) {
      me.at_rest_known = true;
      me.at_rest_ok = v->checksum == dg.checksum;
    }
  float packed[sdc::RankReport::kFloats];
  me.pack(packed);
  const std::vector<float> all = gather(world, packed, sdc::RankReport::kFloats);
  std::vector<sdc::RankReport> reports;
  for (int q = 0; q < world.size(); ++q)
    reports.push_back(sdc::RankReport::unpack(all.data() + size_t(q) * sdc::RankReport::kFloats));
  sdc::Verdict v = sdc::judge(topo, k, reports, zero1_ && topo.dp() > 1);

  if (!v.recheck_replicas.empty()) {
    // A third opinion: the targets' replicas compute their own micro-batch once more (the
    // state is still the step's start: the update has not run).
    MicroBatchDigest again;
    if (v.recheck_replicas.count(topo.coord(r.rank).dp))
      again = r.trainer->recompute_first_micro_batch(topo.coord(r.rank).dp);
    const uint64_t w[2] = {again.grad, again.activation};
    const std::vector<uint64_t> a = all_gather_words(world, w, 2);
    std::vector<MicroBatchDigest> agains(size_t(world.size()));
    for (size_t q = 0; q < agains.size(); ++q) agains[q] = {a[2 * q], a[2 * q + 1]};
    v = sdc::judge_recheck(topo, k, reports, agains, v);
  }
  if (v.golden) {
    // A tie between replicas: every rank trains the golden mini-GPT through the same
    // (possibly defective) unit, and whoever differs from the reference is named.
    const GoldenCheckResult g = golden_();
    v = sdc::judge_golden(v, all_gather_words(world, &g.digest, 1), golden_reference(g.key));
  }
  seconds_ += seconds_since(t0);
  if (!v.clean) found(s, v, r);
  if (r.snapshotter) seconds_ += r.snapshotter->keep_verified(s);
  last_passed_ = s;
  if (r.reporter) r.reporter->sdc_passed(s + 1);
  if (r.leader) {
    set_verified(*r.store, s);
    ++uncounted_;
    try {
      r.store->add(keys::kSdcChecks, uncounted_);
      uncounted_ = 0;
    } catch (const CommError& e) {
      LOG(WARNING) << "sdc: check of step " << s << " counted later: " << e.what();
    }
  }
}

void SdcChecker::count_the_rest(Store& store) {
  if (uncounted_ == 0) return;
  store.add(keys::kSdcChecks, uncounted_);
  uncounted_ = 0;
}

void SdcChecker::found(int64_t s, const sdc::Verdict& v, const SdcRank& r) {
  const std::optional<store::Step> verified_step =
      try_get_message<store::Step>(*r.store, keys::kSdcVerified);
  const int64_t verified = verified_step ? verified_step->step() : -1;
  report::Incident inc;
  inc.set_kind("sdc");
  inc.set_rank(v.culprits.empty() ? -1 : v.culprits.front());
  inc.set_step(int(s));
  inc.set_tensor_class(v.tensor_class);
  inc.set_found_by(v.how.empty() ? "recompute" : v.how);
  inc.set_rule("sdc_" + inc.found_by());
  inc.set_first_bad_step(int(verified + 1));
  inc.set_verified_step(int(verified));
  inc.set_detail(detail::concat("step ", s + 1, ": ", v.detail));
  // Every rank reached the same verdict from the same digests; whichever write lands last
  // writes the same bytes.
  set_message(*r.store, keys::sdc_verdict_key(r.epoch), inc);
  if (!r.quiet && r.leader)
    LOG(WARNING) << "silent data corruption at step " << s + 1 << ": " << v.detail;
  throw SdcFound(inc.detail());
}

std::string SdcChecker::coverage(const Topology& topo, bool at_rest) const {
  if (every_ <= 0) return "off (sdc.check_every_steps = 0)";
  const bool zero1 = zero1_ && topo.dp() > 1;
  std::string c = detail::concat("every ", every_, " steps: ");
  if (topo.dp() > 1) {
    c += "recompute (each replica recomputes another's first micro-batch: gradients and "
         "stage-boundary activations, bitwise), agreement (parameters";
    c += zero1 ? " after the all-gather; moments are ZeRO-1 shards, not compared)" : ", moments)";
  } else {
    c += "no DP replica, so no recompute and no agreement: gradients and activations are not "
         "checked";
  }
  if (at_rest) c += "; at rest (the state against its snapshot's checksum)";
  c += ". Not covered: micro-batches after the first, and steps between checks whose error "
       "was averaged into every replica's update (a transient flip there is missed)";
  return c;
}

std::vector<std::string> SdcChecker::missed(const std::vector<InjectionRecord>& injections,
                                            const report::RunReport& rep,
                                            const Topology& topo) const {
  std::vector<std::string> out;
  for (const InjectionRecord& in : injections) {
    if (in.kind != "sdc") continue;
    bool caught = false;
    for (const auto& inc : rep.incidents())
      caught = caught || (inc.kind() == "sdc" && inc.rank() == in.rank && inc.step() >= in.step);
    if (caught) continue;
    std::string why = every_ <= 0
                          ? "the checks are off"
                          : detail::concat(
                                "no check covered it: checks compare the first micro-batch at "
                                "steps that are multiples of ",
                                every_, ", and step ", in.step + 1,
                                " is not one (a transient gradient or activation flip there is "
                                "averaged into every replica's update)");
    if (topo.dp() < 2 && every_ > 0)
      why = "no DP replica to compare with (only state at rest is checked)";
    out.push_back(detail::concat("sdc on rank ", in.rank, " at step ", in.step + 1, ": ", why));
  }
  return out;
}

}  // namespace keel
