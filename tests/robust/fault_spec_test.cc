// The --fault flag and --inject files: parsing, and the errors that name the flag or file
// line, the field and the value; validation of a plan against the job.
#include "robust/fault_spec.h"

#include <gtest/gtest.h>

#include <fstream>

#include "tests/test_expect.h"
#include "tests/test_paths.h"

namespace keel {
namespace {

using test::input_error_of;

TEST(FaultSpec, ParsesEveryKey) {
  faults::Fault f = parse_fault_flag("crash@step=3,rank=1");
  EXPECT_EQ(f.kind(), faults::Fault::crash);
  EXPECT_EQ(f.step(), 3);
  EXPECT_EQ(f.rank(), 1);

  f = parse_fault_flag("slow@step=2,rank=0,delay_ms=250");
  EXPECT_EQ(f.kind(), faults::Fault::slow);
  EXPECT_EQ(f.delay_ms(), 250);

  // message takes the rest of the value, commas included.
  f = parse_fault_flag(
      "exit@rank=2,step=7,code=134,message=CUDA error: an illegal memory access, at 0x0");
  EXPECT_EQ(f.kind(), faults::Fault::exit);
  EXPECT_EQ(f.step(), 7);
  EXPECT_EQ(f.rank(), 2);
  EXPECT_EQ(f.exit_code(), 134);
  EXPECT_EQ(f.message(), "CUDA error: an illegal memory access, at 0x0");

  EXPECT_EQ(parse_fault_flag("hang@step=0,rank=0").kind(), faults::Fault::hang);
  EXPECT_EQ(parse_fault_flag("nan@step=5,rank=3").kind(), faults::Fault::nan);
}

TEST(FaultSpec, ParsesAndValidatesTheHangKinds) {
  const std::pair<const char*, faults::Fault::Kind> kinds[] = {
      {"freeze", faults::Fault::freeze},
      {"hang_in_collective", faults::Fault::hang_in_collective},
      {"spin", faults::Fault::spin}};
  for (const auto& [name, kind] : kinds) {
    faults::Fault f = parse_fault_flag(std::string(name) + "@step=4,rank=2");
    EXPECT_EQ(f.kind(), kind);
    EXPECT_EQ(f.step(), 4);
    EXPECT_EQ(f.rank(), 2);
    EXPECT_EQ(fault_kind_name(kind), name);
  }
  FaultPlan good;
  add_fault_flag(&good, "freeze@step=4,rank=2");
  add_fault_flag(&good, "hang_in_collective@step=5,rank=0");
  add_fault_flag(&good, "spin@step=6,rank=1");
  validate_fault_plan(good, 3, 10);

  // They take no value of their own.
  FaultPlan bad;
  add_fault_flag(&bad, "freeze@step=4,rank=2,delay_ms=5");
  add_fault_flag(&bad, "spin@step=4,rank=0,code=3");
  add_fault_flag(&bad, "hang_in_collective@step=20,rank=0");
  std::string msg = input_error_of([&] { validate_fault_plan(bad, 3, 10); });
  EXPECT_HAS(msg,
             "--fault 'freeze@step=4,rank=2,delay_ms=5': delay_ms = 5: only slow and slow_link "
             "faults take delay_ms (this one is freeze)");
  EXPECT_HAS(msg,
             "--fault 'spin@step=4,rank=0,code=3': exit_code = 3: only an exit fault takes "
             "exit_code (this one is spin)");
  EXPECT_HAS(msg, "--fault 'hang_in_collective@step=20,rank=0': step = 20: must be < the job's");

  // In a schedule file too.
  faults::FaultSchedule s = parse_fault_schedule(
      "fault { kind: freeze step: 1 rank: 0 }\nfault { kind: hang_in_collective step: 2 }\n"
      "fault { kind: spin step: 3 rank: 1 }\n",
      "f.pbtxt");
  ASSERT_EQ(s.fault_size(), 3);
  EXPECT_EQ(s.fault(0).kind(), faults::Fault::freeze);
  EXPECT_EQ(s.fault(1).kind(), faults::Fault::hang_in_collective);
  EXPECT_EQ(s.fault(2).kind(), faults::Fault::spin);
}

TEST(FaultSpec, FlagErrorsNameTheFlagKeyAndValue) {
  EXPECT_EQ(input_error_of([] { parse_fault_flag("crush@step=3,rank=1"); }),
            "--fault 'crush@step=3,rank=1': unknown kind 'crush' (crash, exit, hang, slow, nan, "
            "corrupt_snapshot, lose_snapshot, slot_loss, partition, freeze, hang_in_collective, "
            "spin, sdc, slow_link, link_error, controller_crash)");
  EXPECT_EQ(input_error_of([] { parse_fault_flag("crash@step=x,rank=1"); }),
            "--fault 'crash@step=x,rank=1': step = 'x': not an integer");
  EXPECT_EQ(input_error_of([] { parse_fault_flag("crash@step=1,rnk=1"); }),
            "--fault 'crash@step=1,rnk=1': unknown key 'rnk' (step, rank, code, delay_ms, "
            "target, once, message)");
  EXPECT_EQ(input_error_of([] { parse_fault_flag("crash@rank=1"); }),
            "--fault 'crash@rank=1': missing step=S");
  EXPECT_EQ(input_error_of([] { parse_fault_flag("crash@step=1"); }),
            "--fault 'crash@step=1': missing rank=R");
  EXPECT_HAS(input_error_of([] { parse_fault_flag("crash"); }),
             "--fault 'crash': expected KIND@step=S,rank=R");
  EXPECT_EQ(input_error_of([] { parse_fault_flag("crash@step=1,rank"); }),
            "--fault 'crash@step=1,rank': expected key=value, got 'rank'");
  EXPECT_EQ(input_error_of([] { parse_fault_flag("crash@step=1,rank=99999999999"); }),
            "--fault 'crash@step=1,rank=99999999999': rank = 99999999999: out of range");
}

TEST(FaultSpec, SdcTakesATargetAndOnceAndNoOtherKindDoes) {
  faults::Fault f = parse_fault_flag("sdc@step=40,rank=5");
  EXPECT_EQ(f.kind(), faults::Fault::sdc);
  EXPECT_EQ(f.target(), faults::Fault::grad);
  EXPECT_FALSE(f.once());
  f = parse_fault_flag("sdc@step=4,rank=1,target=optimizer,once");
  EXPECT_EQ(f.target(), faults::Fault::optimizer);
  EXPECT_TRUE(f.once());
  f = parse_fault_flag("sdc@once,step=4,rank=1,target=activation");
  EXPECT_TRUE(f.once());
  EXPECT_EQ(f.target(), faults::Fault::activation);
  EXPECT_EQ(input_error_of([] { parse_fault_flag("sdc@step=4,rank=1,target=weights"); }),
            "--fault 'sdc@step=4,rank=1,target=weights': target = 'weights': not one of grad, "
            "activation, param, optimizer");
  FaultPlan plan;
  add_fault_flag(&plan, "crash@step=1,rank=0,once");
  add_fault_flag(&plan, "slow@step=1,rank=0,delay_ms=5,target=param");
  EXPECT_EQ(input_error_of([&] { validate_fault_plan(plan, 2, 10); }),
            "--fault 'crash@step=1,rank=0,once': once = true: only sdc and link_error faults take "
            "once (this one is crash)\n"
            "--fault 'slow@step=1,rank=0,delay_ms=5,target=param': target = param: only an sdc "
            "fault takes a target (this one is slow)");
}

TEST(FaultSpec, ScheduleSyntaxErrorHasLineAndColumn) {
  std::string msg = input_error_of([] {
    parse_fault_schedule("fault { kind: crash step: 1 rank: 0 }\nfault { kind: crsh }\n",
                         "f.pbtxt");
  });
  EXPECT_HAS(msg, "f.pbtxt:2:");
  EXPECT_HAS(msg, "crsh");
}

TEST(FaultSpec, ScheduleFileValidationNamesLineFieldAndValue) {
  std::string path = test::temp_dir("fault_spec") + "/faults.pbtxt";
  std::ofstream(path) << "fault { kind: crash step: 1 rank: 0 }\n"
                         "fault {\n"
                         "  kind: hang\n"
                         "  step: 4\n"
                         "  rank: 9\n"
                         "}\n";
  FaultPlan plan;
  add_fault_file(&plan, path);
  ASSERT_EQ(plan.schedule.fault_size(), 2);
  EXPECT_EQ(plan.schedule.fault(1).kind(), faults::Fault::hang);
  validate_fault_plan(plan, 10, 100);  // fine in a world of 10
  EXPECT_EQ(input_error_of([&] { validate_fault_plan(plan, 4, 100); }),
            path + ":5: fault[1].rank = 9: must be < the world size 4");
  EXPECT_HAS(input_error_of([&] { add_fault_file(&plan, path + ".missing"); }),
             path + ".missing: cannot open");
}

// --inject of a directory, an empty schedule or a file that cannot be read (issue 18, item 4):
// each would run with no faults at all.
TEST(FaultSpec, ScheduleFileThatInjectsNothingIsRefused) {
  const std::string dir = test::temp_dir("fault_spec_files");
  FaultPlan plan;
  EXPECT_EQ(input_error_of([&] { add_fault_file(&plan, dir); }),
            dir +
                ": is a directory, expected a fault schedule file (text protobuf, "
                "proto/faults.proto)");
  std::ofstream(dir + "/empty.pbtxt") << "";
  EXPECT_EQ(input_error_of([&] { add_fault_file(&plan, dir + "/empty.pbtxt"); }),
            dir +
                "/empty.pbtxt: holds no fault (expected `fault { kind: crash step: 5 rank: 1 }` "
                "entries, proto/faults.proto)");
  std::ofstream(dir + "/comments.pbtxt") << "# nothing yet\n";
  EXPECT_HAS(input_error_of([&] { add_fault_file(&plan, dir + "/comments.pbtxt"); }),
             dir + "/comments.pbtxt: holds no fault");
  EXPECT_EQ(input_error_of([&] { add_fault_file(&plan, dir + "/missing.pbtxt"); }),
            dir + "/missing.pbtxt: cannot open: No such file or directory");
  EXPECT_EQ(plan.schedule.fault_size(), 0);
}

// The same fault given twice would fire twice (issue 18, item 10): refused, naming both.
TEST(FaultSpec, DuplicateFaultsAreRefusedNamingBothOrigins) {
  FaultPlan plan;
  add_fault_flag(&plan, "crash@step=3,rank=1");
  add_fault_flag(&plan, "crash@step=3,rank=1");
  EXPECT_EQ(input_error_of([&] { validate_fault_plan(plan, 2, 10); }),
            "--fault 'crash@step=3,rank=1': the same fault as --fault 'crash@step=3,rank=1' "
            "(given twice, it would fire twice; give it once)");

  // Spelled differently, or once in a file: the same fault. Defaults count as written.
  const std::string path = test::temp_dir("fault_spec_dup") + "/faults.pbtxt";
  std::ofstream(path) << "fault { kind: slow step: 2 rank: 0 delay_ms: 100 }\n"
                         "fault {\n  kind: exit\n  step: 4\n  rank: 1\n}\n";
  FaultPlan mixed;
  add_fault_flag(&mixed, "slow@rank=0,step=2,delay_ms=100");
  add_fault_file(&mixed, path);
  add_fault_flag(&mixed, "exit@step=4,rank=1,code=1");
  EXPECT_EQ(input_error_of([&] { validate_fault_plan(mixed, 2, 10); }),
            path +
                ":1: fault[0]: the same fault as --fault 'slow@rank=0,step=2,delay_ms=100' "
                "(given twice, it would fire twice; give it once)\n"
                "--fault 'exit@step=4,rank=1,code=1': the same fault as " +
                path + ":2: fault[1] (given twice, it would fire twice; give it once)");

  // Faults that differ in any value are different faults.
  FaultPlan different;
  add_fault_flag(&different, "crash@step=3,rank=1");
  add_fault_flag(&different, "crash@step=4,rank=1");
  add_fault_flag(&different, "crash@step=3,rank=0");
  add_fault_flag(&different, "exit@step=5,rank=0,code=3");
  add_fault_flag(&different, "exit@step=5,rank=0,code=4");
  add_fault_flag(&different, "sdc@step=6,rank=1,target=grad");
  add_fault_flag(&different, "sdc@step=6,rank=1,target=param");
  EXPECT_NO_THROW(validate_fault_plan(different, 2, 10));
}

TEST(FaultSpec, ValidationListsEveryViolation) {
  FaultPlan plan;
  add_fault_flag(&plan, "slow@step=2,rank=0");
  add_fault_flag(&plan, "crash@step=-1,rank=0");
  add_fault_flag(&plan, "exit@step=1,rank=0,code=0");
  add_fault_flag(&plan, "crash@step=1,rank=0,delay_ms=5");
  add_fault_flag(&plan, "nan@step=50,rank=0");
  add_fault_flag(&plan, "hang@step=3,rank=-1");
  std::string msg = input_error_of([&] { validate_fault_plan(plan, 2, 10); });
  EXPECT_HAS(msg, "--fault 'slow@step=2,rank=0': delay_ms = 0: a slow fault needs delay_ms > 0");
  EXPECT_HAS(msg, "--fault 'crash@step=-1,rank=0': step = -1: must be >= 0");
  EXPECT_HAS(msg, "--fault 'exit@step=1,rank=0,code=0': exit_code = 0: must be in [1, 255]");
  EXPECT_HAS(msg,
             "--fault 'crash@step=1,rank=0,delay_ms=5': delay_ms = 5: only slow and slow_link "
             "faults take delay_ms (this one is crash)");
  EXPECT_HAS(msg,
             "--fault 'nan@step=50,rank=0': step = 50: must be < the job's steps 10 (it would "
             "never fire)");
  EXPECT_HAS(msg, "--fault 'hang@step=3,rank=-1': rank = -1: must be >= 0");

  FaultPlan good;
  add_fault_flag(&good, "exit@step=1,rank=1,code=134,message=boom");
  add_fault_flag(&good, "slow@step=0,rank=0,delay_ms=10");
  validate_fault_plan(good, 2, 0);  // steps 0: unbounded
}

}  // namespace
}  // namespace keel
