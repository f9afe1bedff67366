#include "model/llmc_checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>

#include "runtime/check.h"

namespace keel {
namespace {

constexpr int kHeaderInts = 256;
constexpr int64_t kHeaderBytes = kHeaderInts * sizeof(int32_t);

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;

std::string errno_text() {
  return std::strerror(errno);
}

void check_ffn(const std::string& path, const keel_model_dims& d) {
  if (int64_t(d.ffn_hidden_size) != 4 * int64_t(d.hidden_size)) {
    throw InputError(detail::concat(
        path, ": llm.c checkpoints have an MLP of 4·channels = ", 4 * int64_t(d.hidden_size),
        ", config model.ffn_hidden_size = ", d.ffn_hidden_size));
  }
}

}  // namespace

int64_t LlmcTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::vector<LlmcTensor> llmc_tensor_layout(const keel_model_dims& d) {
  const int64_t C = d.hidden_size, L = d.num_layers;
  std::vector<LlmcTensor> out;
  out.push_back({"wte", {d.padded_vocab_size, C}});
  out.push_back({"wpe", {d.seq_len, C}});
  // llm.c stores each per-layer tensor for all layers contiguously ([L, ...]), in this order.
  const std::vector<LlmcTensor> per_layer = {
      {"ln1.weight", {C}},
      {"ln1.bias", {C}},
      {"attn.qkv.weight", {3 * C, C}},
      {"attn.qkv.bias", {3 * C}},
      {"attn.proj.weight", {C, C}},
      {"attn.proj.bias", {C}},
      {"ln2.weight", {C}},
      {"ln2.bias", {C}},
      {"mlp.fc.weight", {4 * C, C}},
      {"mlp.fc.bias", {4 * C}},
      {"mlp.proj.weight", {C, 4 * C}},
      {"mlp.proj.bias", {C}},
  };
  for (const auto& t : per_layer) {
    for (int64_t l = 0; l < L; ++l) out.push_back({detail::concat("h.", l, ".", t.name), t.shape});
  }
  out.push_back({"lnf.weight", {C}});
  out.push_back({"lnf.bias", {C}});
  return out;
}

LlmcHeader read_llmc_header(const std::string& path) {
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) throw InputError(detail::concat(path, ": cannot open: ", errno_text()));
  int32_t h[kHeaderInts];
  if (std::fread(h, sizeof(int32_t), kHeaderInts, f.get()) != size_t(kHeaderInts)) {
    throw InputError(detail::concat(path, ": shorter than the ", kHeaderBytes, "-byte header"));
  }
  if (h[0] != kLlmcMagic) {
    throw InputError(detail::concat(path, ": header magic = ", h[0], ", expected ", kLlmcMagic));
  }
  if (h[1] != kLlmcVersionFp32) {
    // llm.c writes version 5 for bf16 weights; keel keeps fp32 master weights.
    throw InputError(detail::concat(path, ": header version = ", h[1], ", expected ",
                                    kLlmcVersionFp32, " (fp32)", h[1] == 5 ? "; 5 is bf16" : ""));
  }
  return LlmcHeader{h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]};
}

NamedTensors read_llmc_checkpoint(const std::string& path, const keel_model_dims& expect) {
  LlmcHeader h = read_llmc_header(path);
  std::string mismatch;
  auto compare = [&](const char* header_field, int32_t got, const char* config_field,
                     int32_t want) {
    if (got != want) {
      mismatch += detail::concat(mismatch.empty() ? "" : "\n", path, ": header ", header_field,
                                 " = ", got, ", config ", config_field, " = ", want);
    }
  };
  compare("max_seq_len", h.max_seq_len, "model.seq_len", expect.seq_len);
  compare("vocab_size", h.vocab_size, "model.vocab_size", expect.vocab_size);
  compare("num_layers", h.num_layers, "model.num_layers", expect.num_layers);
  compare("num_heads", h.num_heads, "model.num_heads", expect.num_heads);
  compare("channels", h.channels, "model.hidden_size", expect.hidden_size);
  compare("padded_vocab_size", h.padded_vocab_size, "model.padded_vocab_size",
          expect.padded_vocab_size);
  if (!mismatch.empty()) throw InputError(mismatch);
  check_ffn(path, expect);

  std::vector<LlmcTensor> layout = llmc_tensor_layout(expect);
  int64_t expected_bytes = kHeaderBytes;
  for (const auto& t : layout) expected_bytes += t.numel() * int64_t(sizeof(float));
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw InputError(detail::concat(path, ": cannot stat: ", errno_text()));
  }
  if (int64_t(st.st_size) != expected_bytes) {
    throw InputError(detail::concat(path, ": file size = ", int64_t(st.st_size),
                                    " bytes, expected ", expected_bytes, " from the header"));
  }

  File f(std::fopen(path.c_str(), "rb"));
  if (!f) throw InputError(detail::concat(path, ": cannot open: ", errno_text()));
  KEEL_CHECK(std::fseek(f.get(), long(kHeaderBytes), SEEK_SET) == 0, path, ": ", errno_text());
  NamedTensors out;
  for (const auto& t : layout) {
    std::vector<float>& v = out[t.name];
    v.resize(size_t(t.numel()));
    if (std::fread(v.data(), sizeof(float), v.size(), f.get()) != v.size()) {
      // The size matched a moment ago: the file changed under us.
      throw InputError(detail::concat(path, ": short read in tensor ", t.name));
    }
    // A NaN or Inf weight poisons every loss from the first step on; refused here it names
    // the tensor, where in training it would only show as "loss nan".
    for (size_t i = 0; i < v.size(); ++i) {
      if (!std::isfinite(v[i])) {
        throw InputError(detail::concat(path, ": tensor ", t.name, " element ", i, " = ", v[i],
                                        ": weights must be finite"));
      }
    }
  }
  return out;
}

void write_llmc_checkpoint(const std::string& path, const keel_model_dims& dims,
                           const NamedTensors& tensors) {
  check_ffn(path, dims);
  std::vector<LlmcTensor> layout = llmc_tensor_layout(dims);
  std::set<std::string> known;
  for (const auto& t : layout) {
    known.insert(t.name);
    auto it = tensors.find(t.name);
    if (it == tensors.end()) {
      throw InputError(detail::concat(path, ": tensor ", t.name, " is missing"));
    }
    if (int64_t(it->second.size()) != t.numel()) {
      throw InputError(detail::concat(path, ": tensor ", t.name, " has ", it->second.size(),
                                      " elements, expected ", t.numel()));
    }
  }
  for (const auto& [name, v] : tensors) {
    if (!known.count(name)) {
      throw InputError(detail::concat(path, ": tensor ", name, " is not part of an llm.c GPT-2"));
    }
  }

  int32_t h[kHeaderInts] = {};
  h[0] = kLlmcMagic;
  h[1] = kLlmcVersionFp32;
  h[2] = dims.seq_len;
  h[3] = dims.vocab_size;
  h[4] = dims.num_layers;
  h[5] = dims.num_heads;
  h[6] = dims.hidden_size;
  h[7] = dims.padded_vocab_size;

  // The temporary lives next to the target so that rename(2) is atomic.
  std::string tmp = detail::concat(path, ".tmp.", ::getpid());
  {
    File f(std::fopen(tmp.c_str(), "wb"));
    if (!f) throw InputError(detail::concat(path, ": cannot create ", tmp, ": ", errno_text()));
    bool ok = std::fwrite(h, sizeof(int32_t), kHeaderInts, f.get()) == size_t(kHeaderInts);
    for (const auto& t : layout) {
      const std::vector<float>& v = tensors.at(t.name);
      ok = ok && std::fwrite(v.data(), sizeof(float), v.size(), f.get()) == v.size();
    }
    ok = ok && std::fflush(f.get()) == 0 && ::fsync(fileno(f.get())) == 0;
    if (!ok) {
      std::string err = errno_text();
      f.reset();
      ::unlink(tmp.c_str());
      throw InputError(detail::concat(path, ": write failed: ", err));
    }
    if (std::fclose(f.release()) != 0) {
      std::string err = errno_text();
      ::unlink(tmp.c_str());
      throw InputError(detail::concat(path, ": write failed: ", err));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string err = errno_text();
    ::unlink(tmp.c_str());
    throw InputError(detail::concat(path, ": cannot rename ", tmp, " into place: ", err));
  }
}

}  // namespace keel
