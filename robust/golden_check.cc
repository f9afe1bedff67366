#include "robust/golden_check.h"

#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string_view>
#include <vector>

#include "model/data_loader.h"
#include "model/token_shards.h"
#include "parallel/hash_store.h"
#include "parallel/process_groups.h"
#include "proto/config_loader.h"
#include "robust/golden_digests.h"
#include "runtime/block_digest.h"
#include "runtime/check.h"
#include "runtime/cpu/blas_core.h"
#include "runtime/rng.h"

namespace keel {
namespace {

// The mini GPT. Small enough for a few ms on one CPU thread, yet every kernel the plugin
// uses runs (two layers, attention with two heads, gradient accumulation over two
// micro-batches, weight decay, clipping). Changing anything here changes every digest: run
// scripts/regen-golden-digests.sh afterwards.
constexpr int kSteps = 3;
constexpr int kSeqLen = 16, kVocab = 64, kMicroBatch = 2, kGlobalBatch = 4;
constexpr uint64_t kSeed = 20240915;

config::JobConfig golden_config(const Plugin& plugin, const std::string& train_glob,
                                const Backend& backend, Precision precision) {
  config::JobConfig c;
  config::ModelConfig* m = c.mutable_model();
  m->set_plugin(plugin.path());
  m->set_num_layers(2);
  m->set_hidden_size(32);
  m->set_num_heads(2);
  m->set_ffn_hidden_size(128);
  m->set_seq_len(kSeqLen);
  m->set_vocab_size(kVocab);
  m->set_padded_vocab_size(kVocab);
  m->set_init_std(0.02f);
  config::ParallelConfig* p = c.mutable_parallel();
  p->set_tp(1);
  p->set_pp(1);
  p->set_dp(1);
  p->set_zero1(false);
  config::TrainConfig* t = c.mutable_train();
  t->set_micro_batch_size(kMicroBatch);
  t->set_global_batch_size(kGlobalBatch);
  t->set_steps(kSteps);
  t->set_seed(kSeed);
  t->set_eval_every(0);
  config::OptimConfig* o = c.mutable_optim();
  o->set_lr(1e-2f);
  o->set_schedule(config::OptimConfig::constant);
  o->set_warmup_steps(0);
  o->set_weight_decay(0.1f);
  o->set_grad_clip(0.5f);
  c.mutable_data()->set_train_files(train_glob);
  c.mutable_data()->set_order(config::DataConfig::sequential);
  c.mutable_checkpoint()->set_snapshot_every_step(false);
  config::RuntimeConfig* r = c.mutable_runtime();
  const bool cuda = backend.kind() == DeviceKind::kCuda;
  r->set_device(cuda ? config::RuntimeConfig::cuda : config::RuntimeConfig::cpu);
  r->set_precision(cuda && precision == Precision::kBf16 ? config::RuntimeConfig::bf16
                                                         : config::RuntimeConfig::fp32);
  r->set_threads(1);
  c.set_deterministic(true);
  fill_derived_defaults(&c);
  validate_config(c);
  return c;
}

// A private folder holding the run's one token shard, removed when the run is over (the
// DataLoader keeps the shard open, so it may go as soon as the loader exists).
class ShardDir {
 public:
  ShardDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/keel-golden-XXXXXX";
    KEEL_CHECK(::mkdtemp(tmpl.data()) != nullptr, "mkdtemp ", tmpl, ": ", std::strerror(errno));
    dir_ = tmpl;
    file_ = dir_ + "/train_000.bin";
    // Enough tokens for kSteps distinct sequential batches.
    std::vector<uint16_t> tokens(size_t(kSteps) * kGlobalBatch * kSeqLen + 1);
    const uint64_t stream = rng::stream("golden/tokens");
    for (size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = uint16_t(rng::bits(kSeed, stream, i) % uint64_t(kVocab));
    write_token_shard(file_, tokens);
  }
  ~ShardDir() {
    // Cleanup only: a failure here must not hide the check's own result.
    ::unlink(file_.c_str());
    ::rmdir(dir_.c_str());
  }
  ShardDir(const ShardDir&) = delete;
  ShardDir& operator=(const ShardDir&) = delete;
  std::string glob() const { return dir_ + "/train_*.bin"; }

 private:
  std::string dir_, file_;
};

// Trains the mini GPT and returns the digest of its parameters.
uint64_t golden_run(Backend& backend, std::shared_ptr<Plugin> plugin, const TrainerHooks& hooks,
                    Precision precision) {
  std::unique_ptr<DataLoader> data;
  config::JobConfig cfg;
  {
    ShardDir dir;
    cfg = golden_config(*plugin, dir.glob(), backend, precision);
    data = std::make_unique<DataLoader>(cfg.data().train_files(), kSeqLen,
                                        config::DataConfig::sequential, kSeed, "golden check data",
                                        kVocab);
  }
  const Topology topo(1, 1, 1);
  // Groups of one rank never touch their buffers nor open a socket, so host ones serve a
  // GPU run too (no NCCL communicator to set up for a few ms of work).
  ProcessGroupOptions go;
  go.device = DeviceKind::kCpu;
  go.timeout = Millis(10000);
  ProcessGroups groups = make_process_groups(topo, 0, std::make_shared<HashStore>(), go);
  std::unique_ptr<TrainState> state = make_train_state(cfg, &backend, *plugin, topo, 0);
  Trainer trainer(cfg, &backend, plugin, topo, 0, state.get(), &groups, data.get());
  trainer.set_hooks(hooks);
  trainer.init_params();
  for (int s = 0; s < kSteps; ++s) trainer.step();
  backend.synchronize();
  ParamStore& ps = state->params();
  std::vector<float> host(ps.padded_numel());
  backend.copy_to_host(host.data(), ps.params(), host.size() * sizeof(float));
  return block_digest(host.data(), host.size() * sizeof(float));
}

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016" PRIx64, v);
  return buf;
}

}  // namespace

std::shared_ptr<Plugin> golden_plugin() {
  // Loaded once: the SDC tie-break may ask from a rank's step thread while nothing else does,
  // and a second dlopen of the same file would give the same code anyway.
  static std::mutex mu;
  static std::shared_ptr<Plugin> plugin;
  std::lock_guard<std::mutex> lock(mu);
  if (!plugin) {
    // The copy installed with this executable, never one the working directory happens to
    // hold: the repo's digests are of the GPT this build ships.
    std::error_code ec;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    KEEL_CHECK(!ec, "golden check: cannot find the running executable: ", ec.message());
    plugin = Plugin::load((exe.parent_path() / "libkeel_gpt.so").string());
  }
  return plugin;
}

std::string golden_key(const Backend& backend, Precision precision) {
  if (backend.kind() == DeviceKind::kCpu) return "cpu fp32 " + blas_path().core;
  // "cuda:0 NVIDIA H200" → "NVIDIA H200": the card's model, not its index, decides the digest.
  std::string name = backend.name();
  if (const size_t sp = name.find(' '); sp != std::string::npos) name = name.substr(sp + 1);
  return std::string("cuda ") + (precision == Precision::kBf16 ? "bf16 " : "fp32 ") + name;
}

std::optional<uint64_t> golden_reference(const std::string& key) {
  for (const GoldenDigest& g : kGoldenDigests)
    if (key == g.key) return g.digest;
  return std::nullopt;
}

GoldenCheckResult golden_check(Backend& backend, std::shared_ptr<Plugin> plugin,
                               const TrainerHooks& hooks, std::optional<uint64_t> reference,
                               Precision precision) {
  GoldenCheckResult r;
  const std::string what = detail::concat("golden mini-GPT (", kSteps, " steps)");
  try {
    r.key = golden_key(backend, precision);
    const bool from_repo = !reference;
    if (from_repo) reference = golden_reference(r.key);
    r.digest = golden_run(backend, std::move(plugin), hooks, precision);
    r.compared = reference.has_value();
    r.ok = !r.compared || r.digest == *reference;
    const std::string whose = from_repo ? "the repo's" : "the reference";
    if (!r.compared)
      r.message = detail::concat(what, ": digest ", hex(r.digest), ", no repo digest for ", r.key,
                                 ": not compared");
    else if (r.ok)
      r.message =
          detail::concat(what, ": digest ", hex(r.digest), ", matches ", whose, " for ", r.key);
    else
      r.message = detail::concat(what, ": digest ", hex(r.digest), " differs from ", whose, " ",
                                 hex(*reference), " for ", r.key, ": this device computes wrong");
  } catch (const std::exception& e) {
    r.ok = false;
    r.compared = reference.has_value();
    r.message = detail::concat(what, " on ", r.key.empty() ? backend.name() : r.key,
                               " did not complete: ", e.what());
  }
  return r;
}

GoldenCheckResult golden_check(Backend& backend, const TrainerHooks& hooks,
                               std::optional<uint64_t> reference, Precision precision) {
  std::shared_ptr<Plugin> plugin;
  try {
    plugin = golden_plugin();
  } catch (const std::exception& e) {
    // A build without its GPT cannot vouch for any machine: a failed check, never a pass.
    GoldenCheckResult r;
    r.compared = reference.has_value();
    r.message = detail::concat("golden mini-GPT: keel's GPT plugin cannot be loaded: ", e.what());
    return r;
  }
  return golden_check(backend, std::move(plugin), hooks, reference, precision);
}

}  // namespace keel
