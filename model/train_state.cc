#include "model/train_state.h"

#include <algorithm>
#include <cstring>

#include "runtime/block_digest.h"
#include "runtime/check.h"

namespace keel {
namespace {

uint64_t fnv(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace

TrainState::TrainState(Backend* backend, std::vector<keel_param_desc> descs, int tp_rank,
                       int tp_size, int dp_size, bool zero1)
    : backend_(backend), params_(backend, std::move(descs), tp_rank, tp_size, dp_size) {
  moment_floats_ = moment_floats(params_.padded_numel(), dp_size, zero1);
  params_.allocate_moments(moment_floats_);
}

std::vector<StateSpan> TrainState::spans() {
  return {{"params", params_.params(), params_.padded_numel()},
          {"adam_m", params_.m(), moment_floats_},
          {"adam_v", params_.v(), moment_floats_}};
}

size_t TrainState::bytes() const {
  return (params_.padded_numel() + 2 * moment_floats_) * sizeof(float);
}

TrainState::Target TrainState::target(int bank) {
  auto* base = reinterpret_cast<float*>(banks_->bank(bank));
  return {bank, base, base + params_.padded_numel(),
          base + params_.padded_numel() + moment_floats_};
}

void TrainState::point_at(int bank) {
  const Target t = target(bank);
  params_.use_state_buffers(t.params, t.m, t.v);
  live_ = bank;
}

void TrainState::attach_banks(StateBanks* banks) {
  KEEL_CHECK(backend_->updates_out_of_place(), "backend ", backend_->name(),
             " cannot keep its state in snapshot banks");
  KEEL_CHECK(rewrite_from_ < 0, "attach_banks during a rewrite");
  if (banks_ && banks != banks_) detach_banks();
  banks_ = banks;
}

void TrainState::detach_banks() {
  KEEL_CHECK(rewrite_from_ < 0, "detach_banks during a rewrite");
  if (live_ >= 0) params_.own_state_buffers(moment_floats_);
  banks_ = nullptr;
  live_ = -1;
}

std::optional<TrainState::Target> TrainState::update_begin() {
  if (!banks_) return std::nullopt;
  KEEL_CHECK(rewrite_from_ < 0, "update during a rewrite");
  const int t = other_bank();
  banks_->begin_write(t);
  return target(t);
}

TrainState::Digests TrainState::digests() {
  Digests d;
  std::vector<uint64_t> all, host_hashes;
  std::vector<char> staging;
  for (const StateSpan& sp : spans()) {
    // Every span is a whole number of digest blocks (ParamStore pads them), so the spans'
    // block hashes in order are the whole state's.
    std::vector<uint64_t> h(digest_block_count(sp.bytes()));
    if (backend_->updates_out_of_place()) {
      backend_->hash_blocks(sp.data, sp.floats, h.data());
    } else {
      staging.resize(sp.bytes());
      backend_->copy_to_host(staging.data(), sp.data, sp.bytes());
      for (size_t b = 0; b < h.size(); ++b)
        h[b] = hash_block(staging.data() + b * kDigestBlockBytes,
                          std::min(kDigestBlockBytes, sp.bytes() - b * kDigestBlockBytes));
    }
    d.spans.push_back(combine_block_hashes(h.data(), h.size()));
    all.insert(all.end(), h.begin(), h.end());
  }
  d.checksum = combine_block_hashes(all.data(), all.size());
  return d;
}

int TrainState::other_bank() const {
  // Banks 0 and 1 alternate; a state adopted from a bank beyond them (the verified snapshot)
  // leaves it at its next write, so that bank keeps what it holds.
  return live_ == 0 || live_ == 1 ? 1 - live_ : banks_->free_bank();
}

void TrainState::update_commit(const Target& t, int64_t step, uint64_t checksum) {
  banks_->commit(t.bank, step, checksum);
  point_at(t.bank);
  step_ = step;
}

void TrainState::adopt_bank(int i, int64_t step) {
  KEEL_CHECK(banks_ && rewrite_from_ < 0 && i >= 0, "cannot adopt bank ", i);
  point_at(i);
  step_ = step;
}

void TrainState::rewrite_begin() {
  KEEL_CHECK(rewrite_from_ < 0, "nested state rewrite");
  if (!banks_ || live_ < 0) return;  // in place, in the state's own memory
  const int t = other_bank();
  banks_->begin_write(t);
  rewrite_from_ = live_;
  point_at(t);
}

void TrainState::rewrite_commit(std::optional<uint64_t> checksum) {
  if (rewrite_from_ < 0) return;
  if (!checksum) {
    // The bank is the spans back to back, each a whole number of digest blocks.
    const size_t floats = bytes() / sizeof(float);
    std::vector<uint64_t> hashes(digest_block_count(bytes()));
    backend_->hash_blocks(params_.params(), floats, hashes.data());
    checksum = combine_block_hashes(hashes.data(), hashes.size());
  }
  banks_->commit(live_, step_, *checksum);
  rewrite_from_ = -1;
}

void TrainState::rewrite_abort() {
  if (rewrite_from_ < 0) return;
  point_at(rewrite_from_);
  rewrite_from_ = -1;
}

uint64_t TrainState::layout_fingerprint() const {
  return keel::layout_fingerprint(params_.slots(), params_.padded_numel(), moment_floats_);
}

size_t moment_floats(size_t padded, int dp_size, bool zero1) {
  return zero1 && dp_size > 1 ? padded / size_t(dp_size) : padded;
}

uint64_t layout_fingerprint(const std::vector<ParamSlot>& slots, size_t padded,
                            size_t moment_floats) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const ParamSlot& s : slots) {
    h = fnv(h, s.name.data(), s.name.size());
    for (int64_t d : s.local_shape) h = fnv(h, &d, sizeof(d));
    h = fnv(h, &s.desc.tp_dim, sizeof(s.desc.tp_dim));
    h = fnv(h, &s.desc.flags, sizeof(s.desc.flags));
    h = fnv(h, &s.offset, sizeof(s.offset));
  }
  const size_t sizes[2] = {padded, moment_floats};
  return fnv(h, sizes, sizeof(sizes));
}

}  // namespace keel
