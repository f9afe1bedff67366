// The launcher's house rules, checked on the sources (DESIGN.md, Layout): a folder per
// process whose code imports nothing of another process's folder, one reader of the KEEL_*
// environment (launcher/job_env.cc), and no protocol value parsed out of a string.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "test_paths.h"

namespace keel {
namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Every C++ source under `dir` (recursively), relative to the repository root.
std::vector<fs::path> sources(const std::string& dir) {
  std::vector<fs::path> out;
  const fs::path root = fs::path(test::source_dir()) / dir;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    const std::string ext = e.path().extension().string();
    if (e.is_regular_file() && (ext == ".cc" || ext == ".h" || ext == ".cu"))
      out.push_back(e.path());
  }
  return out;
}

TEST(LauncherLayout, ProcessFoldersImportNothingOfEachOther) {
  const std::vector<std::string> processes = {"controller", "agent", "worker"};
  int files = 0;
  for (const std::string& p : processes) {
    for (const fs::path& f : sources("launcher/" + p)) {
      ++files;
      const std::string text = read(f);
      for (const std::string& other : processes) {
        if (other == p) continue;
        const std::string import = "#include \"launcher/" + other + "/";
        EXPECT_EQ(text.find(import), std::string::npos)
            << f.string() << " (the " << p << ") includes from launcher/" << other << "/";
      }
    }
  }
  EXPECT_GE(files, 10) << "the process folders are missing";
}

// The shared part of launcher/ (beside the folders) is below every process: it imports none.
TEST(LauncherLayout, SharedFilesImportNoProcessFolder) {
  const std::regex import("#include \"launcher/(controller|agent|worker)/");
  for (const auto& e : fs::directory_iterator(fs::path(test::source_dir()) / "launcher")) {
    const std::string name = e.path().filename().string();
    // The mains, keel-launch's bootstrap, its controller process (lead.cc), its wait for that
    // controller (controller_wait.cc) and for the job's end after it died (await_job_end.cc;
    // both read the agent's exit codes) compose the processes: they may.
    if (!e.is_regular_file() || name.ends_with("_main.cc") || name == "launch.cc" ||
        name == "lead.cc" || name == "await_job_end.cc" || name == "controller_wait.cc")
      continue;
    if (e.path().extension() != ".cc" && e.path().extension() != ".h") continue;
    EXPECT_FALSE(std::regex_search(read(e.path()), import)) << e.path().string();
  }
}

TEST(LauncherLayout, OnlyJobEnvReadsKeelVariables) {
  // Two variables belong to lower layers, read where they are used: the BLAS peak's cache
  // (runtime/) and the interface the data plane binds to (parallel/).
  const std::vector<std::string> allowed = {"launcher/job_env.cc", "runtime/cpu/sgemm_peak.cc",
                                            "parallel/net_address.cc"};
  for (const char* dir : {"launcher", "robust", "ckpt", "model", "parallel", "runtime", "bench"}) {
    for (const fs::path& f : sources(dir)) {
      const std::string rel = fs::relative(f, test::source_dir()).string();
      if (std::find(allowed.begin(), allowed.end(), rel) != allowed.end()) continue;
      EXPECT_EQ(read(f).find("getenv(\"KEEL_"), std::string::npos)
          << rel << " reads a KEEL_* variable: read it through JobEnv (launcher/job_env.h)";
    }
  }
}

TEST(LauncherLayout, NoProtocolValueIsParsedFromAString) {
  // sscanf and istringstream parse text; the store and the control plane carry protobuf
  // messages. Reading /proc is the one place text is the interface.
  for (const char* dir : {"launcher", "robust", "ckpt"}) {
    for (const fs::path& f : sources(dir)) {
      const std::string rel = fs::relative(f, test::source_dir()).string();
      if (rel == "launcher/stack_unwinder.cc") continue;  // /proc/PID/maps
      std::ifstream in(f);
      std::string line;
      for (int n = 1; std::getline(in, line); ++n) {
        if (line.find("/proc") != std::string::npos) continue;
        EXPECT_EQ(line.find("sscanf("), std::string::npos) << rel << ":" << n << ": " << line;
        EXPECT_EQ(line.find("istringstream"), std::string::npos) << rel << ":" << n << ": " << line;
      }
    }
  }
}

}  // namespace
}  // namespace keel
