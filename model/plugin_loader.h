// Loads a model plugin (a shared object exporting keel_plugin_entry) with dlopen and checks
// that it is one this runtime can run: the file is not writable by group or others and is
// owned by this user or root (it is code every rank runs), the symbol exists, the ABI version
// matches, the table is complete. Every refusal is a keel::InputError naming the file and
// what differs.
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
  // The same from a private copy of the file, loaded RTLD_LOCAL and unlinked at once: a
  // distinct instance even of a path already loaded (the code replacing a running plugin,
  // its predecessor still loaded beside it), immune to the file changing afterwards.
  static std::shared_ptr<Plugin> load_copy(const std::string& path);
  ~Plugin();
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  const keel_plugin& table() const { return *table_; }
  const std::string& path() const { return path_; }
  std::string name() const { return table_->name ? table_->name : "?"; }
  std::string version() const { return table_->version ? table_->version : "?"; }
  // SHA-256 of the file's bytes as loaded, 64 hex digits: which build this is.
  const std::string& hash() const { return hash_; }

  // validate + describe_params, with the plugin's own message turned into an InputError.
  std::vector<keel_param_desc> describe(const keel_model_dims& dims, const keel_stage& stage) const;

  // Whether the plugin maps its parameters to Hugging Face names (hf_tensors, hf_config).
  bool has_hf() const;
  // Its Hugging Face tensors and config.json for these dims; InputError naming the plugin
  // when it declares none.
  std::vector<keel_hf_tensor> hf_tensors(const keel_model_dims& dims) const;
  std::string hf_config(const keel_model_dims& dims) const;

 private:
  Plugin() = default;
  // dlopens `file` (the resolved path or a private copy of it) and checks its table; `path_`
  // names it in messages.
  void open(const std::string& file);
  void* handle_ = nullptr;
  const keel_plugin* table_ = nullptr;
  std::string path_;
  std::string hash_;
};

// The first difference between the parameters a running state was laid out for and those a
// replacement plugin describes for the same coordinate (names, shapes, TP split, flags,
// ties; inits are not compared: they only matter for a fresh start), e.g.
//   "parameter 3: shape [96, 32] in the running state, [128, 32] in the new plugin ('h.0.qkv')"
// Empty when the new plugin fits the state.
std::string first_param_difference(const std::vector<keel_param_desc>& running,
                                   const std::vector<keel_param_desc>& next);

// Checks a description against what the runtime needs (unique names, shapes that TP can
// split, sane init) and throws InputError naming the parameter and field that differ.
void check_param_descs(const std::vector<keel_param_desc>& descs, const keel_stage& stage,
                       const std::string& plugin_path);

}  // namespace keel
