#include "launcher/worker/recovery_client.h"

#include <algorithm>
#include <chrono>

#include "launcher/recovery_protocol.h"
#include "proto/store_values.pb.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {
namespace {

// How long a rank waits for the supervisor's decision. The supervisor may first have to
// notice a hang (the communicator timeout), restart a rank and let it load its plugin; a
// rank whose supervisor died is killed by PR_SET_PDEATHSIG long before this.
constexpr std::chrono::minutes kDecisionWait{30};
// How often the watcher wakes to see whether it should stop.
constexpr std::chrono::milliseconds kWatchPoll{200};

}  // namespace

bool slot_left_out(const membership::Rebuild& rb, int slot) {
  const auto& rank_slot = rb.membership().rank_slot();
  if (slot < 0 || rank_slot.empty()) return false;
  return std::find(rank_slot.begin(), rank_slot.end(), slot) == rank_slot.end();
}

RecoveryClient::RecoveryClient(std::function<std::shared_ptr<Store>()> connect, int rank, int slot)
    : connect_(std::move(connect)), rank_(rank), slot_(slot), store_(connect_()) {}

RecoveryClient::~RecoveryClient() {
  stop_watch();
}

void RecoveryClient::watch(int epoch, std::function<void()> on_abort) {
  stop_watch();
  stop_ = false;
  watcher_ = std::thread([this, epoch, on_abort = std::move(on_abort)] {
    try {
      std::shared_ptr<Store> s = connect_();
      const std::string key = keys::abort_key(epoch + 1);
      while (!stop_) {
        try {
          s->get(key, kWatchPoll);
        } catch (const CommTimeout&) {
          continue;
        }
        aborted_epoch_ = epoch + 1;
        on_abort();
        return;
      }
    } catch (const std::exception& e) {
      // The store is the supervisor's: losing it means the job is over (PDEATHSIG follows).
      LOG(ERROR) << "rank " << rank_ << ": recovery watcher: " << e.what();
    }
  });
}

void RecoveryClient::stop_watch() {
  stop_ = true;
  if (watcher_.joinable()) watcher_.join();
}

membership::Rebuild RecoveryClient::fail_and_wait(int epoch, int64_t steps_completed,
                                                  int64_t step_in_flight, const std::string& what) {
  if (aborted_epoch_ != epoch + 1) {
    store::RankError error;
    error.set_what(what);
    set_message(*store_, keys::error_key(epoch, rank_), error);
    store_->add(keys::errors_key(epoch), 1);
  }
  store_->get(keys::abort_key(epoch + 1), kDecisionWait);
  // Woken late (cut off meanwhile), the decision may be there already: a rank of a slot it
  // leaves out acknowledges nothing, or its ack would stand beside its successor's.
  const auto superseded = [&](const membership::Rebuild& rb) {
    if (!slot_left_out(rb, slot_)) return;
    throw RankSuperseded(detail::concat("rank ", rank_, " of slot ", slot_, ": epoch ", epoch + 1,
                                        " runs this rank elsewhere (slot ", slot_,
                                        " was taken out while it could not be heard)"));
  };
  if (auto rb = try_get_message<membership::Rebuild>(*store_, keys::rebuild_key(epoch + 1)))
    superseded(*rb);
  membership::Ack ack;
  ack.set_steps_completed(steps_completed);
  ack.set_step_in_flight(step_in_flight);
  ack.set_rank(rank_);
  set_message(*store_, keys::ack_key(epoch + 1, rank_), ack);
  membership::Rebuild rb = wait_rebuild(epoch + 1);
  superseded(rb);
  return rb;
}

membership::Rebuild RecoveryClient::wait_rebuild(int epoch) {
  return get_message<membership::Rebuild>(*store_, keys::rebuild_key(epoch), kDecisionWait);
}

void RecoveryClient::mark_restored(int epoch) {
  store::Time t;
  t.set_at(recovery::unix_now());
  set_message(*store_, keys::restored_key(epoch, rank_), t);
}

void RecoveryClient::restored_from(int epoch, membership::Source source) {
  store::Restored r;
  r.set_source(source);
  set_message(*store_, keys::restored_from_key(epoch, rank_), r);
}

}  // namespace keel
