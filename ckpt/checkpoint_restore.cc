// Reading a persistent checkpoint back: which step directory a job resumes from (every
// file verified against the manifest, the layout and the model compared) and loading one
// rank's state from it.
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "ckpt/checkpoint_format.h"
#include "ckpt/persistent_checkpoint.h"
#include "runtime/check.h"

namespace keel {
namespace {

using namespace ckpt_format;
namespace fs = std::filesystem;

// Size and XXH3-64 of a whole file, read in chunks; false if it cannot be read.
bool file_checksum(const std::string& path, uint64_t* bytes, uint64_t* checksum) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  XXH3_state_t* state = XXH3_createState();
  KEEL_CHECK(state != nullptr);
  XXH3_64bits_reset(state);
  std::vector<char> buf(size_t(1) << 20);
  uint64_t total = 0;
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    std::streamsize n = in.gcount();
    if (n <= 0) break;
    XXH3_64bits_update(state, buf.data(), size_t(n));
    total += uint64_t(n);
  }
  bool ok = !in.bad();
  *checksum = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  *bytes = total;
  return ok;
}

std::string quoted(const std::string& s) {
  return "\"" + s + "\"";
}

// Checks one step directory; returns why it is unusable, or "" if every file is whole. One of
// another run than `lineage` (if not empty) is refused before its files are read.
std::string verify_step(const std::string& dir, const std::string& name, int64_t step,
                        const std::string& lineage, ckpt::CheckpointManifest* manifest) {
  const std::string step_dir = dir + "/" + name;
  const std::string manifest_path = step_dir + "/" + kManifest;
  if (!fs::exists(manifest_path)) return name + ": no manifest (incomplete)";
  {
    std::ifstream in(manifest_path, std::ios::binary);
    if (!in || !manifest->ParseFromIstream(&in)) {
      return name + "/" + kManifest + ": cannot parse (not a keel.ckpt.CheckpointManifest)";
    }
  }
  // An empty file parses as a manifest of nothing (every field its default), which the checks
  // below would report as a step or layout that differs: say what it is. A manifest is
  // written whole and renamed into place, so this one was not written by keel.
  if (!manifest->has_step()) {
    std::error_code ec;
    const uintmax_t bytes = fs::file_size(manifest_path, ec);
    return name + "/" + kManifest +
           (!ec && bytes == 0 ? std::string(": empty (0 bytes), not a manifest")
                              : ": records no step (not a keel.ckpt.CheckpointManifest)");
  }
  if (manifest->format_version() != kFormatVersion) {
    return detail::concat(name, "/", kManifest, ": format_version = ", manifest->format_version(),
                          " (this keel reads ", kFormatVersion, ")");
  }
  if (!lineage.empty() && manifest->lineage() != lineage)
    return name + ": written by another run (lineage " + quoted(manifest->lineage()) +
           ", this job's " + quoted(lineage) + ")";
  if (manifest->step() != step) {
    return detail::concat(name, "/", kManifest, ": step = ", manifest->step(),
                          " does not match the directory name");
  }
  const int world = manifest->tp() * manifest->pp() * manifest->dp();
  if (manifest->tp() < 1 || manifest->pp() < 1 || manifest->dp() < 1) {
    return detail::concat(name, "/", kManifest, ": tp, pp, dp = ", manifest->tp(), ", ",
                          manifest->pp(), ", ", manifest->dp(), " (each must be >= 1)");
  }
  std::vector<const ckpt::RankFile*> by_rank(size_t(std::max(world, 0)), nullptr);
  for (const auto& rf : manifest->rank_file()) {
    if (rf.rank() < 0 || rf.rank() >= world || by_rank[size_t(rf.rank())]) {
      return detail::concat(name, "/", kManifest, ": rank_file.rank = ", rf.rank(),
                            " is outside the world of ", world, " or listed twice");
    }
    by_rank[size_t(rf.rank())] = &rf;
  }
  for (int r = 0; r < world; ++r) {
    if (!by_rank[size_t(r)]) {
      return detail::concat(name, "/", kManifest, ": lists no file for rank ", r);
    }
  }
  for (const ckpt::RankFile* rf : by_rank) {
    const std::string rel = name + "/" + rf->file();
    const std::string path = dir + "/" + rel;
    uint64_t bytes = 0, checksum = 0;
    if (!fs::exists(path)) return rel + ": missing";
    if (!file_checksum(path, &bytes, &checksum)) return rel + ": cannot read";
    if (bytes != rf->bytes()) {
      return detail::concat(rel, ": ", bytes, " bytes, the manifest says ", rf->bytes(),
                            bytes < rf->bytes() ? " (truncated)" : "");
    }
    if (checksum != rf->checksum()) return rel + ": checksum mismatch";
  }
  return "";
}

}  // namespace

ResumePoint find_resume_point(const std::string& dir, const CheckpointLayout& expected,
                              std::vector<std::string>* skipped) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(dir + ": no such checkpoint directory");
  std::vector<std::string> reasons;
  for (const auto& [step, name] : list_steps(dir)) {
    ckpt::CheckpointManifest m;
    std::string why = verify_step(dir, name, step, expected.lineage, &m);
    if (!why.empty()) {
      reasons.push_back(why);
      if (skipped) skipped->push_back(why);
      continue;
    }
    std::vector<std::string> diffs;
    auto differ = [&](const char* field, const std::string& found, const std::string& job) {
      if (found != job)
        diffs.push_back(std::string(field) + " = " + found + " (this job: " + job + ")");
    };
    // The layout (tp, pp, dp, zero1, stage layers) may differ: the state is resharded on
    // load (ckpt/checkpoint_reshard.h). The model and the plugin may not.
    if (!expected.plugin_name.empty()) {
      differ("plugin_name", quoted(m.plugin_name()), quoted(expected.plugin_name));
    }
    if (!expected.plugin_version.empty()) {
      differ("plugin_version", quoted(m.plugin_version()), quoted(expected.plugin_version));
    }
    // The model: compared where both sides describe it (a manifest of an older keel does
    // not; load_rank's fingerprint check still refuses another layout then).
    if (!expected.model.empty() && m.model_size() > 0) {
      for (const auto& [field, job] : expected.model) {
        if (field == "parallel.stage_layers") continue;  // the layout, resharded
        std::string found = "(not recorded)";
        for (const auto& f : m.model())
          if (f.name() == field) found = f.value();
        if (found != job)
          diffs.push_back(field + " = " + found + " in the checkpoint, " + job + " in this job");
      }
    }
    if (!diffs.empty()) {
      std::string text = dir + "/" + name + ": the checkpoint's model differs from this job's:";
      for (const auto& d : diffs) text += " " + d + ";";
      text.pop_back();
      throw InputError(text);
    }
    return {dir + "/" + name, step, std::move(m)};
  }
  std::string text = dir + ": no usable checkpoint";
  if (reasons.empty()) text += " (no step_* directory)";
  for (const auto& r : reasons) text += "\n  " + r;
  throw InputError(text);
}

std::string check_resume(const ResumePoint& point, const config::JobConfig& cfg) {
  const int64_t steps = cfg.train().steps();
  if (point.step > steps)
    throw InputError(detail::concat(
        point.dir, ": checkpoint step ", point.step, " is past train.steps = ", steps,
        ": nothing is left to train (to go on, give train.steps > ", point.step, ")"));
  const int64_t was = point.manifest.global_batch_size(), now = cfg.train().global_batch_size();
  if (point.manifest.has_global_batch_size() && was != now)
    return detail::concat(
        point.dir, ": written with train.global_batch_size = ", was, ", this job's is ", now,
        ": the data position of a step is step × the batch, so the job reads on "
        "from sequence ",
        point.step * now, " where the run it continues was at sequence ", point.step * was);
  return "";
}

std::vector<CheckpointStep> list_checkpoints(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(dir + ": no such checkpoint directory");
  std::vector<CheckpointStep> out;
  for (const auto& [step, name] : list_steps(dir)) {
    CheckpointStep s;
    s.step = step;
    s.dir = dir + "/" + name;
    s.problem = verify_step(dir, name, step, "", &s.manifest);
    out.push_back(std::move(s));
  }
  return out;
}

ResumePoint open_checkpoint(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) throw InputError(path + ": no such checkpoint directory");
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "DIR/step_000040/"
  std::string parent = p.parent_path().string(), name = p.filename().string();
  int64_t step = -1;
  if (fs::exists(p / kManifest)) {
    for (const auto& [s, n] : list_steps(parent.empty() ? "." : parent))
      if (n == name) step = s;
    if (step < 0) throw InputError(path + ": not a step_<digits> directory");
  } else {
    parent = p.string();
    for (const auto& [s, n] : list_steps(parent)) {
      if (!fs::exists(p / n / kManifest)) continue;  // incomplete: still being written
      step = s;
      name = n;
      break;
    }
    if (step < 0)
      throw InputError(path +
                       ": no checkpoint with a manifest (no step_* directory, or none complete)");
  }
  if (parent.empty()) parent = ".";
  ckpt::CheckpointManifest m;
  const std::string why = verify_step(parent, name, step, "", &m);
  if (!why.empty()) throw InputError(parent + "/" + why);
  return {parent + "/" + name, step, std::move(m)};
}

void load_rank(const ResumePoint& point, int rank, TrainState& state) {
  const ckpt::RankFile* rf = nullptr;
  for (const auto& f : point.manifest.rank_file()) {
    if (f.rank() == rank) rf = &f;
  }
  if (!rf) throw InputError(detail::concat(point.dir, "/", kManifest, ": no file for rank ", rank));
  const std::string path = point.dir + "/" + rf->file();
  auto fail = [&](const std::string& why) { throw InputError(path + ": " + why); };

  std::ifstream in(path, std::ios::binary);
  if (!in) fail(std::string("cannot open: ") + std::strerror(errno));
  std::vector<char> bytes(rf->bytes());
  in.read(bytes.data(), std::streamsize(bytes.size()));
  if (uint64_t(in.gcount()) != rf->bytes() || in.peek() != std::ifstream::traits_type::eof()) {
    fail(detail::concat("size differs from the manifest's ", rf->bytes(), " bytes"));
  }
  if (XXH3_64bits(bytes.data(), bytes.size()) != rf->checksum()) fail("checksum mismatch");
  FileHeader h{};
  if (bytes.size() < sizeof(h)) fail("shorter than its header");
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0 || h.version != kFileVersion) {
    fail("not a keel checkpoint file of version " + std::to_string(kFileVersion));
  }
  if (h.rank != uint32_t(rank) || h.step != point.step) {
    fail(detail::concat("holds rank ", h.rank, " step ", h.step, ", expected rank ", rank, " step ",
                        point.step));
  }
  if (h.layout_fingerprint != state.layout_fingerprint()) {
    // The manifest's model description names the field (find_resume_point); one of an older
    // keel has none, and the plugin may shape its tensors by more than the configuration.
    fail(detail::concat(
        "layout_fingerprint = ", h.layout_fingerprint,
        " (this rank's state: ", state.layout_fingerprint(),
        "): the checkpoint's tensors have other shapes than this job's (another "
        "model size, plugin or parallel layout wrote it",
        point.manifest.model_size() == 0 ? "; its manifest does not record the model" : "", ")"));
  }
  if (h.payload_bytes != state.bytes() || bytes.size() != sizeof(h) + state.bytes()) {
    fail(detail::concat("payload of ", h.payload_bytes, " bytes, this rank's state has ",
                        state.bytes()));
  }
  size_t at = sizeof(h);
  for (const StateSpan& s : state.spans()) {
    state.backend()->copy_from_host(s.data, bytes.data() + at, s.bytes());
    at += s.bytes();
  }
  state.backend()->synchronize();
  state.set_step(point.step);
}

}  // namespace keel
