// A rank's part in the silent data corruption checks (DESIGN.md, Determinism): it computes
// and gathers digests, asks robust/sdc_check.h what they mean, and either keeps the state as
// verified or hands the verdict to the controller, which evicts and rolls back.
#include "launcher/worker/worker_impl.h"
#include "parallel/word_gather.h"
#include "robust/golden_check.h"
#include "runtime/logging.h"

namespace keel::worker_detail {
namespace {

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

}  // namespace

void Worker::sdc_start() {
  if (sdc_every_ <= 0 || !snapshotter_) return;
  sdc_seconds_ += snapshotter_->keep_verified(state_->step());
  sdc_last_passed_ = state_->step();
  if (leader_) store_->set(keys::kSdcVerified, std::to_string(state_->step()));
}

void Worker::sdc_before_step(int64_t s) {
  // A check step that failed (a peer died) leaves nothing armed for the step run after the
  // recovery, which may be another one.
  sdc_armed_ = false;
  trainer_->record_first_micro_batch(false);
  if (!sdc::is_check_step(s, sdc_every_)) return;
  const auto t0 = Clock::now();
  const Coord c = topo_.coord(o_.rank);
  const int target = sdc::recompute_target(c.dp, topo_.dp(), sdc::check_index(s, sdc_every_));
  sdc_recomputed_ =
      target >= 0 ? trainer_->recompute_first_micro_batch(target) : MicroBatchDigest{};
  trainer_->record_first_micro_batch();
  sdc_armed_ = true;
  sdc_before_step_s_ = seconds_since(t0);
  sdc_seconds_ += sdc_before_step_s_;
}

void Worker::sdc_before_update(int64_t s) {
  if (!sdc_armed_) return;
  sdc_armed_ = false;
  const auto t0 = Clock::now();
  const int64_t k = sdc::check_index(s, sdc_every_);
  Communicator& world = *groups_->world;
  sdc::RankReport me;
  me.own = trainer_->first_micro_batch();
  me.recomputed = sdc_recomputed_;
  const TrainState::Digests dg = state_->digests();
  me.params = dg.spans[0];
  me.m = dg.spans[1];
  me.v = dg.spans[2];
  if (region_)
    if (std::optional<SlotView> v = region_->find(s)) {
      me.at_rest_known = true;
      me.at_rest_ok = v->checksum == dg.checksum;
    }
  float packed[sdc::RankReport::kFloats];
  me.pack(packed);
  const std::vector<float> all = gather(world, packed, sdc::RankReport::kFloats);
  std::vector<sdc::RankReport> reports;
  for (int r = 0; r < world.size(); ++r)
    reports.push_back(sdc::RankReport::unpack(all.data() + size_t(r) * sdc::RankReport::kFloats));
  sdc::Verdict v = sdc::judge(topo_, k, reports, cfg_.parallel().zero1() && topo_.dp() > 1);

  if (!v.recheck_replicas.empty()) {
    // A third opinion: the targets' replicas compute their own micro-batch once more (the
    // state is still the step's start: the update has not run).
    MicroBatchDigest again;
    if (v.recheck_replicas.count(topo_.coord(o_.rank).dp))
      again = trainer_->recompute_first_micro_batch(topo_.coord(o_.rank).dp);
    const uint64_t w[2] = {again.grad, again.activation};
    const std::vector<uint64_t> a = all_gather_words(world, w, 2);
    std::vector<MicroBatchDigest> agains(size_t(world.size()));
    for (size_t r = 0; r < agains.size(); ++r) agains[r] = {a[2 * r], a[2 * r + 1]};
    v = sdc::judge_recheck(topo_, k, reports, agains, v);
  }
  if (v.golden) {
    // A tie between replicas: every rank trains the golden mini-GPT through the same
    // (possibly defective) unit, and whoever differs from the reference is named.
    const Precision precision = config_precision(cfg_);
    if (!golden_backend_)
      golden_backend_ = backend_->kind() == DeviceKind::kCpu
                            ? make_cpu_backend(1)
                            : make_rank_backend(cfg_, o_.rank, o_.local_world_size);
    TrainerHooks hooks;
    if (injector_ && sdc_injected_)
      hooks.computed = [this](int64_t st, TensorClass cls, float* d, size_t n, bool re) {
        injector_->on_computed(st, cls, d, n, re);
      };
    const GoldenCheckResult g =
        golden_check(*golden_backend_, plugin_, hooks, std::nullopt, precision);
    v = sdc::judge_golden(v, all_gather_words(world, &g.digest, 1), golden_reference(g.key));
  }
  sdc_seconds_ += seconds_since(t0);
  if (!v.clean) sdc_found(s, v);
  if (snapshotter_) sdc_seconds_ += snapshotter_->keep_verified(s);
  sdc_last_passed_ = s;
  if (reporter_) reporter_->sdc_passed(s + 1);
  if (leader_) {
    store_->set(keys::kSdcVerified, std::to_string(s));
    store_->add(keys::kSdcChecks, 1);
  }
}

void Worker::sdc_found(int64_t s, const sdc::Verdict& v) {
  int64_t verified = -1;
  try {
    verified = std::stoll(store_->get(keys::kSdcVerified, std::chrono::milliseconds(1)));
  } catch (const std::exception&) {
  }
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
  store_->set(keys::sdc_verdict_key(epoch_), inc.SerializeAsString());
  if (!o_.quiet && leader_)
    LOG(WARNING) << "silent data corruption at step " << s + 1 << ": " << v.detail;
  throw sdc::SdcFound(inc.detail());
}

std::string Worker::sdc_coverage() const {
  if (sdc_every_ <= 0) return "off (sdc.check_every_steps = 0)";
  const bool zero1 = cfg_.parallel().zero1() && topo_.dp() > 1;
  const bool at_rest = region_ != nullptr;
  std::string c = detail::concat("every ", sdc_every_, " steps: ");
  if (topo_.dp() > 1) {
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

std::vector<std::string> Worker::sdc_missed(const RunReport& rep) const {
  std::vector<std::string> out;
  for (const InjectionRecord& in : FaultInjector::read_injections(*store_)) {
    if (in.kind != "sdc") continue;
    bool caught = false;
    for (const auto& inc : rep.incidents())
      caught = caught || (inc.kind() == "sdc" && inc.rank() == in.rank && inc.step() >= in.step);
    if (caught) continue;
    std::string why = sdc_every_ <= 0
                          ? "the checks are off"
                          : detail::concat(
                                "no check covered it: checks compare the first micro-batch at "
                                "steps that are multiples of ",
                                sdc_every_, ", and step ", in.step + 1,
                                " is not one (a transient gradient or activation flip there is "
                                "averaged into every replica's update)");
    if (topo_.dp() < 2 && sdc_every_ > 0)
      why = "no DP replica to compare with (only state at rest is checked)";
    out.push_back(detail::concat("sdc on rank ", in.rank, " at step ", in.step + 1, ": ", why));
  }
  return out;
}

}  // namespace keel::worker_detail
