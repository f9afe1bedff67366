#include "ckpt/persistent_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/check.h"

namespace keel {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'K', 'E', 'E', 'L', 'C', 'K', 'P', 'T'};
constexpr uint32_t kFileVersion = 1;
constexpr int kFormatVersion = 1;
constexpr const char* kManifest = "manifest.pb";

// The fixed header of a rank file; the payload (the state's spans in order) follows.
struct FileHeader {
  char magic[8];
  uint32_t version;
  uint32_t rank;
  int64_t step;
  uint64_t layout_fingerprint;
  uint64_t payload_bytes;
};
static_assert(sizeof(FileHeader) == 40);

std::string rank_file_name(int rank) {
  return "rank_" + std::to_string(rank) + ".bin";
}

// Closes a file descriptor on every path out.
struct FdCloser {
  int fd = -1;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

// A file system call on a checkpoint's path that failed: what, where and why, for the
// incident (a full disk is expected here, not a bug).
class WriteError : public Error {
 public:
  WriteError(std::string path, std::string error)
      : Error(path + ": " + error), path_(std::move(path)), error_(std::move(error)) {}
  const std::string& path() const { return path_; }
  const std::string& error() const { return error_; }

 private:
  std::string path_, error_;
};

// Throws WriteError for a call that returned -1, naming the call and errno's text.
void check_io(long rc, const char* call, const std::string& path) {
  if (rc == -1) throw WriteError(path, std::string(call) + ": " + std::strerror(errno));
}

void fsync_dir(const std::string& dir) {
  FdCloser d;
  check_io(d.fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC), "open", dir);
  check_io(::fsync(d.fd), "fsync", dir);
}

// Writes `path` so that it either holds all of `data` or is left as it was: the bytes go to
// path.tmp, are fsynced, and only then renamed over path (and the rename made durable). On
// failure path.tmp is removed (a full disk must not be left fuller) and WriteError names
// `path`.
void write_file_atomically(const std::string& path, const char* data, size_t size) {
  const std::string tmp = path + ".tmp";
  try {
    FdCloser f;
    check_io(f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), "open",
             path);
    size_t done = 0;
    while (done < size) {
      ssize_t n = ::write(f.fd, data + done, size - done);
      if (n == -1 && errno == EINTR) continue;
      check_io(n, "write", path);
      done += size_t(n);
    }
    check_io(::fsync(f.fd), "fsync", path);
    int fd = f.fd;
    f.fd = -1;
    check_io(::close(fd), "close", path);
    check_io(::rename(tmp.c_str(), path.c_str()), "rename", path);
  } catch (...) {
    ::unlink(tmp.c_str());  // may not exist (open failed): nothing to check
    throw;
  }
  fsync_dir(fs::path(path).parent_path().string());
}

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

// Step directories under `dir` ("step_<digits>"), newest first.
std::vector<std::pair<int64_t, std::string>> list_steps(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> steps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind("step_", 0) != 0 || name.size() == 5 || !entry.is_directory()) continue;
    std::string digits = name.substr(5);
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    steps.emplace_back(std::stoll(digits), name);
  }
  std::sort(steps.begin(), steps.end(), std::greater<>());
  return steps;
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

std::vector<std::pair<std::string, std::string>> describe_model(const config::JobConfig& cfg) {
  const config::ModelConfig& m = cfg.model();
  std::string stages;
  for (int n : cfg.parallel().stage_layers()) {
    if (!stages.empty()) stages += ',';
    stages += std::to_string(n);
  }
  return {{"model.num_layers", std::to_string(m.num_layers())},
          {"model.hidden_size", std::to_string(m.hidden_size())},
          {"model.num_heads", std::to_string(m.num_heads())},
          {"model.ffn_hidden_size", std::to_string(m.ffn_hidden_size())},
          {"model.seq_len", std::to_string(m.seq_len())},
          {"model.vocab_size", std::to_string(m.vocab_size())},
          {"model.padded_vocab_size", std::to_string(m.padded_vocab_size())},
          {"parallel.stage_layers", "[" + stages + "]"}};
}

std::string CheckpointWriteFailure::message() const {
  return detail::concat("persistent checkpoint of step ", step, " not written: ", path, ": ",
                        error);
}

std::string checkpoint_dir_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%06" PRId64, step);
  return name;
}

PersistentCheckpointer::PersistentCheckpointer(PersistentCheckpointOptions opts,
                                               StoreFactory store_factory)
    : opts_(std::move(opts)), store_factory_(std::move(store_factory)) {
  KEEL_CHECK(opts_.rank >= 0 && opts_.rank < opts_.layout.world(), "rank ", opts_.rank,
             " outside a world of ", opts_.layout.world());
  KEEL_CHECK(store_factory_ != nullptr);
  KEEL_CHECK(!opts_.dir.empty(), "checkpoint.dir is empty");
}

PersistentCheckpointer::~PersistentCheckpointer() {
  if (writer_.joinable()) writer_.join();
  {
    std::lock_guard<std::mutex> l(seal_mu_);
    abandon_ = stop_ = true;
  }
  seal_cv_.notify_all();
  if (sealer_.joinable()) sealer_.join();
}

void PersistentCheckpointer::abandon_unsealed() {
  {
    std::lock_guard<std::mutex> l(seal_mu_);
    abandon_ = !pending_.empty();
  }
  seal_cv_.notify_all();
}

void PersistentCheckpointer::save_async(TrainState& state) {
  if (writer_.joinable()) writer_.join();
  if (opts_.rank == 0 && !sealer_.joinable()) sealer_ = std::thread([this] { seal_loop(); });

  // Stage on the caller's thread: the state changes as soon as the next step runs.
  const int64_t step = state.step();
  const uint64_t fingerprint = state.layout_fingerprint();
  FileHeader header{};
  std::memcpy(header.magic, kMagic, sizeof(kMagic));
  header.version = kFileVersion;
  header.rank = uint32_t(opts_.rank);
  header.step = step;
  header.layout_fingerprint = fingerprint;
  header.payload_bytes = state.bytes();
  staging_.resize(sizeof(header) + state.bytes());
  std::memcpy(staging_.data(), &header, sizeof(header));
  state.backend()->synchronize();
  size_t at = sizeof(header);
  for (const StateSpan& s : state.spans()) {
    state.backend()->copy_to_host(staging_.data() + at, s.data, s.bytes());
    at += s.bytes();
  }
  KEEL_CHECK(at == staging_.size(), "spans hold ", at - sizeof(header), " bytes, bytes() says ",
             state.bytes());

  outcome_ = Outcome::kInFlight;
  writer_ = std::thread([this, step, fingerprint] {
    bool ok = false;
    try {
      write(step, fingerprint);
      ok = outcome_.load() != Outcome::kFailed;
    } catch (const std::exception& e) {
      // Not the disk (that is handled in write): the store, or a bug. Still no crash of the
      // training: the step is not sealed, and the next interval tries again.
      if (outcome_.load() != Outcome::kFailed)
        failed({step, opts_.rank, opts_.dir + "/" + checkpoint_dir_name(step), e.what()});
    }
    if (ok) outcome_ = Outcome::kWritten;
  });
}

void PersistentCheckpointer::wait() {
  if (writer_.joinable()) writer_.join();
  std::unique_lock<std::mutex> l(seal_mu_);
  seal_cv_.wait(l, [&] { return pending_.empty(); });
}

PersistentCheckpointer::Outcome PersistentCheckpointer::last_outcome() const {
  return outcome_.load();
}

void PersistentCheckpointer::failed(const CheckpointWriteFailure& f) {
  failures_.fetch_add(1);
  std::fprintf(stderr,
               "keel: rank %d: %s; its temporary files are removed, the newest complete "
               "checkpoint stays\n",
               f.rank, f.message().c_str());
  if (opts_.on_write_failed) opts_.on_write_failed(f);
  outcome_ = Outcome::kFailed;
}

void PersistentCheckpointer::write(int64_t step, uint64_t fingerprint) {
  if (!store_) store_ = store_factory_();
  const std::string step_dir = opts_.dir + "/" + checkpoint_dir_name(step);
  std::string record = "failed";
  try {
    std::error_code ec;
    fs::create_directories(step_dir, ec);
    if (ec) throw WriteError(step_dir, "mkdir: " + ec.message());
    write_file_atomically(step_dir + "/" + rank_file_name(opts_.rank), staging_.data(),
                          staging_.size());
    const uint64_t checksum = XXH3_64bits(staging_.data(), staging_.size());
    record = detail::concat(staging_.size(), " ", checksum, " ", fingerprint);
  } catch (const WriteError& e) {
    failed({step, opts_.rank, e.path(), e.error()});
  }
  // Published either way: rank 0 waits for every rank's record before it seals the step.
  store_->set(detail::concat("ckpt/", step, "/", opts_.rank), record);
  if (opts_.rank != 0) return;
  Pending p{step, std::vector<std::string>(size_t(opts_.layout.world())),
            std::chrono::steady_clock::now() + opts_.wait_timeout};
  p.records[0] = record;
  {
    std::lock_guard<std::mutex> l(seal_mu_);
    pending_.push_back(std::move(p));
  }
  seal_cv_.notify_all();
}

// Rank 0's sealer: looks at every pending step's missing parts in short waits and seals
// each step that is whole. A step older than one just sealed, or past its deadline, or
// still missing a part when abandon_unsealed() was called, is given up.
void PersistentCheckpointer::seal_loop() {
  std::shared_ptr<Store> store;
  try {
    store = store_factory_();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "keel: persistent checkpoints cannot be sealed: %s\n", e.what());
  }
  std::unique_lock<std::mutex> l(seal_mu_);
  while (true) {
    if (pending_.empty()) {
      if (stop_) return;
      seal_cv_.wait(l, [&] { return stop_ || !pending_.empty(); });
      continue;
    }
    const bool last_look = abandon_;
    std::vector<Pending> work = pending_;
    l.unlock();
    // Look for every missing part (outside the lock: the writer thread enqueues meanwhile).
    for (Pending& p : work)
      for (size_t r = 1; r < p.records.size(); ++r) {
        if (!p.records[r].empty() || !store) continue;
        try {
          p.records[r] = store->get(detail::concat("ckpt/", p.step, "/", r),
                                    std::chrono::milliseconds(last_look ? 1 : 20));
        } catch (const CommTimeout&) {
        }
      }
    std::vector<int64_t> done;
    int64_t sealed = -1;
    for (const Pending& p : work) {
      std::vector<int> missing;
      for (size_t r = 1; r < p.records.size(); ++r)
        if (p.records[r].empty()) missing.push_back(int(r));
      if (missing.empty()) {
        if (seal(p)) sealed = p.step;
        done.push_back(p.step);
        continue;
      }
      if (last_look || std::chrono::steady_clock::now() > p.deadline) {
        std::string who;
        for (int r : missing) who += detail::concat(who.empty() ? "" : ", ", r);
        std::fprintf(stderr,
                     "keel: persistent checkpoint of step %lld left incomplete: rank(s) %s never "
                     "wrote their part (a rank that failed while saving); the newest complete "
                     "checkpoint stays\n",
                     static_cast<long long>(p.step), who.c_str());
        done.push_back(p.step);
      }
    }
    l.lock();
    // What was learned goes back; a step older than one now sealed is no longer worth it.
    for (Pending& p : pending_)
      for (const Pending& w : work)
        if (w.step == p.step) p.records = w.records;
    std::erase_if(pending_, [&](const Pending& p) {
      return std::find(done.begin(), done.end(), p.step) != done.end() || p.step < sealed;
    });
    if (last_look) abandon_ = false;
    seal_cv_.notify_all();
  }
}

bool PersistentCheckpointer::seal(const Pending& p) {
  const std::string step_dir = opts_.dir + "/" + checkpoint_dir_name(p.step);
  bool whole = true;
  for (const std::string& rec : p.records) whole = whole && rec != "failed";
  if (whole) {
    try {
      write_manifest(p.step, p.records);
    } catch (const WriteError& e) {
      failed({p.step, opts_.rank, e.path(), e.error()});
      whole = false;
    }
  }
  if (!whole) {
    // Every rank is done with the step (each published its record): what is left of it on
    // the disk is no checkpoint, and takes room the next one needs.
    std::error_code ec;
    if (fs::exists(step_dir, ec)) fs::remove_all(step_dir, ec);
    if (ec)
      std::fprintf(stderr, "keel: cannot remove %s: %s\n", step_dir.c_str(), ec.message().c_str());
    return false;
  }
  prune(p.step);
  return true;
}

void PersistentCheckpointer::write_manifest(int64_t step, const std::vector<std::string>& records) {
  const int world = opts_.layout.world();

  ckpt::CheckpointManifest m;
  m.set_format_version(kFormatVersion);
  m.set_step(step);
  m.set_tp(opts_.layout.tp);
  m.set_pp(opts_.layout.pp);
  m.set_dp(opts_.layout.dp);
  m.set_zero1(opts_.layout.zero1);
  m.set_plugin_name(opts_.layout.plugin_name);
  m.set_plugin_version(opts_.layout.plugin_version);
  for (const auto& [name, value] : opts_.layout.model) {
    ckpt::ModelField* f = m.add_model();
    f->set_name(name);
    f->set_value(value);
  }
  for (int r = 0; r < world; ++r) {
    const std::string& record = records[size_t(r)];
    std::istringstream in(record);
    uint64_t bytes = 0, checksum = 0, fp = 0;
    KEEL_CHECK(bool(in >> bytes >> checksum >> fp), "rank ", r, " published a bad record \"",
               record, "\"");
    ckpt::RankFile* rf = m.add_rank_file();
    rf->set_rank(r);
    rf->set_file(rank_file_name(r));
    rf->set_bytes(bytes);
    rf->set_checksum(checksum);
    rf->set_layout_fingerprint(fp);
  }
  if (!opts_.layout.lineage.empty()) m.set_lineage(opts_.layout.lineage);
  m.set_written_at(
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  std::string bytes;
  KEEL_CHECK(m.SerializeToString(&bytes));
  write_file_atomically(opts_.dir + "/" + checkpoint_dir_name(step) + "/" + kManifest, bytes.data(),
                        bytes.size());
}

void PersistentCheckpointer::prune(int64_t newest_step) {
  int complete = 0;
  for (const auto& [step, name] : list_steps(opts_.dir)) {
    const std::string path = opts_.dir + "/" + name;
    bool has_manifest = fs::exists(path + "/" + kManifest);
    bool drop = false;
    if (has_manifest) {
      // Another run's checkpoints in a shared directory are neither counted nor removed: the
      // job's own newest would otherwise make way for them.
      if (!opts_.layout.lineage.empty()) {
        ckpt::CheckpointManifest m;
        std::ifstream in(path + "/" + kManifest, std::ios::binary);
        if (!in || !m.ParseFromIstream(&in) || m.lineage() != opts_.layout.lineage) continue;
      }
      ++complete;
      drop = opts_.keep > 0 && complete > opts_.keep;
    } else {
      // Saves are serialised and rank 0 waited for every rank's file of newest_step, so an
      // older directory without a manifest is a save that failed, never one in progress.
      drop = step < newest_step;
    }
    if (!drop) continue;
    std::error_code ec;
    fs::remove_all(path, ec);
    if (ec)
      std::fprintf(stderr, "keel: cannot remove %s: %s\n", path.c_str(), ec.message().c_str());
  }
}

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
    differ("tp", std::to_string(m.tp()), std::to_string(expected.tp));
    differ("pp", std::to_string(m.pp()), std::to_string(expected.pp));
    differ("dp", std::to_string(m.dp()), std::to_string(expected.dp));
    differ("zero1", m.zero1() ? "true" : "false", expected.zero1 ? "true" : "false");
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
        std::string found = "(not recorded)";
        for (const auto& f : m.model())
          if (f.name() == field) found = f.value();
        if (found != job)
          diffs.push_back(field + " = " + found + " in the checkpoint, " + job + " in this job");
      }
    }
    if (!diffs.empty()) {
      std::string text = dir + "/" + name + ": the checkpoint's layout differs from this job's:";
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
