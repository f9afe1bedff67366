// The on-disk format of a persistent checkpoint, shared by its writer
// (ckpt/persistent_checkpoint.cc) and its reader (ckpt/checkpoint_restore.cc): a directory
// step_<digits>/ with one rank_<r>.bin per rank (a FileHeader, then the state's spans in
// order) and manifest.pb, written last. Private to ckpt/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace keel::ckpt_format {

constexpr char kMagic[8] = {'K', 'E', 'E', 'L', 'C', 'K', 'P', 'T'};
constexpr uint32_t kFileVersion = 1;
constexpr int kFormatVersion = 1;
constexpr const char* kManifest = "manifest.pb";

// The fixed header of a rank file; the payload (the state's spans in order) follows.
struct FileHeader {
  char magic[8];
  uint32_t version;
  uint32_t rank;
  int64_t step;
  uint64_t layout_fingerprint;
  uint64_t payload_bytes;
};
static_assert(sizeof(FileHeader) == 40);

inline std::string rank_file_name(int rank) {
  return "rank_" + std::to_string(rank) + ".bin";
}

// Step directories under `dir` ("step_<digits>"), newest first.
inline std::vector<std::pair<int64_t, std::string>> list_steps(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> steps;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind("step_", 0) != 0 || name.size() == 5 || !entry.is_directory()) continue;
    std::string digits = name.substr(5);
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    steps.emplace_back(std::stoll(digits), name);
  }
  std::sort(steps.begin(), steps.end(), std::greater<>());
  return steps;
}

}  // namespace keel::ckpt_format
