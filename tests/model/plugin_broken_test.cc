// The loader refuses each deliberately broken plugin (tests/model/plugins/broken_plugin.cc)
// with a message that names the file and what differs.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "model/plugin_loader.h"
#include "runtime/check.h"
#include "tests/test_paths.h"

namespace keel {
namespace {

std::string lib(const std::string& defect) {
  return test::bin_dir() + "/libkeel_broken_" + defect + ".so";
}

// The InputError's text when loading (and describing, for tp = 2) the plugin; "" if accepted.
std::string refusal(const std::string& defect) {
  try {
    auto p = Plugin::load(lib(defect));
    keel_model_dims dims{1, 4, 1, 16, 4, 8, 8, 0.02f};
    keel_stage stage{0, 2, 0, 1, 0, 1};
    p->describe(dims, stage);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(PluginBroken, WrongAbiVersion) {
  std::string msg = refusal("bad_abi");
  EXPECT_NE(msg.find(lib("bad_abi")), std::string::npos) << msg;
  EXPECT_NE(msg.find("abi_version is 4, this runtime needs 3"), std::string::npos) << msg;
}

TEST(PluginBroken, MissingEntrySymbol) {
  std::string msg = refusal("no_entry");
  EXPECT_NE(msg.find(lib("no_entry")), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing symbol keel_plugin_entry"), std::string::npos) << msg;
}

TEST(PluginBroken, BadTensorParallelSplit) {
  // Unsplit, the same description is fine: only the split is refused.
  keel_model_dims dims{1, 4, 1, 16, 4, 8, 8, 0.02f};
  EXPECT_EQ(Plugin::load(lib("bad_split"))->describe(dims, keel_stage{0, 1, 0, 1, 0, 1}).size(),
            1u);
  std::string msg = refusal("bad_split");
  EXPECT_NE(msg.find(lib("bad_split")), std::string::npos) << msg;
  EXPECT_NE(msg.find("parameter 'w'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("shape[0] = 5 does not split into 1 block(s) over tp = 2"), std::string::npos)
      << msg;
}

TEST(PluginBroken, NullFunction) {
  std::string msg = refusal("null_fn");
  EXPECT_NE(msg.find(lib("null_fn")), std::string::npos) << msg;
  EXPECT_NE(msg.find("table field backward is NULL"), std::string::npos) << msg;
}

// A plugin is code every rank runs: a copy that others could have written, or that another
// user owns, is refused before it is read (by load and by load_copy, which keel-ctl update
// uses), naming the file and its mode.
TEST(PluginBroken, AFileOthersCanWriteIsRefused) {
  const std::string dir = test::temp_dir("plugin-mode");
  const std::string copy = dir + "/libkeel_gpt.so";
  std::filesystem::copy_file(test::bin_dir() + "/libkeel_gpt.so", copy);
  ASSERT_EQ(::chmod(copy.c_str(), 0755), 0);
  EXPECT_NO_THROW(Plugin::load(copy));
  for (mode_t mode : {0775, 0757}) {
    ASSERT_EQ(::chmod(copy.c_str(), mode), 0);
    for (bool private_copy : {false, true}) {
      try {
        private_copy ? Plugin::load_copy(copy) : Plugin::load(copy);
        ADD_FAILURE() << "mode " << std::oct << mode << " accepted";
      } catch (const InputError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("plugin " + copy + ": mode 07"), std::string::npos) << msg;
        EXPECT_NE(msg.find("chmod go-w"), std::string::npos) << msg;
      }
    }
  }
  ASSERT_EQ(::chmod(copy.c_str(), 0755), 0);
  if (::geteuid() == 0) {  // only root can give a file away
    ASSERT_EQ(::chown(copy.c_str(), 12345, 12345), 0);
    try {
      Plugin::load(copy);
      ADD_FAILURE() << "a plugin of uid 12345 accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("owned by uid 12345"), std::string::npos) << e.what();
    }
  }
}

TEST(PluginBroken, MissingFileNamesThePath) {
  std::string msg = refusal("does_not_exist");
  EXPECT_NE(msg.find("libkeel_broken_does_not_exist.so: file not found"), std::string::npos) << msg;
}

}  // namespace
}  // namespace keel
