// Persistent checkpoints: every N steps each rank writes its TrainState to disk in the
// background, and rank 0 seals the step with a manifest, for restarts of the whole job
// (keel-worker --resume DIR). On disk:
//   DIR/step_000040/rank_<r>.bin   a 40-byte header (magic, version, rank, step, layout
//                                  fingerprint, payload bytes) + the state's spans in order
//   DIR/step_000040/manifest.pb    keel.ckpt.CheckpointManifest (proto/checkpoint.proto),
//                                  binary: layout, step, plugin, per-file size and XXH3-64
// Every file is written as <name>.tmp, fsynced and renamed, and the manifest is written last,
// after every rank has published its file's checksum in the store, so a half-written
// checkpoint is never taken for a whole one: a directory without a manifest is incomplete.
// A write that fails (a full disk, an I/O error) is no error of the training: the rank
// removes its temporary file, publishes "failed" instead of a checksum (rank 0 then removes
// the step's directory instead of sealing it) and reports the failure when it happens.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "model/train_state.h"
#include "parallel/store.h"
#include "proto/checkpoint.pb.h"
#include "proto/config.pb.h"
#include "proto/store_values.pb.h"

namespace keel {

// What must match between a checkpoint and the job resuming from it.
struct CheckpointLayout {
  int tp = 1, pp = 1, dp = 1;
  bool zero1 = false;
  std::string plugin_name{};
  std::string plugin_version{};
  std::string plugin_file{};  // the plugin's path, recorded for keel-ckpt; never compared
  // Written into each manifest; when looking for a checkpoint, only those of this lineage
  // count (others are skipped and said so). Empty: none written, every one counts (a user's
  // --resume names the checkpoint to take).
  std::string lineage{};
  // The configuration that shapes the state, as name/value pairs (describe_model below).
  // Empty: not compared (and an old manifest without it is not either).
  std::vector<std::pair<std::string, std::string>> model{};
  // train.global_batch_size, recorded in each manifest; never compared (check_resume warns).
  int64_t global_batch_size = 0;
  int world() const { return tp * pp * dp; }
};

// The fields of `cfg` that decide the state's layout besides tp/pp/dp/zero1, by their
// configuration names: model.num_layers, model.hidden_size, model.num_heads,
// model.ffn_hidden_size, model.seq_len, model.vocab_size, model.padded_vocab_size,
// parallel.stage_layers. Kept in each manifest so that a resume with another model names
// the field that differs.
std::vector<std::pair<std::string, std::string>> describe_model(const config::JobConfig& cfg);

// A persistent checkpoint this rank could not write.
struct CheckpointWriteFailure {
  int64_t step = 0;  // the checkpoint's step (steps completed when it was saved)
  int rank = 0;
  std::string path;   // what could not be written, e.g. DIR/step_000010/rank_1.bin
  std::string error;  // why, e.g. "write: No space left on device"
  // "persistent checkpoint of step 10 not written: DIR/step_000010/rank_1.bin: write: No
  // space left on device"
  std::string message() const;
};

struct PersistentCheckpointOptions {
  std::string dir{};  // checkpoint.dir
  int rank = 0;       // global rank; rank 0 writes the manifest and prunes
  CheckpointLayout layout;
  int keep = 3;  // complete checkpoints kept; older ones are deleted (0: keep all)
  // How long rank 0 waits for the other ranks' files before giving the step up.
  std::chrono::milliseconds wait_timeout{std::chrono::minutes(10)};
  // Called on a background thread, once per save of this rank that failed, as soon as its
  // temporary file is removed (the failure is also printed to stderr). Must not throw.
  std::function<void(const CheckpointWriteFailure&)> on_write_failed{};
};

// Writes this rank's checkpoints. Not thread-safe: call from the training thread.
class PersistentCheckpointer {
 public:
  // Makes the store client the background thread uses (keys "ckpt/<step>/<rank>"). A
  // factory, because the thread blocks in store waits and a shared client (TcpStore
  // serialises calls on one connection) would hold up its other users meanwhile. Called
  // once, on the background thread, at the first save.
  using StoreFactory = std::function<std::shared_ptr<Store>()>;

  PersistentCheckpointer(PersistentCheckpointOptions opts, StoreFactory store_factory);
  ~PersistentCheckpointer();  // waits for the write in flight; never throws
  PersistentCheckpointer(const PersistentCheckpointer&) = delete;
  PersistentCheckpointer& operator=(const PersistentCheckpointer&) = delete;

  // Waits for the previous save's write, copies `state` to a host staging buffer (the only
  // part on the caller's time besides that wait) and starts writing it in the background.
  // A write that fails throws nothing here: it goes to on_write_failed and stderr.
  // Rank 0 seals a step (its manifest) on a thread of its own once every rank published its
  // part, never on the caller's: a rank that died while saving never publishes, and must not
  // hold the training up. A step still unsealed when a newer one is sealed, or after
  // wait_timeout, is given up: incomplete (a resume skips it, saying so).
  void save_async(TrainState& state);

  // Rank 0: every step still waiting for parts is looked at once more and, where a part is
  // still missing, given up. For when every rank that lives has published its part (the
  // job's end, after a barrier; a change of layout). Returns at once.
  void abandon_unsealed();

  // Waits for this rank's write in flight and, on rank 0, for every pending seal to be done
  // or given up. Never throws for a failed write (see save_async).
  void wait();

  // What became of the newest save, without waiting: none started, still being written,
  // written (this rank's part), or failed.
  enum class Outcome { kNone, kInFlight, kWritten, kFailed };
  Outcome last_outcome() const;
  // This rank's failed saves so far.
  int failures() const { return failures_.load(); }

 private:
  void write(int64_t step, uint64_t fingerprint);
  void write_manifest(int64_t step, const std::vector<std::optional<store::CheckpointPart>>& parts);
  void prune(int64_t newest_step);
  void failed(const CheckpointWriteFailure& f);

  PersistentCheckpointOptions opts_;
  StoreFactory store_factory_;
  std::shared_ptr<Store> store_;  // made and used by the writer thread only
  std::vector<char> staging_;     // header + payload of the save in flight
  std::thread writer_;
  std::atomic<Outcome> outcome_{Outcome::kNone};  // of the newest save
  // Rank 0's seals: steps whose own part is written, waiting for the others'.
  struct Pending {
    int64_t step;
    std::vector<std::optional<store::CheckpointPart>> records;  // by rank; none while missing
    std::chrono::steady_clock::time_point deadline;
  };
  void seal_loop();
  bool seal(const Pending& p);  // true: a complete checkpoint now
  std::mutex seal_mu_;
  std::condition_variable seal_cv_;
  std::vector<Pending> pending_;  // ascending steps
  bool abandon_ = false, stop_ = false;
  std::thread sealer_;
  std::atomic<int> failures_{0};
};

// The checkpoint a job resumes from.
struct ResumePoint {
  std::string dir;  // the step directory, e.g. DIR/step_000040
  int64_t step = 0;
  ckpt::CheckpointManifest manifest;
};

// The newest step directory under `dir` whose manifest exists and parses and whose every
// rank file has the manifest's size and checksum (all are read and verified). Each newer
// directory passed over adds a line to `skipped` (if given) naming it and why, e.g.
//   step_000050: no manifest (incomplete)
//   step_000040/rank_3.bin: checksum mismatch
// Throws keel::InputError naming `dir` when no checkpoint is usable, or when the newest
// usable one has another model or plugin than `expected` (naming each field that differs
// and both values, e.g. "model.hidden_size = 128 in the checkpoint, 64 in this job").
// Another layout (tp, pp, dp, zero1, stage layers) is no refusal: load_state
// (ckpt/checkpoint_reshard.h) reshards it.
ResumePoint find_resume_point(const std::string& dir, const CheckpointLayout& expected,
                              std::vector<std::string>* skipped = nullptr);

// What a job resuming `point` on the user's word (--resume) with config `cfg` must hear before
// it trains. Throws InputError when the checkpoint's step is past train.steps (nothing is left
// to train: "checkpoint step 300 is past train.steps = 100 ..."); a step equal to it loads
// and trains nothing. Returns a warning ("" if none) when train.global_batch_size differs from
// the one that wrote the checkpoint: the data position of a step is step times the batch, so
// the run goes on from other data than the one it continues.
std::string check_resume(const ResumePoint& point, const config::JobConfig& cfg);

// Reads `rank`'s file of `point` into `state` and sets state.step(). Throws keel::InputError
// if the file does not match the manifest or the state's layout (nothing is changed then).
// Only for a state of the checkpoint's own layout; load_state reads any.
void load_rank(const ResumePoint& point, int rank, TrainState& state);

// One step directory as keel-ckpt inspect shows it: its manifest where it parses, and why
// it is unusable ("" when every file verifies against the manifest).
struct CheckpointStep {
  int64_t step = 0;
  std::string dir;  // e.g. DIR/step_000040
  std::string problem;
  ckpt::CheckpointManifest manifest;
};
// Every step directory under `dir`, newest first, each verified (every file read).
std::vector<CheckpointStep> list_checkpoints(const std::string& dir);

// `path` as a checkpoint to read whole (keel-ckpt export): one step's directory, or
// checkpoint.dir for its newest step with a manifest. Unlike a resume, a newest step that
// fails its verification is refused (naming the file and why), never passed over for an
// older one: an export says exactly which weights it holds.
ResumePoint open_checkpoint(const std::string& path);

// "step_000040".
std::string checkpoint_dir_name(int64_t step);

}  // namespace keel
