// What the benchmark programs share: where their sibling binaries are, a corpus of random
// byte tokens (speed does not depend on the text), and reading a keel report back.
#pragma once

#include <google/protobuf/util/json_util.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "model/token_shards.h"
#include "proto/report.pb.h"

namespace keel::bench {

// The folder of the running benchmark, where keel-worker and the plugin are built too.
inline std::string exe_dir() {
  return std::filesystem::canonical("/proc/self/exe").parent_path().string();
}

// One shard of 2^20 random tokens below 256 in `dir`; returns its glob.
inline std::string random_shards(const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::mt19937 gen(7);
  std::vector<uint16_t> tokens(1 << 20);
  for (auto& t : tokens) t = uint16_t(gen() % 256);
  write_token_shard(dir + "/train_000000.bin", tokens);
  return dir + "/train_*.bin";
}

// Reads a --report JSON file into `r`; false if it is missing or not a report.
inline bool read_report(const std::string& path, report::RunReport* r) {
  std::ifstream in(path);
  if (!in) return false;
  std::string json((std::istreambuf_iterator<char>(in)), {});
  google::protobuf::util::JsonParseOptions o;
  o.ignore_unknown_fields = true;
  return google::protobuf::util::JsonStringToMessage(json, r, o).ok();
}

}  // namespace keel::bench
