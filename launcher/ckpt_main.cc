// keel-ckpt: looks into persistent checkpoints and takes the model out of them.
//   keel-ckpt inspect DIR                       steps, layout, lineage, model, files verified
//   keel-ckpt export --format hf|llmc CHECKPOINT OUT
// (nothing imports: a job reads a Hugging Face directory or an llm.c file as
// model.init_checkpoint, and a keel checkpoint with --resume).
// CHECKPOINT is checkpoint.dir (its newest complete step) or one step's directory; `hf`
// writes OUT/model.safetensors + OUT/config.json (names as the plugin declares them,
// model/plugin.h), `llmc` an llm.c GPT-2 file OUT. The plugin is the one the manifest
// records (or --plugin); the model's sizes come from the manifest (or --config for a
// checkpoint of an older keel, which does not record them). OUT may not be inside the
// checkpoint read. Errors are one line on stderr, "keel-ckpt: error: ...", exit 2.
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <string>

#include "ckpt/checkpoint_reshard.h"
#include "ckpt/persistent_checkpoint.h"
#include "model/hf_checkpoint.h"
#include "model/job_layout.h"
#include "model/llmc_checkpoint.h"
#include "model/param_store.h"
#include "proto/config_loader.h"
#include "runtime/check.h"
#include "runtime/cli.h"
#include "runtime/logging.h"

namespace {

namespace fs = std::filesystem;
using namespace keel;

// The plugin that wrote `m` (the manifest of checkpoint `dir`): --plugin, else the file the
// manifest records (or one of its name next to keel-ckpt, for a checkpoint moved from another
// machine), else by plugin name. A --plugin of another name than the manifest's is refused, as
// a resume refuses it: its parameter table would describe another model.
std::shared_ptr<Plugin> plugin_of(const ckpt::CheckpointManifest& m, const std::string& flag,
                                  const std::string& dir) {
  if (!flag.empty()) {
    auto p = Plugin::load(flag);
    if (p->name() != m.plugin_name())
      throw InputError(dir + ": plugin_name = \"" + m.plugin_name() + "\" in the checkpoint, \"" +
                       p->name() + "\" in --plugin " + flag);
    return p;
  }
  std::vector<std::string> tries;
  if (m.has_plugin_file()) {
    tries.push_back(m.plugin_file());
    tries.push_back(fs::path(m.plugin_file()).filename().string());
  }
  tries.push_back(m.plugin_name() == "gpt2" ? "libkeel_gpt.so"
                                            : "libkeel_" + m.plugin_name() + ".so");
  for (const std::string& t : tries) {
    try {
      auto p = Plugin::load(t);
      if (p->name() == m.plugin_name()) return p;
    } catch (const InputError&) {
    }
  }
  throw InputError("the checkpoint's plugin \"" + m.plugin_name() + "\" (" +
                   (m.has_plugin_file() ? m.plugin_file() : "file not recorded") +
                   ") cannot be loaded: name it with --plugin PATH");
}

config::JobConfig base_config(const ckpt::CheckpointManifest& m, const std::string& config) {
  if (!config.empty()) return load_config(config, {});
  if (m.model_size() == 0)
    throw InputError(
        "the manifest does not record the model (an older keel wrote it): name the job's "
        "config with --config FILE");
  return config::JobConfig();
}

std::string layout_text(const ckpt::CheckpointManifest& m) {
  std::string stages;
  for (const auto& f : m.model())
    if (f.name() == "parallel.stage_layers") stages = f.value();
  return detail::concat("tp ", m.tp(), " pp ", m.pp(), " dp ", m.dp(), m.zero1() ? " zero1" : "",
                        stages.empty() || stages == "[]" ? "" : " stage_layers " + stages);
}

// A --plugin is checked against every usable step before anything is printed, as export
// checks it before it reads (ckpt/checkpoint_reshard.h): the name, then each rank file's layout
// against the plugin's parameter table. A parameter count from a plugin that does not fit
// would be a wrong one.
void check_plugin_flag(const std::vector<CheckpointStep>& steps, const std::string& plugin_flag) {
  for (const CheckpointStep& s : steps) {
    if (!s.problem.empty() || s.manifest.model_size() == 0) continue;
    const auto plugin = plugin_of(s.manifest, plugin_flag, s.dir);
    check_plugin_fits({s.dir, s.step, s.manifest}, *plugin, config::JobConfig());
  }
}

int inspect(const std::string& dir, const std::string& plugin_flag) {
  std::vector<CheckpointStep> steps;
  if (fs::exists(fs::path(dir) / "manifest.pb")) {
    const ResumePoint p = open_checkpoint(dir);  // one step: verified or refused
    steps.push_back({p.step, p.dir, "", p.manifest});
  } else {
    steps = list_checkpoints(dir);
  }
  if (steps.empty()) throw InputError(dir + ": no step_* directory");
  if (!plugin_flag.empty()) check_plugin_flag(steps, plugin_flag);
  std::printf("%s: %zu step(s), newest first\n", dir.c_str(), steps.size());
  for (const CheckpointStep& s : steps) {
    const ckpt::CheckpointManifest& m = s.manifest;
    if (!s.problem.empty() && !m.has_step()) {
      std::printf("  step %" PRId64 ": UNUSABLE: %s\n", s.step, s.problem.c_str());
      continue;
    }
    uint64_t bytes = 0;
    for (const auto& f : m.rank_file()) bytes += f.bytes();
    const std::time_t at = std::time_t(m.written_at());
    char when[32] = "?";
    std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&at));
    std::printf("  step %" PRId64 ": %s\n    layout  %s (%d rank files, %.1f MB)\n", s.step,
                s.problem.empty() ? "ok, every file's size and checksum verified"
                                  : ("UNUSABLE: " + s.problem).c_str(),
                layout_text(m).c_str(), m.rank_file_size(), double(bytes) / 1e6);
    std::printf("    plugin  %s %s%s\n    lineage %s, written %s\n", m.plugin_name().c_str(),
                m.plugin_version().c_str(),
                m.has_plugin_file() ? (" (" + m.plugin_file() + ")").c_str() : "",
                m.lineage().empty() ? "(none)" : m.lineage().c_str(), when);
    std::string model;
    for (const auto& f : m.model())
      if (f.name().rfind("model.", 0) == 0) model += " " + f.name().substr(6) + "=" + f.value();
    if (!model.empty()) {
      std::string params;
      try {  // the parameter count needs the plugin: said where it loads
        const config::JobConfig cfg = checkpoint_config(m, config::JobConfig());
        int64_t n = 0;
        for (const auto& d :
             plugin_of(m, plugin_flag, s.dir)->describe(model_dims(cfg), single_rank_stage(cfg)))
          n += int64_t(global_numel(d));
        params = detail::concat(", ", n, " parameters");
      } catch (const InputError&) {
      }
      std::printf("    model  %s%s\n", model.c_str(), params.c_str());
    }
  }
  return 0;
}

// An export never writes over its input: OUT may not be, or be inside, the checkpoint
// directory it reads (checkpoint.dir, which holds the step read and the older ones a resume
// falls back to), by canonical path (symbolic links resolved), nor be one of the step's files
// by another name (a hard link). `writes`: the files the export makes.
void refuse_output_in_checkpoint(const std::string& out, const std::vector<fs::path>& writes,
                                 const ResumePoint& point) {
  std::error_code ec;
  const fs::path ckpt_dir = fs::weakly_canonical(fs::path(point.dir).parent_path(), ec);
  const fs::path target = fs::weakly_canonical(fs::absolute(out), ec);
  auto inside = [](const fs::path& p, const fs::path& root) {
    auto r = root.begin(), q = p.begin();
    for (; r != root.end() && !r->empty(); ++r, ++q)
      if (q == p.end() || *q != *r) return false;
    return true;
  };
  if (!ckpt_dir.empty() && inside(target, ckpt_dir))
    throw InputError(out + ": is inside the checkpoint being read (" + ckpt_dir.string() +
                     "): an export does not write into its input; name an output outside it");
  for (const fs::path& w : writes)
    for (const auto& f : fs::directory_iterator(point.dir, ec))
      if (fs::equivalent(w, f.path(), ec))
        throw InputError(out + ": " + (w == fs::path(out) ? "" : w.string() + " ") +
                         "is a link to the checkpoint's file " + f.path().string() +
                         ": an export does not write over its input; name an output outside it");
}

int export_checkpoint(const std::string& format, const std::string& path, const std::string& out,
                      const std::string& plugin_flag, const std::string& config) {
  const ResumePoint point = open_checkpoint(path);
  const ckpt::CheckpointManifest& m = point.manifest;
  refuse_output_in_checkpoint(out,
                              format == "hf"
                                  ? std::vector<fs::path>{fs::path(out) / "model.safetensors",
                                                          fs::path(out) / "config.json"}
                                  : std::vector<fs::path>{out},
                              point);
  const std::shared_ptr<Plugin> plugin = plugin_of(m, plugin_flag, point.dir);
  const config::JobConfig base = base_config(m, config);
  const config::JobConfig cfg = checkpoint_config(m, base);
  const keel_model_dims dims = model_dims(cfg);
  const std::vector<keel_param_desc> params = plugin->describe(dims, single_rank_stage(cfg));
  if (format == "hf") {
    HfExport hf(out, *plugin, dims, params);
    for_each_full_tensor(
        point, *plugin, base,
        [&](const keel_param_desc& d, const std::vector<float>& t) { hf.add(d, t); });
    hf.finish();
    std::printf("keel-ckpt: step %" PRId64 " of %s (%s, %s) -> %s/model.safetensors, config.json\n",
                point.step, point.dir.c_str(), m.plugin_name().c_str(), layout_text(m).c_str(),
                out.c_str());
    return 0;
  }
  if (m.plugin_name() != "gpt2")
    throw InputError("--format llmc holds llm.c's GPT-2 only; the checkpoint's plugin is \"" +
                     m.plugin_name() + "\" (use --format hf)");
  NamedTensors full;
  for_each_full_tensor(point, *plugin, base,
                       [&](const keel_param_desc& d, const std::vector<float>& t) {
                         full[std::string(d.name, strnlen(d.name, KEEL_PARAM_NAME_MAX))] = t;
                       });
  write_llmc_checkpoint(out, dims, full);
  std::printf("keel-ckpt: step %" PRId64 " of %s -> %s (llm.c GPT-2, fp32)\n", point.step,
              point.dir.c_str(), out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  keel::init_logging(argv[0]);
  CLI::App app("keel-ckpt: looks into persistent checkpoints and takes the model out of them.",
               "keel-ckpt");
  app.require_subcommand(1, 1);
  std::string dir, plugin, format, checkpoint, out, config;
  CLI::App* insp = app.add_subcommand("inspect", "steps, layout, lineage, model; files verified");
  insp->add_option("dir", dir, "checkpoint.dir, or one step's directory")
      ->type_name("DIR")
      ->required();
  insp->add_option("--plugin", plugin, "the model plugin (default: the one the manifest names)")
      ->type_name("PATH");
  CLI::App* exp = app.add_subcommand("export", "write the weights as Hugging Face or llm.c files");
  exp->add_option("--format", format, "hf: OUT/model.safetensors + OUT/config.json; llmc: OUT")
      ->type_name("hf|llmc")
      ->check(CLI::IsMember({"hf", "llmc"}))
      ->required();
  exp->add_option("checkpoint", checkpoint,
                  "checkpoint.dir (its newest step) or a step's directory")
      ->type_name("CHECKPOINT")
      ->required();
  exp->add_option("out", out, "output directory (hf) or file (llmc)")->type_name("OUT")->required();
  exp->add_option("--plugin", plugin, "the model plugin (default: the one the manifest names)")
      ->type_name("PATH");
  exp->add_option("--config", config, "the job's config, for a manifest without the model's sizes")
      ->type_name("FILE");
  // CLI11 would say only "A subcommand is required", or that the word was not expected: say
  // what keel-ckpt does, and where the way in is for what it does not (a job reads weights
  // itself).
  const std::string commands =
      "keel-ckpt's commands are inspect DIR and export --format hf|llmc CHECKPOINT OUT";
  const std::string way_in =
      "a job reads weights itself: a Hugging Face directory (model.safetensors + config.json) "
      "or an llm.c file with keel-worker --set model.init_checkpoint=PATH, a keel checkpoint "
      "with --resume DIR";
  if (argc < 2) return keel::cli::usage_error(app, "a command is needed: " + commands);
  const std::string first = argv[1];
  if (first == "import")
    return keel::cli::usage_error(app, "import: not a command; " + way_in + " (" + commands + ")");
  if (!first.empty() && first[0] != '-' && first != "inspect" && first != "export")
    return keel::cli::usage_error(app, first + ": not a command; " + commands);
  if (auto rc = keel::cli::parse(app, argc, argv)) return *rc;
  try {
    if (app.got_subcommand(insp)) return inspect(dir, plugin);
    return export_checkpoint(format, checkpoint, out, plugin, config);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "keel-ckpt: error: %s\n", e.what());
    return 2;
  }
}
