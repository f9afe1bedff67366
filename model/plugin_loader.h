// Loads a model plugin (a shared object exporting keel_plugin_entry) with dlopen and checks
// that it is one this runtime can run: the symbol exists, the ABI version matches, the table
// is complete. Every refusal is a keel::InputError naming the file and what differs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/plugin.h"

namespace keel {

class Plugin {
 public:
  // Resolves `path` (as given, then next to the running executable) and loads it.
  static std::shared_ptr<Plugin> load(const std::string& path);
  ~Plugin();
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  const keel_plugin& table() const { return *table_; }
  const std::string& path() const { return path_; }
  std::string name() const { return table_->name ? table_->name : "?"; }
  std::string version() const { return table_->version ? table_->version : "?"; }

  // validate + describe_params, with the plugin's own message turned into an InputError.
  std::vector<keel_param_desc> describe(const keel_model_dims& dims, const keel_stage& stage) const;

 private:
  Plugin() = default;
  void* handle_ = nullptr;
  const keel_plugin* table_ = nullptr;
  std::string path_;
};

// Checks a description against what the runtime needs (unique names, shapes that TP can
// split, sane init) and throws InputError naming the parameter and field that differ.
void check_param_descs(const std::vector<keel_param_desc>& descs, const keel_stage& stage,
                       const std::string& plugin_path);

}  // namespace keel
