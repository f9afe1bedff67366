// keel-prepare-data's refusals, through the real binary: each bad input exits 2 with one line
// "keel-prepare-data: error: ..." naming the flag or the file and what is wrong with it, before
// any shard is written.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "test_paths.h"

namespace keel::test {
namespace {

namespace fs = std::filesystem;

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Runs keel-prepare-data with `args` in `dir`; its stdout and stderr apart.
Ran prepare_data(const std::string& dir, const std::string& args) {
  const std::string bin = bin_dir() + "/keel-prepare-data";
  EXPECT_TRUE(fs::exists(bin)) << bin << " is not built (cmake --build: keel-prepare-data)";
  return run_in(dir, bin + " " + args, 30);
}

TEST(PrepareDataCli, BadInputIsRefusedNamingTheFileOrFlag) {
  const std::string dir = temp_dir("prepare_data_cli");
  std::ofstream(dir + "/text.txt") << std::string(3000, 'k');
  std::ofstream(dir + "/tiny.txt") << "hello world\n";
  std::ofstream(dir + "/empty.txt");
  std::ofstream(dir + "/binary.bin") << std::string("a\0b", 3);
  std::ofstream(dir + "/a-file") << "not a directory\n";
  fs::create_directories(dir + "/a-dir");
  struct Case {
    std::string args;
    std::string said;
  };
  const Case cases[] = {
      // The flags: their ranges in words.
      {"--out o --val-fraction nan text.txt", "--val-fraction nan: must be a number >= 0 and < 1"},
      {"--out o --val-fraction 1 text.txt", "--val-fraction 1: must be a number >= 0 and < 1"},
      {"--out o --val-fraction -0.5 text.txt", "--val-fraction -0.5: must be a number >= 0"},
      {"--out o --val-fraction inf text.txt", "--val-fraction inf: must be a number >= 0"},
      {"--out o --shard-tokens 1 text.txt",
       "--shard-tokens 1: must be a whole number from 2 to 2147483647"},
      {"--out o --shard-tokens 2.5 text.txt", "--shard-tokens 2.5: must be a whole number"},
      {"--out o --shard-tokens 3000000000 text.txt", "--shard-tokens 3000000000: must be"},
      {"--out o --shard-tokens 99999999999999999999 text.txt", "--shard-tokens 9999"},
      {"--out o --prefix sub/x_ text.txt", "--prefix sub/x_: must be the start of a file name"},
      {"text.txt", "--out is required"},
      {"--out o", "FILES is required"},
      // The input files.
      {"--out o missing.txt", "missing.txt: cannot open: No such file or directory"},
      {"--out o a-dir", "a-dir: is a directory, not a text file"},
      {"--out o text.txt missing.txt", "missing.txt: cannot open"},
      {"--out o empty.txt", "empty.txt: only 0 training token(s) in 1 text file(s)"},
      {"--out o binary.bin", "binary.bin: only 0 training token(s) in 0 text file(s) (1 skipped"},
      {"--out o tiny.txt", "tiny.txt: only 1 validation token(s) (--val-fraction 0.1 of 12"},
      // The output directory.
      {"--out a-file text.txt", "--out a-file: is a file, not a directory"},
      {"--out a-file/sub text.txt", "--out a-file/sub: " + dir + "/a-file is a file"},
  };
  for (const Case& c : cases) {
    const Ran r = prepare_data(dir, c.args);
    EXPECT_EQ(r.rc, 2) << c.args << "\n" << r.out << r.err;
    EXPECT_EQ(r.err.rfind("keel-prepare-data: error: ", 0), 0u) << c.args << "\n" << r.err;
    EXPECT_TRUE(has(r.err, c.said)) << c.args << "\n" << r.err;
    EXPECT_FALSE(has(r.out, "wrote ")) << c.args << "\n" << r.out;
    EXPECT_FALSE(fs::exists(dir + "/o")) << c.args << ": made the output directory";
  }
}

TEST(PrepareDataCli, UnwritableOutputIsNamed) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes anywhere";
  const std::string dir = temp_dir("prepare_data_ro");
  std::ofstream(dir + "/text.txt") << std::string(3000, 'k');
  fs::create_directories(dir + "/locked");
  fs::permissions(dir + "/locked", fs::perms::owner_read | fs::perms::owner_exec);
  const Ran r = prepare_data(dir, "--out locked/shards text.txt");
  fs::permissions(dir + "/locked", fs::perms::owner_all);
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_TRUE(has(r.err, "--out locked/shards: cannot write in it (")) << r.err;
  EXPECT_TRUE(has(r.err, "Permission denied")) << r.err;
}

// Good input still goes, with the numbers written as people write them; a split that is now
// empty leaves none of an earlier run's shards behind.
TEST(PrepareDataCli, WritesShardsAndClearsStaleOnes) {
  const std::string dir = temp_dir("prepare_data_ok");
  std::ofstream(dir + "/text.txt") << std::string(3000, 'k');
  const Ran first = prepare_data(dir, "--out o --shard-tokens 1e3 --val-fraction 0.5 text.txt");
  ASSERT_EQ(first.rc, 0) << first.err;
  EXPECT_TRUE(fs::exists(dir + "/o/train_000001.bin"));
  EXPECT_TRUE(fs::exists(dir + "/o/val_000001.bin"));
  EXPECT_FALSE(fs::exists(dir + "/o/train_000002.bin"));
  const Ran second = prepare_data(dir, "--out o --val-fraction 0 --shard-tokens 010 text.txt");
  ASSERT_EQ(second.rc, 0) << second.err;
  // 010 is ten tokens a shard (not octal 8): 3000 tokens in 300 shards.
  EXPECT_TRUE(has(second.out, "3000 train in 300 shard(s)")) << second.out;
  EXPECT_FALSE(fs::exists(dir + "/o/val_000000.bin")) << second.out;
}

}  // namespace
}  // namespace keel::test
