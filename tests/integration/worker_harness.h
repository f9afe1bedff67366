// Runs keel-worker as a real process for integration tests: a small byte-level corpus made
// once per test binary, a config writer, and a reader for the fields of --report JSON.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

namespace keel::test {

struct WorkerRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
  std::string report;  // the --report JSON ("" if none was written)
};

// Whether `s` holds `part`, for checking messages.
bool contains(const std::string& s, const std::string& part);
// The whole file at `path` ("" if it cannot be read).
std::string read_text(const std::string& path);

// A folder with train_000000.bin / val_000000.bin made from Debian's fortunes text.
const std::string& demo_data_dir();

// The model a test trains. Every robustness feature must hold whatever plugin the job loads
// (issue 30), so the tests that prove hot swap, SDC, fail-slow and hot update run for both.
enum class TestModel { kGpt, kLlama };
// "gpt" or "llama": a parametrized test's name suffix.
std::string test_model_name(TestModel m);
// GoogleTest shows a model by its name, not its raw value.
void PrintTo(TestModel m, std::ostream* os);

// A config for the tiny test GPT on demo_data_dir(), one section a line, in this order:
// model (line 1), train, optim, data, parallel, runtime (line 6). `extra` adds fields to
// sections by name, e.g. {{"parallel", "dp: 2"}} (text format does not merge a repeated
// section, so extra fields must go inside it). With TestModel::kLlama, the Llama example
// plugin (examples/plugins/llama/) in the same shape, its SwiGLU width 96.
std::string write_config(const std::string& dir,
                         const std::map<std::string, std::string>& extra = {},
                         TestModel model = TestModel::kGpt);

// Runs `keel-worker <args>` (with --report into `dir`) and waits for it.
WorkerRun run_worker(const std::string& dir, const std::string& args);

// A job run as the leader of its own session, so that everything it started can be found
// afterwards: what a test of a failure checks was left behind.
struct JobRun : WorkerRun {
  std::vector<std::string> leftover_shm;  // /dev/shm/keel-* made during the run, still there
  int leftover_processes = 0;             // processes of the job's session alive after it ended
};

// Runs `keel-worker --quiet --report DIR/report.json <args>`; `poll(pid)` is called every
// 20 ms while it runs (to signal it, say). Kills the session after `timeout_s`. Leftovers
// are counted, then removed, so one failing test does not spoil the next.
JobRun run_job(const std::string& dir, const std::string& args,
               const std::function<void(pid_t)>& poll = {}, int timeout_s = 300);

// Any command line (e.g. "mpirun ..."), run the same way; its report must go to
// DIR/report.json. Leftover shared memory is not counted (its job id is not the PID here).
JobRun run_command(const std::string& dir, const std::string& command,
                   const std::function<void(pid_t)>& poll = {}, int timeout_s = 300);

// The same for `keel-launch --quiet --report DIR/report.json --run-dir DIR/runs <args>`.
JobRun run_launch_job(const std::string& dir, const std::string& args,
                      const std::function<void(pid_t)>& poll = {}, int timeout_s = 300);

// A keel-launch job started with --run-dir DIR/runs: its run directory once its controller has
// written it (empty before), and the lowest step its ranks report through `keel-ctl status`
// (-1 while it does not answer).
std::string launched_job_dir(const std::string& dir);
int launched_job_step(const std::string& job_dir);

// Starts argv (argv[0] a path) as the leader of a session of its own, its stdout and
// stderr into `log` (truncated), so that kill(-pid, sig) reaches all it starts.
pid_t start_session(const std::vector<std::string>& argv, const std::string& log);

// Starts `keel-launch --join` for slot `slot` of the job started with --run-dir DIR/runs (its
// endpoint and id from runs/<job>/controller), with `args` (config, workers per slot, ...),
// in a session of its own, its output into DIR/join.log. -1 before the job has written them.
pid_t join_slot(const std::string& dir, int slot, const std::string& args);

// Processes whose session id is `sid` (field 6 of /proc/PID/stat), zombies aside.
std::vector<pid_t> session_processes(pid_t sid);
// Waits until the session `sid` has no process left or `deadline` passes; returns those left
// (what outlived its job by the deadline).
std::vector<pid_t> wait_for_empty_session(
    pid_t sid, std::chrono::milliseconds deadline = std::chrono::seconds(10));

// Whether an incident (JSON) says rank `rank` restored from `source` (its rank_sources:
// "memory", "own_snapshot", "backup", "persistent", "scratch").
bool rank_source_is(const std::string& incident, int rank, const std::string& source);
// An incident's rank_sources, rank to source (empty if it has none).
std::map<int, std::string> rank_sources(const std::string& incident);

// Where a recovery's state came from, as every recovery test asserts it. A deterministic
// restart from scratch also ends bitwise equal to the fault-free run, so "bitwise equal"
// alone proves nothing about the recovery: the test says the step every rank restored, where
// from, and each rank's own source.
struct RestorePoint {
  int step = -1;  // restored_step, exactly; -1: in [min_step, max_step] instead
  int min_step = -1, max_step = -1;
  std::string from;  // restored_from: "memory", "persistent", "scratch"
  int world = 0;     // the ranks 0..world-1, each of which must report its source
  // Each rank's source (rank_sources): `ranks` names some; `others` is every other rank's.
  // A source may list alternatives: "memory|own_snapshot".
  std::map<int, std::string> ranks = {};
  std::string others = "";
};
// Asserts (EXPECT) that `incident` (JSON) restored what `want` says.
void expect_restored(const std::string& incident, const RestorePoint& want);
// Asserts that a resumed run (--resume) started at `first_step` and ran the steps after it
// only: its report's first_step, and one loss per step from there to `steps`.
void expect_resumed(const std::string& report, int first_step, int steps);

// Fields of a report.
std::string json_string_field(const std::string& json, const std::string& key);
double json_number_field(const std::string& json, const std::string& key);
std::vector<double> json_array_field(const std::string& json, const std::string& key);
// The objects of an array of objects (e.g. "incidents"), each as its JSON text.
std::vector<std::string> json_object_array(const std::string& json, const std::string& key);

// The tensors of an llm.c checkpoint written by --export-llmc, read raw (header + floats).
std::vector<float> read_llmc_floats(const std::string& path);

}  // namespace keel::test
