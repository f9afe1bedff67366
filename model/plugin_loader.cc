#include "model/plugin_loader.h"

#include <dlfcn.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "runtime/check.h"

namespace keel {
namespace {

// The table up to flops_per_token: what every version-3 plugin has.
constexpr size_t kBaseTableSize = offsetof(keel_plugin, hf_tensors);

std::string exe_dir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  buf[n] = '\0';
  return std::filesystem::path(buf).parent_path().string();
}

std::string resolve(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // A directory reads as an empty file and would fail in dlopen, under the name of the copy
  // that load_copy makes: said here, by the name the user gave.
  if (fs::is_directory(path, ec))
    throw InputError(detail::concat("plugin ", path,
                                    ": is a directory, expected a plugin's shared object (.so)"));
  if (fs::exists(path)) return fs::absolute(path).string();
  if (fs::path(path).is_relative()) {
    fs::path beside = fs::path(exe_dir()) / path;
    if (fs::exists(beside)) return beside.string();
    fs::path by_name = fs::path(exe_dir()) / fs::path(path).filename();
    if (fs::exists(by_name)) return by_name.string();
  }
  throw InputError(detail::concat("plugin ", path,
                                  ": file not found (looked in the working directory and in ",
                                  exe_dir(), ")"));
}

// The file's bytes, whole.
std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw InputError(detail::concat("plugin ", path, ": cannot read: ", std::strerror(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A plugin is code that every rank runs: like ssh with its keys, a file that another user
// could have written is refused before it is read, naming the file and what is wrong.
void check_trusted(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;  // read_file says why it cannot be read
  const unsigned mode = unsigned(st.st_mode) & 07777;
  if (mode & (S_IWGRP | S_IWOTH)) {
    char m[8];
    std::snprintf(m, sizeof(m), "%04o", mode);
    throw InputError(detail::concat(
        "plugin ", path, ": mode ", m, " lets ", (mode & S_IWOTH) ? "any user" : "its group",
        " write it, and a plugin is code every rank runs: chmod go-w ", path));
  }
  if (st.st_uid != ::geteuid() && st.st_uid != 0)
    throw InputError(detail::concat("plugin ", path, ": owned by uid ", st.st_uid,
                                    ", neither this job's user (uid ", ::geteuid(),
                                    ") nor root, and a plugin is code every rank runs"));
}

// SHA-256 of a plugin file, 64 hex digits: the build the controller pins before any rank
// loads it. Collision-resistant, so no other file can be made to pass for the pinned one.
std::string sha256_hex(const std::string& bytes) {
  unsigned char d[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(d, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  std::string hex(2 * sizeof(d), '0');
  for (size_t i = 0; i < sizeof(d); ++i) std::snprintf(&hex[2 * i], 3, "%02x", unsigned(d[i]));
  return hex;
}

std::string shape_text(const keel_param_desc& d) {
  std::string s = "[";
  for (int i = 0; i < d.ndim; ++i) s += detail::concat(i ? ", " : "", d.shape[i]);
  return s + "]";
}

}  // namespace

std::shared_ptr<Plugin> Plugin::load(const std::string& path) {
  std::shared_ptr<Plugin> p(new Plugin());
  p->path_ = resolve(path);
  check_trusted(p->path_);
  const std::string bytes = read_file(p->path_);
  p->hash_ = sha256_hex(bytes);
  p->open(p->path_);
  return p;
}

std::shared_ptr<Plugin> Plugin::load_copy(const std::string& path) {
  std::shared_ptr<Plugin> p(new Plugin());
  p->path_ = resolve(path);
  check_trusted(p->path_);
  const std::string bytes = read_file(p->path_);
  p->hash_ = sha256_hex(bytes);
  const char* tmp = std::getenv("TMPDIR");
  std::string file = std::string(tmp && *tmp ? tmp : "/tmp") + "/keel-plugin-XXXXXX";
  const int fd = mkstemp(file.data());
  KEEL_CHECK(fd >= 0, "mkstemp ", file, ": ", std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(file.c_str());
      throw Error(detail::concat("plugin ", p->path_, ": writing its private copy ", file, ": ",
                                 std::strerror(e)));
    }
    done += size_t(n);
  }
  KEEL_CHECK_ERRNO(::close(fd));
  // Loaded, the copy's name is not needed: the mapping keeps its pages.
  try {
    p->open(file);
  } catch (...) {
    ::unlink(file.c_str());
    throw;
  }
  KEEL_CHECK_ERRNO(::unlink(file.c_str()));
  return p;
}

void Plugin::open(const std::string& file) {
  Plugin* p = this;
  // RTLD_LOCAL so that two versions of one plugin can be loaded side by side (hot update).
  p->handle_ = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!p->handle_) {
    // dlerror names the file opened, which for load_copy is a private copy the user never saw
    // (and that is gone by the time they read it): name theirs instead.
    std::string why = dlerror();
    for (size_t at = why.find(file); file != p->path_ && at != std::string::npos;
         at = why.find(file, at + p->path_.size()))
      why.replace(at, file.size(), p->path_);
    throw InputError(detail::concat("plugin ", p->path_, ": dlopen failed: ", why));
  }
  auto entry = reinterpret_cast<keel_plugin_entry_fn>(dlsym(p->handle_, KEEL_PLUGIN_ENTRY_SYMBOL));
  if (!entry)
    throw InputError(detail::concat("plugin ", p->path_, ": missing symbol ",
                                    KEEL_PLUGIN_ENTRY_SYMBOL,
                                    " (is it built against model/plugin.h and exported?)"));
  p->table_ = entry(KEEL_PLUGIN_ABI_VERSION);
  if (!p->table_)
    throw InputError(detail::concat("plugin ", p->path_, ": ", KEEL_PLUGIN_ENTRY_SYMBOL,
                                    " returned no table for ABI version ",
                                    KEEL_PLUGIN_ABI_VERSION));
  const keel_plugin& t = *p->table_;
  if (t.abi_version != KEEL_PLUGIN_ABI_VERSION)
    throw InputError(detail::concat("plugin ", p->path_, ": abi_version is ", t.abi_version,
                                    ", this runtime needs ", KEEL_PLUGIN_ABI_VERSION));
  // The fields appended to version 3 (hf_tensors, hf_config) are optional: a plugin built
  // before them has a shorter table and still loads.
  if (t.struct_size < kBaseTableSize)
    throw InputError(detail::concat("plugin ", p->path_, ": struct_size is ", t.struct_size,
                                    ", this runtime needs at least ", kBaseTableSize));
  const std::pair<const char*, const void*> fns[] = {
      {"validate", reinterpret_cast<const void*>(t.validate)},
      {"describe_params", reinterpret_cast<const void*>(t.describe_params)},
      {"activation_floats", reinterpret_cast<const void*>(t.activation_floats)},
      {"scratch_floats", reinterpret_cast<const void*>(t.scratch_floats)},
      {"forward", reinterpret_cast<const void*>(t.forward)},
      {"backward", reinterpret_cast<const void*>(t.backward)},
      {"flops_per_token", reinterpret_cast<const void*>(t.flops_per_token)}};
  for (const auto& [name, fn] : fns)
    if (!fn)
      throw InputError(detail::concat("plugin ", p->path_, ": table field ", name, " is NULL"));
}

std::string first_param_difference(const std::vector<keel_param_desc>& running,
                                   const std::vector<keel_param_desc>& next) {
  auto name = [](const keel_param_desc& d) {
    return std::string(d.name, strnlen(d.name, KEEL_PARAM_NAME_MAX));
  };
  auto tie = [](const keel_param_desc& d) {
    return std::string(d.tied_to, strnlen(d.tied_to, KEEL_PARAM_NAME_MAX));
  };
  const size_t n = std::min(running.size(), next.size());
  for (size_t i = 0; i < n; ++i) {
    const keel_param_desc &a = running[i], &b = next[i];
    auto differ = [&](const std::string& field, const std::string& x, const std::string& y) {
      return detail::concat("parameter ", i, ": ", field, " ", x, " in the running state, ", y,
                            " in the new plugin ('", name(a), "')");
    };
    if (name(a) != name(b))
      return detail::concat("parameter ", i, ": '", name(a), "' in the running state, '", name(b),
                            "' in the new plugin");
    if (a.ndim != b.ndim || shape_text(a) != shape_text(b))
      return differ("shape", shape_text(a), shape_text(b));
    if (a.tp_dim != b.tp_dim || a.tp_blocks != b.tp_blocks)
      return differ("TP split (tp_dim, tp_blocks)",
                    detail::concat("(", a.tp_dim, ", ", a.tp_blocks, ")"),
                    detail::concat("(", b.tp_dim, ", ", b.tp_blocks, ")"));
    if (a.flags != b.flags)
      return differ("flags", std::to_string(a.flags), std::to_string(b.flags));
    if (tie(a) != tie(b))
      return differ("tied_to", detail::concat("'", tie(a), "'"), detail::concat("'", tie(b), "'"));
  }
  if (running.size() != next.size())
    return detail::concat(running.size(), " parameters in the running state, ", next.size(),
                          " in the new plugin (first extra: '",
                          name(running.size() > next.size() ? running[n] : next[n]), "')");
  return "";
}

Plugin::~Plugin() {
  if (handle_) dlclose(handle_);
}

std::vector<keel_param_desc> Plugin::describe(const keel_model_dims& dims,
                                              const keel_stage& stage) const {
  char err[512] = {0};
  if (table_->validate(&dims, &stage, err, sizeof(err)) != 0)
    throw InputError(detail::concat("plugin ", path_, " (", name(), " ", version(),
                                    ") refuses the config: ", err));
  int n = table_->describe_params(&dims, &stage, nullptr, 0);
  if (n <= 0) throw InputError(detail::concat("plugin ", path_, ": describe_params returned ", n));
  std::vector<keel_param_desc> descs(n);
  int m = table_->describe_params(&dims, &stage, descs.data(), n);
  if (m != n)
    throw InputError(detail::concat("plugin ", path_, ": describe_params returned ", n, " then ", m,
                                    " parameters for the same config"));
  check_param_descs(descs, stage, path_);
  return descs;
}

bool Plugin::has_hf() const {
  return table_->struct_size >= sizeof(keel_plugin) && table_->hf_tensors && table_->hf_config;
}

std::vector<keel_hf_tensor> Plugin::hf_tensors(const keel_model_dims& dims) const {
  if (!has_hf())
    throw InputError(detail::concat("plugin ", path_, " (", name(),
                                    ") declares no Hugging Face names (keel_plugin.hf_tensors)"));
  const int n = table_->hf_tensors(&dims, nullptr, 0);
  if (n <= 0) throw InputError(detail::concat("plugin ", path_, ": hf_tensors returned ", n));
  std::vector<keel_hf_tensor> out(static_cast<size_t>(n));
  if (table_->hf_tensors(&dims, out.data(), n) != n)
    throw InputError(detail::concat("plugin ", path_, ": hf_tensors changed its count"));
  return out;
}

std::string Plugin::hf_config(const keel_model_dims& dims) const {
  hf_tensors(dims);  // the same refusal when there is none
  const int n = table_->hf_config(&dims, nullptr, 0);
  if (n <= 0) throw InputError(detail::concat("plugin ", path_, ": hf_config returned ", n));
  std::string out(size_t(n) + 1, '\0');
  table_->hf_config(&dims, out.data(), out.size());
  out.resize(size_t(n));
  return out;
}

void check_param_descs(const std::vector<keel_param_desc>& descs, const keel_stage& stage,
                       const std::string& path) {
  std::set<std::string> names;
  for (const auto& d : descs) {
    std::string name(d.name, strnlen(d.name, KEEL_PARAM_NAME_MAX));
    auto fail = [&](const auto&... what) {
      throw InputError(detail::concat("plugin ", path, ": parameter '", name, "': ", what...));
    };
    if (name.empty() || name.size() == KEEL_PARAM_NAME_MAX) fail("name is empty or unterminated");
    if (!names.insert(name).second) fail("name is described twice");
    if (d.ndim < 1 || d.ndim > KEEL_PARAM_MAX_DIMS) fail("ndim is ", d.ndim);
    for (int i = 0; i < d.ndim; ++i)
      if (d.shape[i] < 1) fail("shape[", i, "] is ", d.shape[i]);
    if (d.tp_dim >= d.ndim || d.tp_dim < -1) fail("tp_dim is ", d.tp_dim, " for ndim ", d.ndim);
    if (d.tp_blocks < 1) fail("tp_blocks is ", d.tp_blocks);
    if (d.tp_dim >= 0 && d.shape[d.tp_dim] % (int64_t(d.tp_blocks) * stage.tp_size) != 0)
      fail("shape[", d.tp_dim, "] = ", d.shape[d.tp_dim], " does not split into ", d.tp_blocks,
           " block(s) over tp = ", stage.tp_size);
    if (d.init < KEEL_INIT_ZEROS || d.init > KEEL_INIT_NORMAL) fail("init is ", d.init);
    if (d.init == KEEL_INIT_NORMAL && !(d.init_std > 0)) fail("init_std is ", d.init_std);
    if (d.flags & ~uint32_t(KEEL_PARAM_WEIGHT_DECAY | KEEL_PARAM_TIED_COPY))
      fail("unknown flags ", d.flags);
    const size_t tie = strnlen(d.tied_to, KEEL_PARAM_NAME_MAX);
    if (tie == KEEL_PARAM_NAME_MAX) fail("tied_to is unterminated");
    if ((d.flags & KEEL_PARAM_TIED_COPY) && tie == 0)
      fail("is a tied copy (KEEL_PARAM_TIED_COPY) but names no tied_to");
    if (tie > 0 && stage.pp_size == 1)
      fail("tied_to = '", std::string(d.tied_to, tie), "' with pp = 1 (nothing to tie to)");
  }
}

}  // namespace keel
