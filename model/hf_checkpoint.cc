#include "model/hf_checkpoint.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "model/param_store.h"
#include "runtime/check.h"

namespace keel {
namespace {

namespace fs = std::filesystem;
constexpr const char* kTensors = "model.safetensors";
constexpr const char* kConfig = "config.json";

std::string cstr(const char* s, size_t max) {
  return std::string(s, strnlen(s, max));
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// One Hugging Face tensor: rows [row_begin, row_end) of keel parameter `param`, seen as a
// [rows, cols] block, stored as `shape`.
struct Entry {
  keel_hf_tensor t{};
  std::string name, param_name;
  size_t param = 0;
  int64_t rows = 0, cols = 0;
  std::vector<int64_t> shape;
  size_t numel() const { return size_t(rows * cols); }
  // The block row that HF row r holds (the rotary reorder of q and k).
  int64_t src_row(int64_t r) const {
    if (!(t.flags & KEEL_HF_ROPE_HALVES)) return r;
    const int64_t hr = t.head_rows, h = r / hr, j = r % hr, half = hr / 2;
    return h * hr + (j < half ? 2 * j : 2 * (j - half) + 1);
  }
};

// The plugin's entries ordered by `params`, each checked against its parameter; every row of
// every parameter covered once, but for padded vocabulary rows.
std::vector<Entry> plan(const Plugin& plugin, const keel_model_dims& dims,
                        const std::vector<keel_param_desc>& params) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < params.size(); ++i) index[cstr(params[i].name, KEEL_PARAM_NAME_MAX)] = i;
  std::vector<std::vector<Entry>> by_param(params.size());
  const std::string who = "plugin " + plugin.path() + ": hf_tensors: ";
  for (const keel_hf_tensor& t : plugin.hf_tensors(dims)) {
    Entry e;
    e.t = t;
    e.name = cstr(t.name, KEEL_HF_NAME_MAX);
    e.param_name = cstr(t.param, KEEL_PARAM_NAME_MAX);
    auto it = index.find(e.param_name);
    if (it == index.end())
      throw InputError(who + "'" + e.name + "' names parameter '" + e.param_name +
                       "', which the model does not have");
    e.param = it->second;
    const keel_param_desc& d = params[e.param];
    e.rows = t.row_end - t.row_begin;
    e.cols = 1;
    for (int i = 1; i < d.ndim; ++i) e.cols *= d.shape[i];
    const bool rope = t.flags & KEEL_HF_ROPE_HALVES;
    if (t.row_begin < 0 || e.rows <= 0 || t.row_end > d.shape[0] ||
        (rope && (t.head_rows <= 0 || t.head_rows % 2 || e.rows % t.head_rows)) ||
        ((t.flags & KEEL_HF_TRANSPOSE) && d.ndim != 2))
      throw InputError(detail::concat(who, "'", e.name, "': rows [", t.row_begin, ", ", t.row_end,
                                      ") of '", e.param_name, "' do not fit its shape or flags"));
    if (t.flags & KEEL_HF_TRANSPOSE) {
      e.shape = {e.cols, e.rows};
    } else {
      e.shape = {e.rows};
      for (int i = 1; i < d.ndim; ++i) e.shape.push_back(d.shape[i]);
    }
    by_param[e.param].push_back(std::move(e));
  }
  std::vector<Entry> out;
  for (size_t p = 0; p < params.size(); ++p) {
    auto& es = by_param[p];
    std::sort(es.begin(), es.end(),
              [](const Entry& a, const Entry& b) { return a.t.row_begin < b.t.row_begin; });
    int64_t covered = 0;
    const std::string name = cstr(params[p].name, KEEL_PARAM_NAME_MAX);
    for (const Entry& e : es) {
      if (e.t.row_begin != covered)
        throw InputError(detail::concat(who, "rows [", covered, ", ", e.t.row_begin, ") of '", name,
                                        "' are in no tensor, or in two"));
      covered = e.t.row_end;
    }
    const bool padded_vocab = params[p].shape[0] == dims.padded_vocab_size;
    if (covered != params[p].shape[0] && !(padded_vocab && covered == dims.vocab_size))
      throw InputError(detail::concat(who, "rows [", covered, ", ", params[p].shape[0], ") of '",
                                      name, "' are in no tensor"));
    for (Entry& e : es) out.push_back(std::move(e));
  }
  return out;
}

std::vector<float> to_hf(const Entry& e, const std::vector<float>& full) {
  std::vector<float> out(e.numel());
  const bool tr = e.t.flags & KEEL_HF_TRANSPOSE;
  for (int64_t r = 0; r < e.rows; ++r) {
    const float* src = full.data() + (e.t.row_begin + e.src_row(r)) * e.cols;
    for (int64_t c = 0; c < e.cols; ++c) out[size_t(tr ? c * e.rows + r : r * e.cols + c)] = src[c];
  }
  return out;
}

void from_hf(const Entry& e, const std::vector<float>& in, std::vector<float>* full) {
  const bool tr = e.t.flags & KEEL_HF_TRANSPOSE;
  for (int64_t r = 0; r < e.rows; ++r) {
    float* dst = full->data() + (e.t.row_begin + e.src_row(r)) * e.cols;
    for (int64_t c = 0; c < e.cols; ++c) dst[c] = in[size_t(tr ? c * e.rows + r : r * e.cols + c)];
  }
}

void write_all(std::FILE* f, const void* data, size_t bytes, const std::string& path) {
  if (bytes && std::fwrite(data, 1, bytes, f) != bytes)
    throw Error(path + ": write: " + std::strerror(errno));
}

google::protobuf::Struct parse_json(const std::string& text, const std::string& what) {
  google::protobuf::Struct s;
  if (!google::protobuf::util::JsonStringToMessage(text, &s).ok())
    throw InputError(what + ": not a JSON object");
  return s;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp(float(man), -24);
  } else if (exp == 31) {
    f = man ? NAN : INFINITY;
  } else {
    f = std::ldexp(float(man | 0x400), int(exp) - 25);
  }
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits |= sign;
  std::memcpy(&f, &bits, 4);
  return f;
}

// A config.json value as the file writes it: 1e-05, "gelu_new", true, null.
std::string json_text(const google::protobuf::Value& v) {
  switch (v.kind_case()) {
    case google::protobuf::Value::kNumberValue:
      return detail::concat(v.number_value());
    case google::protobuf::Value::kStringValue:
      return "\"" + v.string_value() + "\"";
    case google::protobuf::Value::kBoolValue:
      return v.bool_value() ? "true" : "false";
    case google::protobuf::Value::kNullValue:
      return "null";
    default: {
      std::string out;
      (void)google::protobuf::util::MessageToJsonString(v, &out);
      return out;
    }
  }
}

// Fields of the plugin's config.json that describe the file, not the model: torch_dtype (F16
// and BF16 tensors are read and widened) and architectures (the head class a loader makes).
bool describes_the_file(const std::string& key) {
  return key == "torch_dtype" || key == "architectures";
}

// config.json against the one the plugin writes for the job's dims: every field the plugin
// writes that shapes the model or what it computes (sizes, activation, norm epsilon, tied
// embeddings, biases, ...) must agree where the file gives it, so that a file of another model
// is refused by the field, not by a tensor, or worse, loaded into a model that computes
// something else. A field the file leaves out takes Hugging Face's default, which for the
// fields the plugins write is the value they write.
void check_config(const std::string& path, const std::string& expected) {
  std::ifstream in(path);
  if (!in) return;  // a safetensors file alone: the tensors' shapes still decide
  std::stringstream text;
  text << in.rdbuf();
  const auto have = parse_json(text.str(), path);
  const auto want = parse_json(expected, "the plugin's hf_config");
  // In the order the plugin writes them, so that the first field that differs is named.
  std::vector<std::pair<size_t, std::string>> keys;
  for (const auto& kv : want.fields())
    keys.emplace_back(expected.find("\"" + kv.first + "\""), kv.first);
  std::sort(keys.begin(), keys.end());
  for (const auto& [pos, key] : keys) {
    const auto& v = want.fields().at(key);
    auto it = have.fields().find(key);
    if (it == have.fields().end()) continue;
    const auto& h = it->second;
    if (describes_the_file(key)) continue;
    if (v.has_number_value() && h.has_null_value()) continue;  // e.g. n_inner: null, the default
    if (key == "model_type" && h.string_value() != v.string_value())
      throw InputError(path + ": model_type = \"" + h.string_value() +
                       "\", this job's plugin is \"" + v.string_value() + "\"");
    const bool same = v.kind_case() == h.kind_case() &&
                      (v.has_number_value() ? v.number_value() == h.number_value()
                                            : json_text(v) == json_text(h));
    if (!same)
      throw InputError(path + ": " + key + " = " + json_text(h) + ", this job's model has " +
                       json_text(v));
  }
}

}  // namespace

bool is_hf_checkpoint(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(fs::path(path) / kTensors, ec);
}

void refuse_directory_without_weights(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec) || is_hf_checkpoint(path)) return;
  const std::string what = "model.init_checkpoint = " + path + ": ";
  // A keel checkpoint by its files (ckpt/persistent_checkpoint.h): a step's manifest.pb, or
  // checkpoint.dir's step_NNNNNN directories. Its state (moments, step) is a resume's.
  bool keel = fs::exists(fs::path(path) / "manifest.pb", ec);
  for (const auto& e : fs::directory_iterator(path, ec))
    keel = keel || (e.is_directory(ec) && e.path().filename().string().rfind("step_", 0) == 0);
  if (keel)
    throw InputError(what + "is a keel checkpoint; a job goes on from one with --resume " + path +
                     " (model.init_checkpoint takes a Hugging Face directory or an llm.c file)");
  throw InputError(what + "a directory without " + kTensors +
                   " (model.init_checkpoint takes a Hugging Face directory, model.safetensors + "
                   "config.json, or an llm.c .bin file)");
}

HfExport::HfExport(std::string dir, const Plugin& plugin, const keel_model_dims& dims,
                   std::vector<keel_param_desc> params)
    : dir_(std::move(dir)), config_(plugin.hf_config(dims)), params_(std::move(params)) {
  std::vector<Entry> entries = plan(plugin, dims, params_);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw InputError(dir_ + ": cannot create: " + ec.message());
  // The header first: every tensor's offsets follow from the shapes alone.
  std::string json = "{\"__metadata__\":{\"format\":\"pt\"}";
  size_t at = 0;
  for (const Entry& e : entries) {
    json += ",\"" + e.name + "\":{\"dtype\":\"F32\",\"shape\":[";
    for (size_t i = 0; i < e.shape.size(); ++i) {
      if (i) json += ',';
      json += std::to_string(e.shape[i]);
    }
    json += detail::concat("],\"data_offsets\":[", at, ",", at + e.numel() * 4, "]}");
    at += e.numel() * 4;
    tensors_.push_back(e.t);
  }
  json += "}";
  json.append((8 - json.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  const std::string tmp = dir_ + "/" + kTensors + ".tmp";
  out_ = std::fopen(tmp.c_str(), "wb");
  if (!out_) throw InputError(tmp + ": cannot create: " + std::strerror(errno));
  const uint64_t n = json.size();  // little-endian on every machine keel runs on
  write_all(out_, &n, 8, tmp);
  write_all(out_, json.data(), json.size(), tmp);
}

HfExport::~HfExport() {
  if (out_) {
    std::fclose(out_);
    fs::remove(dir_ + "/" + kTensors + ".tmp");
  }
}

void HfExport::add(const keel_param_desc& d, const std::vector<float>& full) {
  KEEL_CHECK(
      next_ < params_.size() && std::strncmp(d.name, params_[next_].name, KEEL_PARAM_NAME_MAX) == 0,
      "HfExport::add: '", d.name, "' out of order");
  const std::string tmp = dir_ + "/" + kTensors + ".tmp";
  for (const keel_hf_tensor& t : tensors_) {
    if (std::strncmp(t.param, d.name, KEEL_PARAM_NAME_MAX) != 0) continue;
    Entry e;
    e.t = t;
    e.rows = t.row_end - t.row_begin;
    e.cols = int64_t(full.size()) / d.shape[0];
    const std::vector<float> data = to_hf(e, full);
    write_all(out_, data.data(), data.size() * sizeof(float), tmp);
  }
  ++next_;
}

void HfExport::finish() {
  KEEL_CHECK(next_ == params_.size(), "HfExport: ", params_.size() - next_, " tensors missing");
  const std::string tmp = dir_ + "/" + kTensors + ".tmp";
  std::FILE* f = out_;
  out_ = nullptr;
  if (std::fflush(f) != 0 || ::fsync(fileno(f)) != 0) {
    std::fclose(f);
    throw Error(tmp + ": " + std::strerror(errno));
  }
  std::fclose(f);
  fs::rename(tmp, dir_ + "/" + kTensors);
  std::ofstream config(dir_ + "/" + kConfig);
  if (!(config << config_).flush())
    throw Error(dir_ + "/" + kConfig + ": write: " + std::strerror(errno));
}

NamedTensors read_hf_checkpoint(const std::string& dir, const Plugin& plugin,
                                const keel_model_dims& dims,
                                const std::vector<keel_param_desc>& params) {
  const std::vector<Entry> entries = plan(plugin, dims, params);
  check_config(dir + "/" + kConfig, plugin.hf_config(dims));
  const std::string path = dir + "/" + kTensors;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open: " + std::strerror(errno));
  in.seekg(0, std::ios::end);
  const uint64_t file_size = uint64_t(in.tellg());
  in.seekg(0);
  uint64_t n = 0;
  if (!in.read(reinterpret_cast<char*>(&n), 8) || n > file_size - 8)
    throw InputError(path + ": not a safetensors file (its header length does not fit)");
  std::string json(n, '\0');
  in.read(json.data(), std::streamsize(n));
  const auto header = parse_json(json, path + " header");
  const uint64_t data_at = 8 + n;

  NamedTensors out;
  for (const keel_param_desc& d : params)
    out[cstr(d.name, KEEL_PARAM_NAME_MAX)].assign(global_numel(d), 0.0f);
  for (const Entry& e : entries) {
    auto it = header.fields().find(e.name);
    if (it == header.fields().end()) {
      const size_t dot = e.name.find('.');
      if (dot != std::string::npos) it = header.fields().find(e.name.substr(dot + 1));
    }
    const std::string what = "tensor '" + e.name + "'";
    const std::string needs = " (for " + e.param_name + ")";
    if (it == header.fields().end() || !it->second.has_struct_value())
      throw InputError(path + ": has no " + what + needs);
    const auto& f = it->second.struct_value().fields();
    std::vector<int64_t> shape;
    if (f.count("shape"))
      for (const auto& v : f.at("shape").list_value().values())
        shape.push_back(int64_t(v.number_value()));
    if (shape != e.shape)
      throw InputError(path + ": " + what + " has shape " + shape_text(shape) +
                       ", this model needs " + shape_text(e.shape) + needs);
    const std::string dtype = f.count("dtype") ? f.at("dtype").string_value() : "";
    const size_t width = dtype == "F32" ? 4 : dtype == "F16" || dtype == "BF16" ? 2 : 0;
    if (!width)
      throw InputError(path + ": " + what + " has dtype " + dtype + " (F32, F16 or BF16 read)");
    uint64_t b = 0, end = 0;
    if (f.count("data_offsets") && f.at("data_offsets").list_value().values_size() == 2) {
      b = uint64_t(f.at("data_offsets").list_value().values(0).number_value());
      end = uint64_t(f.at("data_offsets").list_value().values(1).number_value());
    }
    if (end - b != e.numel() * width || data_at + end > file_size)
      throw InputError(path + ": " + what + ": data_offsets do not fit its shape or the file");
    std::vector<char> raw(end - b);
    in.seekg(std::streamoff(data_at + b));
    if (!in.read(raw.data(), std::streamsize(raw.size())))
      throw InputError(path + ": " + what + ": cannot read its bytes");
    std::vector<float> hf(e.numel());
    for (size_t i = 0; i < hf.size(); ++i) {
      if (width == 4) {
        std::memcpy(&hf[i], raw.data() + 4 * i, 4);
        continue;
      }
      uint16_t h;
      std::memcpy(&h, raw.data() + 2 * i, 2);
      if (dtype == "BF16") {
        const uint32_t bits = uint32_t(h) << 16;
        std::memcpy(&hf[i], &bits, 4);
      } else {
        hf[i] = half_to_float(h);
      }
    }
    from_hf(e, hf, &out.at(e.param_name));
  }
  return out;
}

}  // namespace keel
