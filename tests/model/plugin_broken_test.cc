// The loader refuses each deliberately broken plugin (tests/model/plugins/broken_plugin.cc)
// with a message that names the file and what differs.
#include <gtest/gtest.h>

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

TEST(PluginBroken, MissingFileNamesThePath) {
  std::string msg = refusal("does_not_exist");
  EXPECT_NE(msg.find("libkeel_broken_does_not_exist.so: file not found"), std::string::npos) << msg;
}

}  // namespace
}  // namespace keel
