#include "ckpt/checkpoint_reshard.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>

#include "ckpt/checkpoint_format.h"
#include "model/job_layout.h"
#include "runtime/check.h"

namespace keel {
namespace {

using namespace ckpt_format;

int to_int(const std::string& field, const std::string& value) {
  try {
    size_t used = 0;
    const int v = std::stoi(value, &used);
    if (used == value.size()) return v;
  } catch (const std::exception&) {
  }
  throw InputError(detail::concat("manifest: ", field, " = \"", value, "\" is not a number"));
}

// One rank file opened for reads at offsets, its header checked against the plan's shape.
class RankFileReader {
 public:
  RankFileReader(const ResumePoint& point, int rank, const RankStateShape& shape) {
    const ckpt::RankFile* rf = nullptr;
    for (const auto& f : point.manifest.rank_file())
      if (f.rank() == rank) rf = &f;
    if (!rf)
      throw InputError(detail::concat(point.dir, "/", kManifest, ": no file for rank ", rank));
    path_ = point.dir + "/" + rf->file();
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail(std::string("cannot open: ") + std::strerror(errno));
    FileHeader h{};
    read(&h, sizeof(h), 0);
    if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0 || h.version != kFileVersion)
      fail("not a keel checkpoint file of version " + std::to_string(kFileVersion));
    if (h.rank != uint32_t(rank) || h.step != point.step)
      fail(detail::concat("holds rank ", h.rank, " step ", h.step, ", expected rank ", rank,
                          " step ", point.step));
    if (h.layout_fingerprint != shape.fingerprint || h.payload_bytes != shape.floats() * 4)
      fail(detail::concat("layout_fingerprint = ", h.layout_fingerprint, " (", h.payload_bytes,
                          " bytes), the plugin's parameter table for this rank gives ",
                          shape.fingerprint, " (", shape.floats() * 4,
                          " bytes): another plugin or model wrote it"));
    span_base_[0] = sizeof(FileHeader);
    span_base_[1] = span_base_[0] + shape.params.padded * sizeof(float);
    span_base_[2] = span_base_[1] + shape.moment_floats * sizeof(float);
  }
  ~RankFileReader() {
    if (fd_ >= 0) ::close(fd_);
  }
  RankFileReader(const RankFileReader&) = delete;
  RankFileReader& operator=(const RankFileReader&) = delete;

  // `floats` floats at `offset` of span `span` into `out`.
  void read_span(int span, size_t offset, size_t floats, float* out) {
    read(out, floats * sizeof(float), span_base_[span] + offset * sizeof(float));
  }

 private:
  [[noreturn]] void fail(const std::string& why) const { throw InputError(path_ + ": " + why); }
  void read(void* out, size_t bytes, size_t at) {
    auto* p = static_cast<char*>(out);
    while (bytes > 0) {
      const ssize_t n = ::pread(fd_, p, bytes, off_t(at));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail(std::string("read: ") + std::strerror(errno));
      if (n == 0) fail(detail::concat("ends before byte ", at + bytes, " (truncated)"));
      p += n;
      at += size_t(n);
      bytes -= size_t(n);
    }
  }
  std::string path_;
  int fd_ = -1;
  size_t span_base_[3] = {};
};

// The source rank files a plan reads, each opened once and its header checked.
class SourceFiles {
 public:
  SourceFiles(const ResumePoint& point, const ShardedLayout& from) : point_(point), from_(from) {}
  RankFileReader& at(int rank) {
    auto it = open_.find(rank);
    if (it == open_.end())
      it = open_
               .emplace(rank, std::make_unique<RankFileReader>(point_, rank,
                                                               rank_state_shape(from_, rank)))
               .first;
    return *it->second;
  }

 private:
  const ResumePoint& point_;
  const ShardedLayout& from_;
  std::map<int, std::unique_ptr<RankFileReader>> open_;
};

bool same_stages(const config::JobConfig& a, const config::JobConfig& b) {
  return stage_layer_counts(a) == stage_layer_counts(b);
}

}  // namespace

config::JobConfig checkpoint_config(const ckpt::CheckpointManifest& m,
                                    const config::JobConfig& base) {
  config::JobConfig cfg = base;
  config::ModelConfig* model = cfg.mutable_model();
  config::ParallelConfig* par = cfg.mutable_parallel();
  par->set_tp(m.tp());
  par->set_pp(m.pp());
  par->set_dp(m.dp());
  par->set_zero1(m.zero1());
  par->clear_stage_layers();
  for (const auto& f : m.model()) {
    const std::string& n = f.name();
    const std::string& v = f.value();
    if (n == "model.num_layers") model->set_num_layers(to_int(n, v));
    if (n == "model.hidden_size") model->set_hidden_size(to_int(n, v));
    if (n == "model.num_heads") model->set_num_heads(to_int(n, v));
    if (n == "model.ffn_hidden_size") model->set_ffn_hidden_size(to_int(n, v));
    if (n == "model.seq_len") model->set_seq_len(to_int(n, v));
    if (n == "model.vocab_size") model->set_vocab_size(to_int(n, v));
    if (n == "model.padded_vocab_size") model->set_padded_vocab_size(to_int(n, v));
    if (n == "parallel.stage_layers") {
      std::string list = v;
      list.erase(std::remove_if(list.begin(), list.end(),
                                [](char c) { return c == '[' || c == ']' || c == ' '; }),
                 list.end());
      size_t at = 0;
      while (at < list.size()) {
        size_t comma = list.find(',', at);
        if (comma == std::string::npos) comma = list.size();
        par->add_stage_layers(to_int(n, list.substr(at, comma - at)));
        at = comma + 1;
      }
    }
  }
  return cfg;
}

ShardedLayout sharded_layout(const Plugin& plugin, const config::JobConfig& cfg,
                             const Topology& topo) {
  config::JobConfig c = cfg;
  c.mutable_parallel()->set_tp(topo.tp());
  c.mutable_parallel()->set_pp(topo.pp());
  c.mutable_parallel()->set_dp(topo.dp());
  const std::vector<int> stages = stage_layer_counts(c);
  if (int(stages.size()) != topo.pp())
    throw InputError(detail::concat("parallel.stage_layers has ", stages.size(),
                                    " entries for pp = ", topo.pp()));
  ShardedLayout l;
  l.tp = topo.tp();
  l.pp = topo.pp();
  l.dp = topo.dp();
  l.zero1 = c.parallel().zero1();
  const keel_model_dims dims = model_dims(c);
  for (int p = 0; p < l.pp; ++p)
    for (int t = 0; t < l.tp; ++t)
      l.tables.push_back(plugin.describe(dims, stage_of(c, {0, p, t})));
  return l;
}

void load_state(const ResumePoint& point, const Plugin& plugin, const config::JobConfig& cfg,
                const Topology& topo, int rank, TrainState& state) {
  const config::JobConfig from_cfg = checkpoint_config(point.manifest, cfg);
  const ckpt::CheckpointManifest& m = point.manifest;
  const bool z_from = m.zero1() && m.dp() > 1, z_to = cfg.parallel().zero1() && topo.dp() > 1;
  config::JobConfig to_cfg = cfg;
  to_cfg.mutable_parallel()->set_pp(topo.pp());
  if (m.tp() == topo.tp() && m.pp() == topo.pp() && m.dp() == topo.dp() && z_from == z_to &&
      same_stages(from_cfg, to_cfg)) {
    load_rank(point, rank, state);  // its own file, whole and verified
    return;
  }
  const ShardedLayout from = sharded_layout(plugin, from_cfg, Topology(m.tp(), m.pp(), m.dp()));
  const ShardedLayout to = sharded_layout(plugin, cfg, topo);
  std::vector<CopyRun> runs;
  try {
    runs = plan_reshard(from, to, rank);
  } catch (const InputError& e) {
    throw InputError(point.dir + ": " + e.what());
  }
  const RankStateShape shape = rank_state_shape(to, rank);
  KEEL_CHECK(shape.fingerprint == state.layout_fingerprint(),
             "the planned layout differs from rank ", rank, "'s state");
  SourceFiles files(point, from);
  carry_out_reshard(runs, shape, state, [&](const CopyRun& r, float* out) {
    files.at(r.src_rank).read_span(r.span, r.src_offset, r.floats, out);
  });
  state.set_step(point.step);
}

void carry_out_reshard(const std::vector<CopyRun>& runs, const RankStateShape& shape,
                       TrainState& state, const std::function<void(const CopyRun&, float*)>& read) {
  std::vector<StateSpan> spans = state.spans();
  std::vector<float> host;
  for (int span = 0; span < 3; ++span) {
    // One span at a time: the host buffer is never more than the rank's own share.
    host.assign(shape.span_floats(span), 0.0f);
    KEEL_CHECK(spans[size_t(span)].floats == host.size());
    for (const CopyRun& r : runs)
      if (r.span == span) read(r, host.data() + r.dst_offset);
    state.backend()->copy_from_host(spans[size_t(span)].data, host.data(),
                                    host.size() * sizeof(float));
  }
  state.backend()->synchronize();
}

void check_plugin_fits(const ResumePoint& point, const Plugin& plugin,
                       const config::JobConfig& base) {
  const config::JobConfig cfg = checkpoint_config(point.manifest, base);
  const ckpt::CheckpointManifest& m = point.manifest;
  const ShardedLayout from = sharded_layout(plugin, cfg, Topology(m.tp(), m.pp(), m.dp()));
  // Each file's header is checked as it opens; one open at a time, whatever the world.
  for (int rank = 0; rank < m.tp() * m.pp() * m.dp(); ++rank)
    RankFileReader(point, rank, rank_state_shape(from, rank));
}

void for_each_full_tensor(
    const ResumePoint& point, const Plugin& plugin, const config::JobConfig& base,
    const std::function<void(const keel_param_desc&, const std::vector<float>&)>& fn) {
  const config::JobConfig from_cfg = checkpoint_config(point.manifest, base);
  const ckpt::CheckpointManifest& m = point.manifest;
  const ShardedLayout from = sharded_layout(plugin, from_cfg, Topology(m.tp(), m.pp(), m.dp()));
  config::JobConfig one_cfg = from_cfg;
  one_cfg.mutable_parallel()->clear_stage_layers();
  const ShardedLayout one = sharded_layout(plugin, one_cfg, Topology(1, 1, 1));
  std::vector<CopyRun> runs;
  try {
    runs = plan_reshard(from, one, 0);
  } catch (const InputError& e) {
    throw InputError(point.dir + ": " + e.what());
  }
  SourceFiles files(point, from);
  const ParamLayout layout = lay_out_params(one.tables[0], 1, 1);
  std::vector<float> full;
  for (const ParamSlot& s : layout.slots) {
    full.assign(s.numel, 0.0f);
    // Runs are merged across slots where they continue each other: clip each to this one.
    for (const CopyRun& r : runs) {
      if (r.span != 0) continue;
      const size_t lo = std::max(r.dst_offset, s.offset);
      const size_t hi = std::min(r.dst_offset + r.floats, s.offset + s.numel);
      if (lo >= hi) continue;
      files.at(r.src_rank)
          .read_span(0, r.src_offset + (lo - r.dst_offset), hi - lo, full.data() + (lo - s.offset));
    }
    fn(s.desc, full);
  }
}

}  // namespace keel
