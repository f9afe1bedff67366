#include "robust/fault_injector.h"

#include <signal.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <thread>
#include <unordered_map>

#include "ckpt/snapshot_region.h"
#include "parallel/link_delay.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "robust/fault_spec.h"
#include "runtime/logging.h"

namespace keel {
namespace {

double unix_now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

// A livelock in compute: this thread burns its core forever and calls nothing (no
// communicator, no syscall), while the process's other threads go on as before.
[[noreturn]] void spin_forever() {
  volatile uint64_t x = 1;
  for (;;) x = x * 6364136223846793005ull + 1442695040888963407ull;
}

// A record is set right after its count is taken: how long a reader waits for a writer.
constexpr std::chrono::seconds kRecordWait{10};
constexpr std::chrono::milliseconds kInjectionWait{2000};

// A machine's defect record: the value, and a count beside it that says it exists. A lookup
// asks the count (a plain round trip) rather than a get with a tiny timeout, which a loaded
// machine's store can miss although the record is there (a defective machine taken for a
// healthy one).
std::optional<faults::Fault> machine_record(Store& store, const std::string& key) {
  if (store.add(keys::exists_key(key), 0) <= 0) return std::nullopt;
  return get_message<faults::Fault>(store, key, kRecordWait);
}

// The value an sdc flip lands on: the first normal one from `at` on, wrapping around. A zero
// there (the gradient of an embedding row no token of the batch used) is memory nothing
// computed, and its flipped mantissa bit is a denormal of 1e-39 that the optimizer's moments
// absorb without a trace: a defect that chose it would be invisible to every check and to a
// replay, at some steps and not others. All zeros (nothing computed at all): `at` itself.
size_t flip_target(const float* data, size_t n, size_t at) {
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (at + k) % n;
    if (std::fpclassify(data[i]) == FP_NORMAL) return i;
  }
  return at;
}

}  // namespace

FaultInjector::FaultInjector(faults::FaultSchedule schedule, int rank, std::shared_ptr<Store> store)
    : schedule_(std::move(schedule)), rank_(rank), store_(std::move(store)) {
  KEEL_CHECK(store_ != nullptr);
}

bool FaultInjector::claim(int index) {
  return store_->add(keys::fault_fired_key(index), 1) == 1;
}

void FaultInjector::record(const faults::Fault& f, int64_t step) {
  const int64_t n = store_->add(keys::kInjectCount, 1);
  store::Injection r;
  r.set_kind(fault_kind_name(f.kind()));
  r.set_rank(rank_);
  r.set_step(step);
  // The time is when the fault acts, right after this write: a write that took long (etcd on
  // two busy cores, seen once: 1 s, while the job trained on) is stamped again, so that the
  // report does not count that second as the recovery's.
  constexpr auto kSlowWrite = std::chrono::milliseconds(50);
  for (int tries = 0; tries < 3; ++tries) {
    const auto t0 = std::chrono::steady_clock::now();
    r.set_time(unix_now());
    set_message(*store_, keys::injection_key(n - 1), r);
    if (std::chrono::steady_clock::now() - t0 < kSlowWrite) break;
  }
}

void FaultInjector::poll_runtime_faults() {
  // A read, not add(0): the store may be etcd, where an add is a write, and this runs on every
  // rank at every step. A store out of reach (etcd without quorum) skips this step's look:
  // training goes on, and the faults are found once it answers again.
  int64_t n = 0;
  try {
    Store& s = poll_store_ ? *poll_store_ : *store_;
    const std::optional<std::string> count = s.try_get(keys::kRuntimeFaultCount);
    if (!count) return;
    n = std::stoll(*count);
  } catch (const CommError&) {
    return;
  }
  for (; runtime_seen_ < n; ++runtime_seen_) {
    faults::Fault f;
    try {
      f = get_message<faults::Fault>(*store_, keys::runtime_fault_key(runtime_seen_),
                                     kInjectionWait);
    } catch (const CommTimeout&) {
      continue;  // its writer died between add and set
    }
    // Claimed under its own key, so the schedule's indices stay as they were.
    *schedule_.add_fault() = f;
  }
}

void FaultInjector::before_step(int64_t step) {
  poll_runtime_faults();
  for (int i = 0; i < schedule_.fault_size(); ++i) {
    const faults::Fault& f = schedule_.fault(i);
    if (f.rank() != rank_ || f.step() != step) continue;
    switch (f.kind()) {
      case faults::Fault::crash:
        if (!claim(i)) break;
        record(f, step);
        raise(SIGKILL);
        break;
      case faults::Fault::exit:
        if (!claim(i)) break;
        record(f, step);
        // Like a library that gives up (a CUDA illegal address): a message, then the exit
        // status, with no unwinding and no atexit handlers. The line says the fault was
        // injected, so that a run it ends is not taken for a real failure.
        LOG(ERROR) << "rank " << rank_ << ": injected exit fault at step " << step << " (code "
                   << f.exit_code() << ")" << (f.message().empty() ? "" : ": ") << f.message();
        // A rank started alone owns its shared memory, which no destructor removes now.
        remove_owned_segments();
        _exit(f.exit_code());
      case faults::Fault::hang:
      case faults::Fault::hang_in_collective:
        KEEL_CHECK(wrapped_, "a ", fault_kind_name(f.kind()), " fault at step ", step,
                   " needs FaultInjector::wrap() on the rank's communicators");
        if (!claim(i)) break;
        record(f, step);
        if (f.kind() == faults::Fault::hang)
          hang_->arm();
        else
          hang_->arm_after_collective();
        break;
      case faults::Fault::freeze:
        if (!claim(i)) break;
        record(f, step);
        // The whole process stops, every thread with it, the progress reporter included:
        // what `kill -STOP` from outside does. SIGCONT lets it go on.
        KEEL_CHECK(raise(SIGSTOP) == 0, "raise(SIGSTOP) failed");
        break;
      case faults::Fault::spin:
        if (!claim(i)) break;
        record(f, step);
        spin_forever();
      case faults::Fault::slow:
        if (!claim(i)) break;
        record(f, step);
        slow_.push_back(i);
        break;
      case faults::Fault::sdc:
        // The defective unit stays with the process that claimed it (as a slow one does): a
        // replacement of the rank computes right.
        if (!claim(i)) break;
        record(f, step);
        sdc_.push_back({i, false});
        // ... and with the machine it runs on, which a replay worker started there later
        // inherits (arm_machine_defects).
        if (machine_ >= 0 && !f.once())
          record_machine(*store_, keys::machine_defect_key(machine_), f);
        break;
      case faults::Fault::slow_link:
        if (!claim(i)) break;
        record(f, step);
        set_link_delay(std::chrono::milliseconds(f.delay_ms()));
        break;
      case faults::Fault::link_error:
        KEEL_CHECK(groups_, "a link_error fault at step ", step,
                   " needs FaultInjector::wrap() on the rank's communicators");
        if (!claim(i)) break;
        record(f, step);
        // A defective network stays with the machine: this process breaks its links at every
        // step from now on, and a diagnostic run on the machine breaks its own.
        if (!f.once()) {
          broken_links_ = true;
          if (machine_ >= 0) record_machine(*store_, keys::machine_link_defect_key(machine_), f);
        }
        groups_->abort_all();
        return;
      case faults::Fault::nan:
        break;  // on_local_metrics
      case faults::Fault::slot_loss:
      case faults::Fault::partition: {
        const bool loss = f.kind() == faults::Fault::slot_loss;
        const auto& act = loss ? slot_.kill_slot : slot_.cut_network;
        KEEL_CHECK(act, "a ", fault_kind_name(f.kind()), " fault at step ", step,
                   " needs keel-launch (a slot to lose or cut)");
        if (!claim(i)) break;
        record(f, step);
        act();
        break;
      }
      case faults::Fault::controller_crash:
        KEEL_CHECK(slot_.kill_controller, "a controller_crash fault at step ", step,
                   " needs keel-launch with etcd (a controller that fails over)");
        if (!claim(i)) break;
        record(f, step);
        slot_.kill_controller();
        break;
      case faults::Fault::corrupt_snapshot:
      case faults::Fault::lose_snapshot: {
        const bool corrupt = f.kind() == faults::Fault::corrupt_snapshot;
        const auto& act = corrupt ? snapshot_.corrupt_newest : snapshot_.remove;
        KEEL_CHECK(act, "a ", fault_kind_name(f.kind()), " fault at step ", step,
                   " needs snapshots (checkpoint.snapshot_every_step)");
        if (!claim(i)) break;
        record(f, step);
        act();
        raise(SIGKILL);
        break;
      }
    }
  }
  // The links of a machine whose network is defective break again in every step.
  if (broken_links_ && groups_) groups_->abort_all();
  if (const auto d = slowdown(step); d.count() > 0) std::this_thread::sleep_for(d);
}

std::chrono::milliseconds FaultInjector::slowdown(int64_t step) const {
  std::chrono::milliseconds total{0};
  for (int i : slow_) {
    const faults::Fault& f = schedule_.fault(i);
    if (step >= f.step()) total += std::chrono::milliseconds(f.delay_ms());
  }
  return total;
}

void FaultInjector::wrap(ProcessGroups& groups, std::shared_ptr<CommActivity> activity) {
  const std::array<std::unique_ptr<Communicator>*, kCommGroups> comms = {
      &groups.world, &groups.tp, &groups.pp, &groups.dp, &groups.emb};
  for (int i = 0; i < kCommGroups; ++i) {
    auto& comm = *comms[size_t(i)];
    if (!comm) continue;
    std::function<void()> stay_inside;
    if (activity) stay_inside = [activity, g = CommGroup(i)] { activity->stay_inside_last(g); };
    comm = std::make_unique<FaultyCommunicator>(std::move(comm), hang_, std::move(stay_inside));
  }
  wrapped_ = true;
  groups_ = &groups;
}

void FaultInjector::on_local_metrics(int64_t step, float* metrics) {
  for (int i = 0; i < schedule_.fault_size(); ++i) {
    const faults::Fault& f = schedule_.fault(i);
    if (f.kind() != faults::Fault::nan || f.rank() != rank_ || f.step() != step) continue;
    if (!claim(i)) continue;
    record(f, step);
    metrics[0] = std::numeric_limits<float>::quiet_NaN();
  }
}

bool FaultInjector::has_sdc(const faults::FaultSchedule& schedule) {
  for (const auto& f : schedule.fault())
    if (f.kind() == faults::Fault::sdc) return true;
  return false;
}

void FaultInjector::on_computed(int64_t step, TensorClass cls, float* data, size_t n,
                                bool recompute) {
  static constexpr TensorClass kOf[] = {TensorClass::kGrad, TensorClass::kActivation,
                                        TensorClass::kParam, TensorClass::kOptimizer};
  for (Sdc& s : sdc_) {
    const faults::Fault& f = schedule_.fault(s.index);
    if (kOf[f.target()] != cls || n == 0 || (f.once() && (s.flipped || recompute))) continue;
    // One bit of one value, the same for a step's computation and its recomputations (a
    // defective unit is wrong the same way each time): a mantissa bit, so the value stays
    // finite and plausible and nothing downstream notices.
    uint64_t h = uint64_t(step) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    const size_t at = flip_target(data, n, size_t(h % n));
    uint32_t bits;
    static_assert(sizeof(bits) == sizeof(float));
    std::memcpy(&bits, data + at, sizeof(bits));
    bits ^= 1u << 20;
    std::memcpy(data + at, &bits, sizeof(bits));
    s.flipped = true;
  }
}

void FaultInjector::record_machine(Store& store, const std::string& key,
                                   const faults::Fault& fault) {
  set_message(store, key, fault);
  store.add(keys::exists_key(key), 1);
}

bool FaultInjector::machine_link_defective(Store& store, int slot) {
  return machine_record(store, keys::machine_link_defect_key(slot)).has_value();
}

std::optional<faults::Fault> FaultInjector::machine_defect(Store& store, int slot) {
  return machine_record(store, keys::machine_defect_key(slot));
}

bool FaultInjector::arm_machine_defects(int slot) {
  std::optional<faults::Fault> defect = machine_defect(*store_, slot);
  if (!defect) return false;  // a healthy machine
  faults::Fault f = *defect;
  f.set_once(false);
  // Rank -1: before_step never claims it again; on_computed looks at the target only.
  f.set_rank(-1);
  *schedule_.add_fault() = f;
  sdc_.push_back({schedule_.fault_size() - 1, false});
  return true;
}

std::vector<InjectionRecord> FaultInjector::read_injections(Store& store) {
  const int64_t n = store.add(keys::kInjectCount, 0);
  // One range read where the store can list its keys (a 1,000-fault soak's slot loss read
  // 1,000 keys one by one); a record it did not hold yet is read with a wait below.
  std::unordered_map<std::string, std::string> listed;
  if (std::optional<Store::KeyValues> all = store.try_get_prefix(keys::kInjectionPrefix))
    for (auto& [key, value] : *all) listed.emplace(std::move(key), std::move(value));
  std::vector<InjectionRecord> out;
  for (int64_t i = 0; i < n; ++i) {
    const std::string key = keys::injection_key(i);
    store::Injection m;
    if (auto it = listed.find(key); it != listed.end()) {
      m = parse_message<store::Injection>(key, it->second);
    } else {
      try {
        // A record is set right after its count is taken; give a writer a moment.
        m = get_message<store::Injection>(store, key, kInjectionWait);
      } catch (const CommTimeout&) {
        continue;  // its writer died between add and set
      }
    }
    out.push_back({m.kind(), m.rank(), m.step(), m.time()});
  }
  return out;
}

}  // namespace keel
