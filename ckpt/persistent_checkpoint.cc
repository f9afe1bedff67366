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

#include "ckpt/checkpoint_format.h"
#include "proto/store_keys.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {
namespace {

using namespace ckpt_format;
namespace fs = std::filesystem;

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
  LOG(WARNING) << "rank " << f.rank << ": " << f.message()
               << "; its temporary files are removed, the newest complete checkpoint stays";
  if (opts_.on_write_failed) opts_.on_write_failed(f);
  outcome_ = Outcome::kFailed;
}

void PersistentCheckpointer::write(int64_t step, uint64_t fingerprint) {
  if (!store_) store_ = store_factory_();
  const std::string step_dir = opts_.dir + "/" + checkpoint_dir_name(step);
  store::CheckpointPart record;  // ok stays false unless the file was written
  try {
    std::error_code ec;
    fs::create_directories(step_dir, ec);
    if (ec) throw WriteError(step_dir, "mkdir: " + ec.message());
    write_file_atomically(step_dir + "/" + rank_file_name(opts_.rank), staging_.data(),
                          staging_.size());
    const uint64_t checksum = XXH3_64bits(staging_.data(), staging_.size());
    record.set_ok(true);
    ckpt::RankFile* f = record.mutable_file();
    f->set_rank(opts_.rank);
    f->set_file(rank_file_name(opts_.rank));
    f->set_bytes(staging_.size());
    f->set_checksum(checksum);
    f->set_layout_fingerprint(fingerprint);
  } catch (const WriteError& e) {
    failed({step, opts_.rank, e.path(), e.error()});
  }
  // Published either way: rank 0 waits for every rank's record before it seals the step.
  set_message(*store_, keys::checkpoint_part_key(step, opts_.rank), record);
  if (opts_.rank != 0) return;
  Pending p{step, std::vector<std::optional<store::CheckpointPart>>(size_t(opts_.layout.world())),
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
    LOG(WARNING) << "persistent checkpoints cannot be sealed: " << e.what();
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
        if (p.records[r] || !store) continue;
        try {
          p.records[r] =
              get_message<store::CheckpointPart>(*store, keys::checkpoint_part_key(p.step, int(r)),
                                                 std::chrono::milliseconds(last_look ? 1 : 20));
        } catch (const CommTimeout&) {
        }
      }
    std::vector<int64_t> done;
    int64_t sealed = -1;
    for (const Pending& p : work) {
      std::vector<int> missing;
      for (size_t r = 1; r < p.records.size(); ++r)
        if (!p.records[r]) missing.push_back(int(r));
      if (missing.empty()) {
        if (seal(p)) sealed = p.step;
        done.push_back(p.step);
        continue;
      }
      if (last_look || std::chrono::steady_clock::now() > p.deadline) {
        std::string who;
        for (int r : missing) who += detail::concat(who.empty() ? "" : ", ", r);
        LOG(WARNING) << "persistent checkpoint of step " << p.step << " left incomplete: rank(s) "
                     << who
                     << " never wrote their part (a rank that failed while saving); the newest "
                        "complete checkpoint stays";
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
  for (const std::optional<store::CheckpointPart>& rec : p.records)
    whole = whole && rec && rec->ok();
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
    if (ec) LOG(WARNING) << "cannot remove " << step_dir << ": " << ec.message();
    return false;
  }
  prune(p.step);
  return true;
}

void PersistentCheckpointer::write_manifest(
    int64_t step, const std::vector<std::optional<store::CheckpointPart>>& parts) {
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
  if (!opts_.layout.plugin_file.empty()) m.set_plugin_file(opts_.layout.plugin_file);
  if (opts_.layout.global_batch_size > 0) m.set_global_batch_size(opts_.layout.global_batch_size);
  for (const auto& [name, value] : opts_.layout.model) {
    ckpt::ModelField* f = m.add_model();
    f->set_name(name);
    f->set_value(value);
  }
  for (int r = 0; r < world; ++r) {
    const store::CheckpointPart& part = *parts[size_t(r)];
    KEEL_CHECK(part.file().rank() == r, "rank ", r, "'s part names rank ", part.file().rank());
    *m.add_rank_file() = part.file();
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
    if (ec) LOG(WARNING) << "cannot remove " << path << ": " << ec.message();
  }
}

}  // namespace keel
