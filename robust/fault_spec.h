// Reading and checking fault schedules (proto/faults.proto): the `--fault` flag, `--inject`
// files, and the rules a schedule must follow before a job starts. Every error is a
// keel::InputError naming where the fault came from, the field and the value, e.g.
//   --fault 'crush@step=3,rank=1': unknown kind 'crush' (crash, exit, hang, slow, nan, ...)
//   faults.pbtxt:7: fault[1].rank = 9: must be < the world size 4
//   --fault 'slow@step=2,rank=0': delay_ms = 0: a slow fault needs delay_ms > 0
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "proto/faults.pb.h"
#include "runtime/check.h"  // keel::InputError, which these functions throw

namespace keel {

// Where one fault of a plan was given, so that validation can point at it.
struct FaultOrigin {
  std::string flag{};                  // the --fault value, or empty for a file
  std::string file{};                  // the schedule file (or its label)
  int index = 0;                       // the fault's index in that file
  std::map<std::string, int> lines{};  // field ("rank") → 1-based line in the file
  // "--fault 'crash@step=3,rank=1': rank" or "faults.pbtxt:7: fault[1].rank".
  std::string where(const std::string& field) const;
  // The fault itself: "--fault 'crash@step=3,rank=1'" or "faults.pbtxt:5: fault[1]".
  std::string label() const;
};

// Faults from every --fault and --inject of a command line, in the order given.
struct FaultPlan {
  faults::FaultSchedule schedule;
  std::vector<FaultOrigin> origins;  // one per schedule.fault()
};

// Parses one --fault value:
//   KIND@step=S,rank=R[,code=C][,delay_ms=D][,target=T][,once][,message=TEXT].
// message takes the rest of the value (it may hold commas), so it comes last. Checks the
// syntax only; validate_fault_plan checks the values against the job.
faults::Fault parse_fault_flag(const std::string& value);

// Parses a text-format FaultSchedule; `name_for_errors` stands for the file in messages
// (syntax errors as name:line:col: ...). `lines`, if given, receives each fault's field lines.
faults::FaultSchedule parse_fault_schedule(
    const std::string& text, const std::string& name_for_errors,
    std::vector<std::map<std::string, int>>* lines = nullptr);

// Appends one --fault value, or every fault of one --inject file, to a plan. A file that is a
// directory, cannot be read, or holds no fault is refused (an --inject that injects nothing
// is a mistake, not a fault-free run).
void add_fault_flag(FaultPlan* plan, const std::string& value);
void add_fault_file(FaultPlan* plan, const std::string& path);

// Refuses a plan that could not run as written: a rank outside [0, world_size), a step
// outside [0, steps) (steps <= 0: unbounded), a slow fault without delay_ms > 0, an exit code
// outside [1, 255], a field that the fault's kind does not take, or a fault given twice (each
// copy would fire; both origins are named). Throws one InputError listing every violation,
// one per line.
void validate_fault_plan(const FaultPlan& plan, int world_size, int64_t steps);

// "crash", "exit", "hang", "slow", "nan", ..., "freeze", "hang_in_collective", "spin".
std::string fault_kind_name(faults::Fault::Kind kind);

}  // namespace keel
