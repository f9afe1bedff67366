// The report's files (launcher/run_report.h) where a step has no record: its values are NaN in
// the message, null in the JSON (never "NaN", never a neighbour's value), and a break in the
// loss picture; the JSON reads back with the gap where it was.
#include "launcher/run_report.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "proto/json_gaps.h"

namespace keel {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

report::RunReport with_a_gap() {
  report::RunReport r;
  r.set_layout("tp1 pp1 dp1");
  for (double v : {3.0, 2.5, kNaN, kNaN, 2.0, 1.9}) r.add_losses(v);
  for (double t : {1.0, 2.0, kNaN, kNaN, 5.0, 6.0}) r.add_step_end_s(t);
  r.add_steps_without_record(2);
  r.add_steps_without_record(3);
  r.set_stop_reason("NaN");  // a text that says NaN stays a text
  return r;
}

TEST(RunReport, AStepWithoutRecordIsNullInTheJsonAndReadsBackAsAGap) {
  const std::string dir = testing::TempDir() + "/run-report-gap";
  std::filesystem::create_directories(dir);
  write_report_json(dir + "/report.json", with_a_gap());
  const std::string json = read_all(dir + "/report.json");
  EXPECT_EQ(count(json, "null"), 4) << json;     // two losses, two step ends
  EXPECT_EQ(count(json, "\"NaN\""), 1) << json;  // the stop reason's text only
  report::RunReport back;
  ASSERT_EQ(message_from_json(json, &back), "");
  ASSERT_EQ(back.losses_size(), 6);
  EXPECT_EQ(back.losses(1), 2.5);
  EXPECT_TRUE(std::isnan(back.losses(2)) && std::isnan(back.losses(3)));
  EXPECT_TRUE(std::isnan(back.step_end_s(3)));
  EXPECT_EQ(back.losses(4), 2.0);
  EXPECT_EQ(back.stop_reason(), "NaN");
}

TEST(RunReport, TheLossPictureBreaksAtAGap) {
  const std::string dir = testing::TempDir() + "/run-report-gap";
  std::filesystem::create_directories(dir);
  write_loss_svg(dir + "/loss.svg", with_a_gap());
  const std::string svg = read_all(dir + "/loss.svg");
  // The raw losses and their average: two stretches each, on either side of the gap.
  EXPECT_EQ(count(svg, "stroke='#aec7e8'"), 2) << svg;
  EXPECT_EQ(count(svg, "stroke='#1f3f8f'"), 2) << svg;
  EXPECT_EQ(count(svg, "nan"), 0) << svg;
}

TEST(JsonGaps, OnlyArrayElementsChangeNeverKeysOrTexts) {
  const std::string printed = R"({"NaN": "NaN", "a": ["NaN", 1, "x\"NaN\"", "NaNa"], "b": "null"})";
  EXPECT_EQ(nan_as_null(printed),
            R"({"NaN": "NaN", "a": [null, 1, "x\"NaN\"", "NaNa"], "b": "null"})");
  EXPECT_EQ(null_as_nan(R"({"a": [null, 1, [null]], "b": "null", "c": null})"),
            R"({"a": ["NaN", 1, ["NaN"]], "b": "null", "c": null})");
}

}  // namespace
}  // namespace keel
