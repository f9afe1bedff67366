// park_as_standby: a standby runs its self-checks, the golden mini-GPT among them, publishes
// the result under its ready key (store::StandbyCheck), and returns the promotion it finds in
// the store (store::StandbyAssign, with the Membership of the epoch it joins).
#include <gtest/gtest.h>

#include <cstring>

#include "launcher/worker/standby.h"
#include "parallel/hash_store.h"
#include "proto/store_values.pb.h"
#include "robust/golden_check.h"

namespace keel {
namespace {

TEST(StandbyPark, PublishesGemmGoldenAndAllReduceResultsThenTakesItsPromotion) {
  auto store = std::make_shared<HashStore>();
  auto connect = [store]() -> std::shared_ptr<Store> { return store; };
  StandbyIdentity id;
  id.slot = 4;
  id.index = 1;
  id.gen = 2;
  // Promoted before it parks: it must still check itself first, then find the assignment.
  store::StandbyAssign assign;
  assign.set_rank(7);
  assign.set_epoch(3);
  assign.mutable_membership()->set_epoch(3);
  assign.mutable_membership()->set_tp(2);
  assign.mutable_membership()->set_pp(1);
  assign.mutable_membership()->set_dp(4);
  set_message(*store, keys::standby_assign_key(id.slot, id.index, id.gen), assign);
  auto backend = make_cpu_backend(2);

  const StandbyAssignment a = park_as_standby(*backend, Precision::kFp32, connect, id);
  EXPECT_EQ(a.rank, 7);
  EXPECT_EQ(a.epoch, 3);
  EXPECT_EQ(a.world(), 8);
  EXPECT_EQ(a.membership.dp(), 4);

  const auto check = get_message<store::StandbyCheck>(
      *store, keys::standby_ready_key(id.slot, id.index, id.gen), std::chrono::seconds(1));
  const std::string& ready = check.checks();
  EXPECT_TRUE(check.ok()) << ready;
  EXPECT_NE(ready.find("GEMM"), std::string::npos) << ready;
  EXPECT_NE(ready.find("all-reduce"), std::string::npos) << ready;
  // The golden run is on one thread whatever the worker's backend has, so its digest is the
  // repo's for this BLAS core.
  const std::string key = golden_key(*backend);
  EXPECT_NE(ready.find("golden mini-GPT (3 steps): digest"), std::string::npos) << ready;
  if (golden_reference(key))
    EXPECT_NE(ready.find("matches the repo's for " + key), std::string::npos) << ready;
  else
    EXPECT_NE(ready.find("no repo digest for " + key), std::string::npos) << ready;
}

// A machine that computes wrong (here: one gradient bit, through the golden run's hook, as a
// machine's recorded sdc defect does) fails its golden check, says so under its ready key and
// never parks.
TEST(StandbyPark, ADefectiveMachineFailsTheGoldenCheckAndStaysOut) {
  auto store = std::make_shared<HashStore>();
  auto connect = [store]() -> std::shared_ptr<Store> { return store; };
  StandbyIdentity id;
  id.slot = 2;
  auto backend = make_cpu_backend(1);
  TrainerHooks defect;
  defect.computed = [](int64_t, TensorClass c, float* d, size_t n, bool) {
    if (c != TensorClass::kGrad || n == 0) return;
    uint32_t bits;
    std::memcpy(&bits, d, sizeof(bits));
    bits ^= 1u << 20;
    std::memcpy(d, &bits, sizeof(bits));
  };
  EXPECT_THROW(park_as_standby(*backend, Precision::kFp32, connect, id, defect), Error);
  const auto check = get_message<store::StandbyCheck>(
      *store, keys::standby_ready_key(id.slot, id.index, id.gen), std::chrono::seconds(1));
  const std::string& ready = check.checks();
  EXPECT_FALSE(check.ok()) << ready;
  if (golden_reference(golden_key(*backend))) {
    EXPECT_NE(ready.find("this device computes wrong"), std::string::npos) << ready;
  }
}

}  // namespace
}  // namespace keel
