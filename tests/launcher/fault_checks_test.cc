// One validation of faults for keel-launch (at start) and keel-ctl inject (at run time):
// launcher/fault_checks.h.
#include "launcher/fault_checks.h"

#include <gtest/gtest.h>

#include "runtime/check.h"

namespace keel {
namespace {

FaultJob job(bool own_interfaces = false) {
  return FaultJob{.world = 8,
                  .steps = 100,
                  .slot_of = [](int rank) { return rank / 2; },
                  .own_interfaces = own_interfaces};
}

std::string refusal(const FaultPlan& plan, const FaultJob& j, int first_new, bool running) {
  try {
    check_faults(plan, j, first_new, running);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

FaultPlan plan_of(std::initializer_list<const char*> flags) {
  FaultPlan p;
  for (const char* f : flags) add_fault_flag(&p, f);
  return p;
}

TEST(FaultChecks, WhatTheJobCannotRunIsRefusedAlikeAtStartAndAtRunTime) {
  for (bool running : {false, true}) {
    // A partition needs a network interface per slot; under --local they share loopback.
    FaultPlan p = plan_of({"partition@step=5,rank=3"});
    EXPECT_EQ(refusal(p, job(), 0, running),
              "partition@step=5,rank=3: a partition fault needs each slot on its own network "
              "interface, named by KEEL_IFNAME (e.g. machines as network namespaces); under "
              "--local every slot shares loopback");
    EXPECT_EQ(refusal(p, job(/*own_interfaces=*/true), 0, running), "");
    // Slot 0 cannot be lost yet.
    p = plan_of({"slot_loss@step=5,rank=1"});
    EXPECT_NE(refusal(p, job(), 0, running).find("is on slot 0"), std::string::npos);
    // A job without slots has no slot to lose.
    FaultJob no_slots = job();
    no_slots.slot_of = nullptr;
    p = plan_of({"slot_loss@step=5,rank=3"});
    EXPECT_NE(refusal(p, no_slots, 0, running).find("has no slot"), std::string::npos);
  }
}

TEST(FaultChecks, AFaultTheJobAlreadyHasIsRefused) {
  // The job's schedule, then what keel-ctl inject adds: the same crash twice would fire twice.
  FaultPlan p = plan_of({"crash@step=40,rank=3"});
  add_fault_flag(&p, "crash@step=40,rank=3");
  const std::string why = refusal(p, job(), 1, /*running=*/true);
  EXPECT_NE(why.find("the same fault as"), std::string::npos) << why;
  // Another rank at the same step is another fault.
  p = plan_of({"crash@step=40,rank=3", "crash@step=40,rank=5"});
  EXPECT_EQ(refusal(p, job(), 1, /*running=*/true), "");
}

TEST(FaultChecks, SdcOnlyAtStart) {
  FaultPlan p = plan_of({"sdc@step=10,rank=2"});
  EXPECT_EQ(refusal(p, job(), 0, /*running=*/false), "");
  EXPECT_NE(refusal(p, job(), 0, /*running=*/true).find("sdc faults are given when the job starts"),
            std::string::npos);
  // The job's own sdc fault, checked again with an injection after it, is not refused.
  add_fault_flag(&p, "crash@step=50,rank=2");
  EXPECT_EQ(refusal(p, job(), 1, /*running=*/true), "");
}

}  // namespace
}  // namespace keel
