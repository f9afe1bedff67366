#include "tests/model/gpt_test_harness.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <thread>

#include "model/ops_table.h"
#include "runtime/backend.h"
#include "runtime/check.h"
#include "runtime/rng.h"
#include "tests/test_paths.h"

namespace keel::test {

void HubComm::all_reduce(float* buf, size_t n, ReduceOp op, Millis) {
  hub_->bufs_[rank_] = buf;
  hub_->barrier_.arrive_and_wait();
  std::vector<float> out(hub_->bufs_[0], hub_->bufs_[0] + n);
  for (int r = 1; r < hub_->n_; ++r)
    for (size_t i = 0; i < n; ++i)
      out[i] =
          op == ReduceOp::kSum ? out[i] + hub_->bufs_[r][i] : std::max(out[i], hub_->bufs_[r][i]);
  // Nobody may overwrite its buffer while another rank still reads it.
  hub_->barrier_.arrive_and_wait();
  std::memcpy(buf, out.data(), n * sizeof(float));
}

void HubComm::unused(const char* what) {
  throw Error(std::string("HubComm::") + what + " is not used by the plugin tests");
}

size_t numel(const keel_param_desc& d) {
  size_t n = 1;
  for (int i = 0; i < d.ndim; ++i) n *= size_t(d.shape[i]);
  return n;
}

namespace {

// Visits the (whole index, shard index) pairs of rank r's shard, row by row.
void for_shard_rows(const keel_param_desc& d, int tp, int r,
                    const std::function<void(size_t, size_t, size_t)>& fn) {
  if (d.tp_dim < 0) {
    fn(0, 0, numel(d));
    return;
  }
  size_t outer = 1, inner = 1;
  for (int i = 0; i < d.tp_dim; ++i) outer *= size_t(d.shape[i]);
  for (int i = d.tp_dim + 1; i < d.ndim; ++i) inner *= size_t(d.shape[i]);
  const size_t n = size_t(d.shape[d.tp_dim]), blocks = size_t(d.tp_blocks);
  const size_t per_block = n / blocks, per_rank = per_block / size_t(tp);
  for (size_t o = 0; o < outer; ++o)
    for (size_t b = 0; b < blocks; ++b)
      for (size_t i = 0; i < per_rank; ++i) {
        size_t whole_row = o * n + b * per_block + size_t(r) * per_rank + i;
        size_t part_row = o * (n / size_t(tp)) + b * per_rank + i;
        fn(whole_row * inner, part_row * inner, inner);
      }
}

}  // namespace

std::vector<float> shard(const std::vector<float>& whole, const keel_param_desc& d, int tp, int r) {
  std::vector<float> part(d.tp_dim < 0 ? whole.size() : whole.size() / size_t(tp));
  for_shard_rows(d, tp, r, [&](size_t w, size_t p, size_t n) {
    std::memcpy(&part[p], &whole[w], n * sizeof(float));
  });
  return part;
}

void unshard(std::vector<float>& whole, const std::vector<float>& part, const keel_param_desc& d,
             int tp, int r) {
  for_shard_rows(d, tp, r, [&](size_t w, size_t p, size_t n) {
    std::memcpy(&whole[w], &part[p], n * sizeof(float));
  });
}

GptHarness::GptHarness(const keel_model_dims& dims, int B, int T, const std::string& plugin_file)
    : dims_(dims), B_(B), T_(T), plugin_(Plugin::load(bin_dir() + "/" + plugin_file)) {
  keel_stage one{0, 1, 0, 1, 0, dims.num_layers};
  descs_ = plugin_->describe(dims_, one);
}

Tensors GptHarness::init(uint64_t seed, bool perturb) const {
  Tensors t;
  for (const auto& d : descs_) {
    std::vector<float>& v = t[d.name];
    v.resize(numel(d));
    const uint64_t s = rng::stream(d.name), noise = rng::stream(d.name, 1);
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = d.init == KEEL_INIT_ONES     ? 1.0f
             : d.init == KEEL_INIT_NORMAL ? d.init_std * rng::normal(seed, s, i)
                                          : 0.0f;
      if (perturb) v[i] += 0.1f * rng::normal(seed, noise, i);
    }
  }
  return t;
}

std::vector<int32_t> GptHarness::tokens(uint64_t seed) const {
  std::vector<int32_t> t(size_t(B_) * T_);
  for (size_t i = 0; i < t.size(); ++i)
    t[i] = int32_t(rng::bits(seed, rng::stream("tokens"), i) % uint64_t(dims_.vocab_size));
  return t;
}

namespace {

// Filled past the end of every buffer the plugin is lent, to catch writes beyond the sizes
// it asked for.
constexpr size_t kCanary = 64;
constexpr float kCanaryValue = -12345.0f;

// One (pp, tp) coordinate: its backend, buffers, ops table and what grad_ready saw.
struct Rank {
  std::unique_ptr<Backend> be = make_cpu_backend(1);
  keel_stage stage{};
  std::vector<keel_param_desc> descs;
  std::vector<float*> params, grads;
  std::vector<std::pair<float*, size_t>> guarded;  // lent buffers and their sizes
  std::vector<void*> owned;
  keel_stage_args args{};
  std::unique_ptr<HubComm> comm;
  std::unique_ptr<OpsTable> ops;
  std::vector<int> ready;
  std::map<int, std::vector<float>> at_ready;

  ~Rank() {
    ops.reset();
    for (void* p : owned) be->free(p);
  }
  float* alloc(size_t n, bool guard = false) {
    auto* p = static_cast<float*>(be->alloc((n + kCanary) * sizeof(float)));
    owned.push_back(p);
    if (guard) {
      be->fill(p + n, kCanary, kCanaryValue);
      guarded.push_back({p, n});
    }
    return p;
  }
  std::vector<float> read(const float* p, size_t n) {
    std::vector<float> v(n);
    be->copy_to_host(v.data(), p, n * sizeof(float));
    return v;
  }
  std::vector<float> grad(int i) { return read(grads[i], numel(descs[i]) / shard_div(i)); }
  size_t shard_div(int i) const { return descs[i].tp_dim < 0 ? 1 : size_t(stage.tp_size); }
};

// Runs fn(r) for every TP rank, on threads when there are several, and rethrows the first
// failure.
void on_tp(int tp, const std::function<void(int)>& fn) {
  if (tp == 1) return fn(0);
  std::vector<std::exception_ptr> errs(tp);
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errs[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
}

void call(Rank& k, int (*fn)(const keel_model_dims*, const keel_stage*, keel_stage_args*),
          const keel_model_dims& dims, const char* what) {
  int rc = fn(&dims, &k.stage, &k.args);
  k.ops->rethrow_if_failed();
  if (rc != 0)
    throw std::runtime_error(std::string(what) + " returned " + std::to_string(rc) + " on pp " +
                             std::to_string(k.stage.pp_rank) + " tp " +
                             std::to_string(k.stage.tp_rank));
}

}  // namespace

GptRun GptHarness::run(const Tensors& params, const std::vector<int32_t>& tokens,
                       const std::vector<int32_t>& targets, int tp, int pp, bool backward,
                       float loss_scale) const {
  KEEL_CHECK(dims_.num_layers % pp == 0, "the harness splits layers evenly");
  const keel_plugin& table = plugin_->table();
  const size_t hidden = size_t(B_) * T_ * dims_.hidden_size;
  GptRun out;
  std::vector<std::unique_ptr<Hub>> hubs;
  std::vector<std::vector<std::unique_ptr<Rank>>> ranks(pp);
  for (int p = 0; p < pp; ++p) {
    hubs.push_back(std::make_unique<Hub>(tp));
    for (int r = 0; r < tp; ++r) {
      auto k = std::make_unique<Rank>();
      const int per = dims_.num_layers / pp;
      k->stage = keel_stage{r, tp, p, pp, p * per, (p + 1) * per};
      k->descs = plugin_->describe(dims_, k->stage);
      for (size_t i = 0; i < k->descs.size(); ++i) {
        std::vector<float> part = shard(params.at(k->descs[i].name), k->descs[i], tp, r);
        float* w = k->alloc(part.size());
        k->be->copy_from_host(w, part.data(), part.size() * sizeof(float));
        k->params.push_back(w);
        k->grads.push_back(k->alloc(part.size(), true));
      }
      keel_stage_args& a = k->args;
      a.params = k->params.data();
      a.grads = k->grads.data();
      a.B = B_;
      a.T = T_;
      a.tokens = reinterpret_cast<int32_t*>(k->alloc(tokens.size()));
      a.targets = reinterpret_cast<int32_t*>(k->alloc(targets.size()));
      k->be->copy_from_host(const_cast<int32_t*>(a.tokens), tokens.data(), tokens.size() * 4);
      k->be->copy_from_host(const_cast<int32_t*>(a.targets), targets.data(), targets.size() * 4);
      a.activations = k->alloc(table.activation_floats(&dims_, &k->stage, B_, T_), true);
      a.scratch = k->alloc(table.scratch_floats(&dims_, &k->stage, B_, T_), true);
      a.input = k->alloc(hidden);
      a.output = k->alloc(hidden, true);
      a.dout = k->alloc(hidden);
      a.dinput = k->alloc(hidden, true);
      a.loss_scale = loss_scale;
      if (tp > 1) k->comm = std::make_unique<HubComm>(hubs[p].get(), r);
      k->ops = std::make_unique<OpsTable>(k->be.get(), k->comm.get());
      a.ops = k->ops->ops();
      Rank* kp = k.get();
      k->ops->set_grad_ready([kp](int i) {
        kp->ready.push_back(i);
        kp->at_ready[i] = kp->grad(i);
      });
      ranks[p].push_back(std::move(k));
    }
  }
  auto problem = [&](const Rank& k, const std::string& what) {
    out.problems.push_back("pp " + std::to_string(k.stage.pp_rank) + " tp " +
                           std::to_string(k.stage.tp_rank) + ": " + what);
  };
  // Hands every TP rank of stage `to` its input (or dout) from the same TP rank of `from`.
  auto pass = [&](int from, int to, bool grad) {
    for (int r = 0; r < tp; ++r) {
      Rank& src = *ranks[from][r];
      Rank& dst = *ranks[to][r];
      std::vector<float> v = src.read(grad ? src.args.dinput : src.args.output, hidden);
      dst.be->copy_from_host(const_cast<float*>(grad ? dst.args.dout : dst.args.input), v.data(),
                             hidden * sizeof(float));
      if (v != ranks[from][0]->read(
                   grad ? ranks[from][0]->args.dinput : ranks[from][0]->args.output, hidden))
        problem(src, grad ? "dinput differs from tp rank 0's" : "output differs from tp 0's");
    }
  };

  for (int p = 0; p < pp; ++p) {
    if (p > 0) pass(p - 1, p, false);
    on_tp(tp, [&](int r) { call(*ranks[p][r], table.forward, dims_, "forward"); });
  }
  out.loss_sum = ranks[pp - 1][0]->args.loss_sum;
  for (int r = 1; r < tp; ++r)
    if (ranks[pp - 1][r]->args.loss_sum != out.loss_sum)
      problem(*ranks[pp - 1][r], "loss_sum differs from tp rank 0's");
  if (backward) {
    for (int p = pp - 1; p >= 0; --p) {
      if (p < pp - 1) pass(p + 1, p, true);
      on_tp(tp, [&](int r) { call(*ranks[p][r], table.backward, dims_, "backward"); });
    }
  }

  for (const auto& d : descs_) out.grads[d.name].assign(numel(d), 0.0f);
  for (int p = 0; p < pp; ++p)
    for (int r = 0; r < tp; ++r) {
      Rank& k = *ranks[p][r];
      for (auto [buf, n] : k.guarded)
        for (float v : k.read(buf + n, kCanary))
          if (v != kCanaryValue) {
            problem(k, "a write past the end of a lent buffer of " + std::to_string(n));
            break;
          }
      if (!backward) continue;
      for (size_t i = 1; i < k.ready.size(); ++i)
        if (k.ready[i] >= k.ready[i - 1]) problem(k, "grad_ready not in reverse order");
      for (int i = 0; i < int(k.descs.size()); ++i) {
        const keel_param_desc& d = k.descs[i];
        std::vector<float> g = k.grad(i);
        auto it = k.at_ready.find(i);
        if (it == k.at_ready.end())
          problem(k, std::string("no grad_ready for ") + d.name);
        else if (it->second != g)
          problem(k, std::string("grad_ready before the gradient of ") + d.name + " was final");
        if (d.tp_dim < 0 && r > 0 && g != ranks[p][0]->grad(i))
          problem(k, std::string("replicated gradient of ") + d.name + " differs from tp 0's");
        if (d.tp_dim < 0 && r > 0) continue;
        std::vector<float> whole(numel(d), 0.0f);
        unshard(whole, g, d, tp, r);
        std::vector<float>& acc = out.grads.at(d.name);
        // The tied copy's gradient and the embedding's are summed, as the runtime does over
        // the embedding group; the unshard left zeros outside this rank's rows.
        for (size_t j = 0; j < acc.size(); ++j) acc[j] += whole[j];
      }
    }
  return out;
}

}  // namespace keel::test
