#include "launcher/controller/stack_report.h"

#include <filesystem>
#include <fstream>
#include <system_error>
#include <vector>

#include "runtime/check.h"

namespace keel {
namespace {

namespace fs = std::filesystem;

// Writes `text` to `path`; "" on success, else why not.
std::string write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) return "cannot write " + path.string();
  return "";
}

}  // namespace

RankThreads to_rank_threads(const control::RankStacks& msg) {
  RankThreads r;
  r.rank = msg.rank();
  r.error = msg.error();
  for (const auto& tm : msg.threads())
    r.threads.push_back({tm.name(),
                         std::vector<std::string>(tm.frames().begin(), tm.frames().end()),
                         /*main=*/tm.tid() == msg.pid()});
  return r;
}

control::StacksReply collect_stacks(RankHost& host, const std::string& dir,
                                    std::chrono::milliseconds timeout) {
  control::StacksReply reply;
  reply.set_dir(dir);
  const std::map<int, control::RankStacks> stacks = host.capture_stacks(timeout);
  if (stacks.empty()) {
    reply.set_message(
        "no worker's stacks could be captured (no running ranks, or no slot "
        "answered in time)");
    return reply;
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    reply.set_message("cannot create " + dir + ": " + ec.message());
    return reply;
  }
  std::vector<RankThreads> ranks;
  std::string failed;
  for (const auto& [rank, msg] : stacks) {
    ranks.push_back(to_rank_threads(msg));
    const std::string text =
        "rank " + std::to_string(rank) + ", " + format_stacks(from_message(msg));
    const std::string err =
        write_file(fs::path(dir) / ("rank" + std::to_string(rank) + ".txt"), text);
    if (!err.empty() && failed.empty()) failed = err;
  }
  const StackVerdict verdict = group_stacks(ranks);
  reply.set_summary(format_verdict(verdict));
  for (int r : verdict.culprits) reply.add_culprits(r);
  if (const std::string err = write_file(fs::path(dir) / "summary.txt", reply.summary());
      !err.empty() && failed.empty())
    failed = err;
  reply.set_ok(failed.empty());
  reply.set_message(failed.empty() ? verdict.reason : failed);
  return reply;
}

}  // namespace keel
