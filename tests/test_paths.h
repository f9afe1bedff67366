// Where tests find keel's binaries, sources and a scratch folder, and how they run a binary.
#pragma once

#include <string>

namespace keel::test {

std::string bin_dir();     // the build's bin/ (keel-worker, libkeel_gpt.so, ...)
std::string source_dir();  // the repository root
// A fresh, empty folder for this test; removed when the process exits unless KEEL_KEEP_TMP=1.
std::string temp_dir(const std::string& tag);

// A command's exit status and its stdout and stderr apart.
struct Ran {
  int rc = -1;  // 128 + the signal when one ended it
  std::string out, err;
};
// Runs `command` (a shell command line) in `dir` under `timeout_s`, its output kept in `dir`.
Ran run_in(const std::string& dir, const std::string& command, int timeout_s = 60);

}  // namespace keel::test
