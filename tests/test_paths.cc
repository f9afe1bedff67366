#include "test_paths.h"

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <vector>

namespace keel::test {
namespace {
std::mutex g_mu;
std::vector<std::string>* g_dirs = nullptr;
void cleanup() {
  const char* keep = std::getenv("KEEL_KEEP_TMP");
  if (keep && std::string(keep) == "1") return;
  for (const auto& d : *g_dirs) std::filesystem::remove_all(d);
}
}  // namespace

std::string bin_dir() {
  return KEEL_BIN_DIR;
}
std::string source_dir() {
  return KEEL_SOURCE_DIR;
}

std::string temp_dir(const std::string& tag) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_dirs) {
    g_dirs = new std::vector<std::string>();
    std::atexit(cleanup);
  }
  std::string pattern =
      (std::filesystem::temp_directory_path() / ("keel-" + tag + "-XXXXXX")).string();
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  char* dir = mkdtemp(buf.data());
  if (!dir) std::abort();
  g_dirs->push_back(dir);
  return dir;
}

Ran run_in(const std::string& dir, const std::string& command, int timeout_s) {
  const std::string cmd = "cd " + dir + " && timeout " + std::to_string(timeout_s) + " " + command +
                          " > " + dir + "/out.txt 2> " + dir + "/err.txt";
  const int st = std::system(cmd.c_str());
  auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  Ran r;
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = read(dir + "/out.txt");
  r.err = read(dir + "/err.txt");
  return r;
}

}  // namespace keel::test
