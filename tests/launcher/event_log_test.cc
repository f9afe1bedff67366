// The job's event log (launcher/controller/event_log.h): every line a keel.events.Event printed by
// protobuf's JSON printer, user text escaped, and a full disk costing the log, not the job.
#include "launcher/controller/event_log.h"

#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "launcher/recovery_protocol.h"
#include "proto/events.pb.h"
#include "tests/test_paths.h"

namespace keel {
namespace {

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// Text a rank or a user wrote (quotes, backslashes, a newline, a brace) comes back as it was,
// on one line, and the line reads as t, kind, data in that order.
TEST(EventLog, EveryLineIsAnEventThatReadsBackWithItsText) {
  const std::string path = test::temp_dir("event-log") + "/events.jsonl";
  const std::string nasty = "crash@step=5,rank=1 \"quoted\" back\\slash\nsecond line }{";
  const double before = recovery::unix_now();
  {
    EventLog log(path);
    log.write("launch", EventFields().add("job", "123-abc").add("slots", 3).add("world", 2));
    log.write("inject_request", EventFields().add("fault", nasty));
    log.write("end", EventFields().add("code", 7));
    log.write("empty");
  }
  const std::vector<std::string> lines = lines_of(path);
  ASSERT_EQ(lines.size(), 4u);
  std::vector<events::Event> ev(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    SCOPED_TRACE(lines[i]);
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(lines[i], &ev[i]).ok());
    EXPECT_EQ(lines[i].rfind("{\"t\":", 0), 0u);
    EXPECT_LT(lines[i].find("\"t\":"), lines[i].find("\"kind\":"));
    EXPECT_LT(lines[i].find("\"kind\":"), lines[i].find("\"data\":"));
    EXPECT_GE(ev[i].t(), before);
    EXPECT_LE(ev[i].t(), recovery::unix_now());
  }
  EXPECT_EQ(ev[0].kind(), "launch");
  EXPECT_EQ(ev[0].data().fields().at("job").string_value(), "123-abc");
  EXPECT_EQ(ev[0].data().fields().at("slots").number_value(), 3);
  EXPECT_EQ(ev[0].data().fields().at("world").number_value(), 2);
  EXPECT_NE(lines[0].find("\"slots\":3"), std::string::npos);  // integers print as integers
  EXPECT_EQ(ev[1].data().fields().at("fault").string_value(), nasty);
  EXPECT_EQ(ev[2].kind(), "end");
  EXPECT_EQ(ev[2].data().fields().at("code").number_value(), 7);
  EXPECT_EQ(ev[3].kind(), "empty");
  EXPECT_NE(lines[3].find("\"data\":{}"), std::string::npos);
}

// /dev/full takes the open and fails every write with ENOSPC: said once, nothing thrown.
TEST(EventLog, AFullDiskIsSaidOnceAndTheJobGoesOn) {
  EventLog log("/dev/full");
  testing::internal::CaptureStderr();
  for (int i = 0; i < 3; ++i) EXPECT_NO_THROW(log.write("start", EventFields().add("world", i)));
  const std::string err = testing::internal::GetCapturedStderr();
  const std::string said =
      "/dev/full: cannot write (No space left on device); the job goes on without it";
  const size_t at = err.find(said);
  ASSERT_NE(at, std::string::npos) << err;
  EXPECT_EQ(err.find(said, at + 1), std::string::npos) << err;
  // The events themselves still reach the log.
  EXPECT_NE(err.find("\"kind\":\"start\""), std::string::npos) << err;
}

}  // namespace
}  // namespace keel
