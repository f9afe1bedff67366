// keel-bench end to end: a 2-rank job, fault-free and under one crash with two policies, and
// what it writes: report.json, report.html and TensorBoard event files.
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "bench/tfevents.h"
#include "integration/worker_harness.h"
#include "proto/bench.pb.h"
#include "test_paths.h"

namespace keel::test {
namespace {

namespace fs = std::filesystem;

int run_shell(const std::string& cmd) {
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

// Runs keel-bench on a 2-rank job under one crash with two policies into dir/out.
void run_keel_bench(const std::string& dir) {
  fs::remove_all(dir + "/out");
  const std::string cfg = write_config(dir, {{"parallel", "dp: 2"}});
  {
    std::ofstream s(dir + "/schedule.pbtxt");
    s << "fault { kind: crash step: 20 rank: 1 }\nfault { kind: crash step: 90 rank: 0 }\n";
  }
  const std::string cmd = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 " +
                          bin_dir() + "/keel-bench --config " + cfg + " --inject " + dir +
                          "/schedule.pbtxt --policies hot_swap,in_place --workers-per-slot 1 "
                          "--standby 1 --set train.steps=40 --out " +
                          dir + "/out > " + dir + "/bench.log 2>&1";
  ASSERT_EQ(run_shell(cmd), 0) << read_text(dir + "/bench.log");
}

// True where python3 can import TensorBoard's reader.
bool have_tensorboard() {
  return run_shell("python3 -c 'import tensorboard' 2>/dev/null") == 0;
}

TEST(KeelBench, CrashUnderTwoPoliciesGivesReportsAndCurves) {
  const std::string dir = temp_dir("keel_bench");
  ASSERT_NO_FATAL_FAILURE(run_keel_bench(dir));
  const std::string log = read_text(dir + "/bench.log");
  EXPECT_TRUE(contains(log, "left out crash at step 90")) << log;

  bench::BenchReport rep;
  google::protobuf::util::JsonParseOptions jo;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(read_text(dir + "/out/report.json"), &rep, jo)
          .ok());
  ASSERT_EQ(rep.runs_size(), 3);
  EXPECT_EQ(rep.schedule().fault_size(), 1);
  EXPECT_EQ(rep.left_out_size(), 1);
  EXPECT_GT(rep.step_time_s(), 0);
  const std::vector<std::string> names = {"fault_free", "hot_swap", "in_place"};
  for (int i = 0; i < 3; ++i) {
    const bench::BenchRun& r = rep.runs(i);
    SCOPED_TRACE(r.name());
    EXPECT_EQ(r.name(), names[size_t(i)]);
    EXPECT_TRUE(r.ok());
    EXPECT_GT(r.mfu(), 0);
    EXPECT_GT(r.tokens_per_s(), 0);
    EXPECT_GT(r.ettr(), 0);
    EXPECT_LE(r.ettr(), 1);
    EXPECT_TRUE(r.bitwise_equal());
    EXPECT_EQ(r.steps_completed(), 40);
    ASSERT_EQ(r.step_end_s_size(), 40);
    for (int k = 1; k < 40; ++k) EXPECT_GE(r.step_end_s(k), r.step_end_s(k - 1));
    EXPECT_GT(r.step_end_s(0), 0);
    EXPECT_LE(r.step_end_s(39), r.wall_s());
    EXPECT_EQ(r.step_mfu_size(), 40);
    if (i == 0) {
      EXPECT_EQ(r.incidents_size(), 0);
      continue;
    }
    ASSERT_GE(r.incidents_size(), 1);
    EXPECT_EQ(r.incidents(0).kind(), "crash");
    EXPECT_GT(r.lost().detection(), 0);
    EXPECT_GE(r.lost().restarts(), 1);
    EXPECT_EQ(r.param_checksum(), rep.runs(0).param_checksum());
  }

  const std::string html = read_text(dir + "/out/report.html");
  size_t svgs = 0;
  for (size_t at = html.find("<svg"); at != std::string::npos; at = html.find("<svg", at + 1))
    ++svgs;
  EXPECT_GE(svgs, 3u);
  for (const char* fetch : {"src=", "href=", "url(", "@import", "<script", "<link"})
    EXPECT_FALSE(contains(html, fetch)) << fetch;
  EXPECT_TRUE(contains(html, "crash"));
  // Well-formed: it parses as XML (after the doctype line).
  EXPECT_EQ(run_shell("python3 -c \"import sys, xml.etree.ElementTree as E; "
                      "E.fromstring(open(sys.argv[1]).read().split(chr(10), 1)[1])\" " +
                      dir + "/out/report.html"),
            0);

  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir + "/out/tb/" + name))
      if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
        files.push_back(e.path());
    ASSERT_EQ(files.size(), 1u);
    std::vector<std::string> recs;
    ASSERT_TRUE(bench::tfrecord_parse(read_text(files[0].string()), &recs));
    tfevent::Event first;
    ASSERT_TRUE(first.ParseFromString(recs.at(0)));
    EXPECT_EQ(first.file_version(), "brain.Event:2");
    int losses = 0, ettrs = 0;
    for (size_t k = 1; k < recs.size(); ++k) {
      tfevent::Event e;
      ASSERT_TRUE(e.ParseFromString(recs[k]));
      ASSERT_EQ(e.summary().value_size(), 1);
      losses += e.summary().value(0).tag() == "loss";
      ettrs += e.summary().value(0).tag() == "ettr";
    }
    EXPECT_EQ(losses, 40);
    EXPECT_EQ(ettrs, 40);
  }
}

// TensorBoard's own reader on the event files keel-bench writes. A test of its own, so that
// the checks above count on every machine: this one needs python3's tensorboard package and
// skips without it, before it runs or checks anything.
TEST(KeelBench, EventFilesReadByTensorBoard) {
  if (!have_tensorboard())
    GTEST_SKIP() << "python3 has no tensorboard package (pip install tensorboard); the event "
                    "files' framing and contents are checked without it";
  const std::string dir = temp_dir("keel_bench_tb");
  ASSERT_NO_FATAL_FAILURE(run_keel_bench(dir));
  EXPECT_EQ(run_shell("python3 -c \"import sys, glob\n"
                      "from tensorboard.backend.event_processing.event_file_loader import "
                      "EventFileLoader\n"
                      "f = glob.glob(sys.argv[1] + '/events.out.tfevents.*')[0]\n"
                      "n = sum(1 for e in EventFileLoader(f).Load() "
                      "for v in e.summary.value if v.tag == 'loss')\n"
                      "sys.exit(0 if n == 40 else 1)\" " +
                      dir + "/out/tb/hot_swap"),
            0);
}

}  // namespace
}  // namespace keel::test
