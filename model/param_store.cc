#include "model/param_store.h"

#include <algorithm>
#include <cstring>

#include "runtime/block_digest.h"
#include "runtime/check.h"
#include "runtime/rng.h"

namespace keel {
namespace {

struct ShardGeometry {
  size_t outer = 1, rows = 1, inner = 1;  // global tensor as [outer, rows, inner]
  size_t local_rows = 1, block_rows = 1, local_block_rows = 1;
};

ShardGeometry geometry(const keel_param_desc& d, int tp_size) {
  ShardGeometry g;
  if (d.tp_dim < 0) {
    for (int i = 0; i < d.ndim; ++i) g.rows *= size_t(d.shape[i]);
    g.local_rows = g.block_rows = g.local_block_rows = g.rows;
    return g;
  }
  for (int i = 0; i < d.tp_dim; ++i) g.outer *= size_t(d.shape[i]);
  g.rows = size_t(d.shape[d.tp_dim]);
  for (int i = d.tp_dim + 1; i < d.ndim; ++i) g.inner *= size_t(d.shape[i]);
  g.block_rows = g.rows / size_t(d.tp_blocks);
  g.local_block_rows = g.block_rows / size_t(tp_size);
  g.local_rows = g.local_block_rows * size_t(d.tp_blocks);
  return g;
}

// Calls fn(local_offset, global_offset, count) for each contiguous run of the shard.
template <typename Fn>
void for_each_run(const keel_param_desc& d, int tp_rank, int tp_size, Fn fn) {
  ShardGeometry g = geometry(d, tp_size);
  if (d.tp_dim < 0) {
    fn(size_t(0), size_t(0), g.rows);
    return;
  }
  for (size_t o = 0; o < g.outer; ++o)
    for (size_t b = 0; b < size_t(d.tp_blocks); ++b) {
      size_t local_row = b * g.local_block_rows;
      size_t global_row = b * g.block_rows + size_t(tp_rank) * g.local_block_rows;
      fn((o * g.local_rows + local_row) * g.inner, (o * g.rows + global_row) * g.inner,
         g.local_block_rows * g.inner);
    }
}

}  // namespace

size_t global_numel(const keel_param_desc& d) {
  size_t n = 1;
  for (int i = 0; i < d.ndim; ++i) n *= size_t(d.shape[i]);
  return n;
}

void shard_from_full(const keel_param_desc& d, int tp_rank, int tp_size, const float* full,
                     float* local) {
  for_each_run(d, tp_rank, tp_size, [&](size_t lo, size_t go, size_t n) {
    std::memcpy(local + lo, full + go, n * sizeof(float));
  });
}

void full_from_shard(const keel_param_desc& d, int tp_rank, int tp_size, const float* local,
                     float* full) {
  for_each_run(d, tp_rank, tp_size, [&](size_t lo, size_t go, size_t n) {
    std::memcpy(full + go, local + lo, n * sizeof(float));
  });
}

std::vector<ShardRun> shard_runs(const keel_param_desc& d, int tp_rank, int tp_size) {
  std::vector<ShardRun> runs;
  for_each_run(d, tp_rank, tp_size, [&](size_t lo, size_t go, size_t n) {
    runs.push_back({lo, go, n});
  });
  return runs;
}

ParamLayout lay_out_params(const std::vector<keel_param_desc>& descs, int tp_size, int align_to) {
  ParamLayout l;
  size_t offset = 0;
  for (const auto& d : descs) {
    ParamSlot s;
    s.desc = d;
    s.name = std::string(d.name, strnlen(d.name, KEEL_PARAM_NAME_MAX));
    s.local_shape.assign(d.shape, d.shape + d.ndim);
    if (d.tp_dim >= 0) s.local_shape[d.tp_dim] /= tp_size;
    s.numel = global_numel(d) / (d.tp_dim >= 0 ? size_t(tp_size) : 1);
    // 16-float (64-byte) alignment keeps every parameter on a cache line / vector boundary.
    s.offset = offset;
    offset += (s.numel + 15) / 16 * 16;
    l.slots.push_back(s);
  }
  // Whole 64 KiB digest blocks per ZeRO-1 shard: then the parameters, the moments and every
  // shard start on a block boundary, and the optimizer can checksum what it writes block by
  // block (runtime/block_digest.h).
  size_t unit = kDigestBlockFloats * size_t(std::max(1, align_to));
  l.padded = (offset + unit - 1) / unit * unit;
  return l;
}

ParamStore::ParamStore(Backend* backend, std::vector<keel_param_desc> descs, int tp_rank,
                       int tp_size, int align_to)
    : backend_(backend), tp_rank_(tp_rank), tp_size_(tp_size) {
  ParamLayout l = lay_out_params(descs, tp_size, align_to);
  slots_ = std::move(l.slots);
  padded_ = l.padded;
  params_ = static_cast<float*>(backend_->alloc(padded_ * sizeof(float)));
  grads_ = static_cast<float*>(backend_->alloc(padded_ * sizeof(float)));
}

ParamStore::~ParamStore() {
  backend_->free(grads_);
  if (owns_state_)
    for (float* p : {params_, m_, v_}) backend_->free(p);
}

void ParamStore::use_state_buffers(float* params, float* m, float* v) {
  if (owns_state_)
    for (float* p : {params_, m_, v_}) backend_->free(p);
  owns_state_ = false;
  params_ = params;
  m_ = m;
  v_ = v;
}

void ParamStore::own_state_buffers(size_t moment_numel) {
  if (owns_state_) return;
  auto* p = static_cast<float*>(backend_->alloc(padded_ * sizeof(float)));
  auto* m = static_cast<float*>(backend_->alloc(moment_numel * sizeof(float)));
  auto* v = static_cast<float*>(backend_->alloc(moment_numel * sizeof(float)));
  backend_->copy(p, params_, padded_ * sizeof(float));
  backend_->copy(m, m_, moment_numel * sizeof(float));
  backend_->copy(v, v_, moment_numel * sizeof(float));
  params_ = p;
  m_ = m;
  v_ = v;
  owns_state_ = true;
}

void ParamStore::allocate_moments(size_t numel) {
  if (numel == 0) numel = padded_;
  backend_->free(m_);
  backend_->free(v_);
  m_ = static_cast<float*>(backend_->alloc(numel * sizeof(float)));
  v_ = static_cast<float*>(backend_->alloc(numel * sizeof(float)));
}

int64_t ParamStore::local_count() const {
  int64_t n = 0;
  for (const auto& s : slots_)
    if (!s.tied_copy()) n += int64_t(s.numel);
  return n;
}

void ParamStore::zero_grads() {
  backend_->fill(grads_, padded_, 0.0f);
}

void ParamStore::init(uint64_t seed) {
  std::vector<float> host;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const ParamSlot& s = slots_[i];
    host.assign(s.numel, 0.0f);
    switch (s.desc.init) {
      case KEEL_INIT_ZEROS:
        break;
      case KEEL_INIT_ONES:
        std::fill(host.begin(), host.end(), 1.0f);
        break;
      case KEEL_INIT_NORMAL: {
        const uint64_t stream = rng::stream("init/" + s.name);
        const float std = s.desc.init_std;
        for_each_run(s.desc, tp_rank_, tp_size_, [&](size_t lo, size_t go, size_t n) {
          for (size_t k = 0; k < n; ++k) host[lo + k] = std * rng::normal(seed, stream, go + k);
        });
        break;
      }
    }
    backend_->copy_from_host(param(int(i)), host.data(), s.numel * sizeof(float));
  }
}

void ParamStore::load_full(const NamedTensors& full, const std::string& source) {
  std::vector<float> host;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const ParamSlot& s = slots_[i];
    auto it = full.find(s.name);
    if (it == full.end())
      throw InputError(detail::concat(source, ": has no tensor for parameter '", s.name, "'"));
    if (it->second.size() != global_numel(s.desc))
      throw InputError(detail::concat(source, ": tensor '", s.name, "' has ", it->second.size(),
                                      " elements, the model needs ", global_numel(s.desc)));
    host.assign(s.numel, 0.0f);
    shard_from_full(s.desc, tp_rank_, tp_size_, it->second.data(), host.data());
    backend_->copy_from_host(param(int(i)), host.data(), s.numel * sizeof(float));
  }
}

std::vector<std::vector<float>> ParamStore::local_to_host() {
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < slots_.size(); ++i) {
    out.emplace_back(slots_[i].numel);
    backend_->copy_to_host(out.back().data(), param(int(i)), slots_[i].numel * sizeof(float));
  }
  return out;
}

}  // namespace keel
