// Where tests find keel's binaries, sources and a scratch folder.
#pragma once

#include <string>

namespace keel::test {

std::string bin_dir();     // the build's bin/ (keel-worker, libkeel_gpt.so, ...)
std::string source_dir();  // the repository root
// A fresh, empty folder for this test; removed when the process exits unless KEEL_KEEP_TMP=1.
std::string temp_dir(const std::string& tag);

}  // namespace keel::test
