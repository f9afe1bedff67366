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
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "model/train_state.h"
#include "parallel/store.h"
#include "proto/checkpoint.pb.h"

namespace keel {

// What must match between a checkpoint and the job resuming from it.
struct CheckpointLayout {
  int tp = 1, pp = 1, dp = 1;
  bool zero1 = false;
  std::string plugin_name{};
  std::string plugin_version{};
  // Written into each manifest; when looking for a checkpoint, only those of this lineage
  // count (others are skipped and said so). Empty: none written, every one counts (a user's
  // --resume names the checkpoint to take).
  std::string lineage{};
  int world() const { return tp * pp * dp; }
};

struct PersistentCheckpointOptions {
  std::string dir{};  // checkpoint.dir
  int rank = 0;       // global rank; rank 0 writes the manifest and prunes
  CheckpointLayout layout;
  int keep = 3;  // complete checkpoints kept; older ones are deleted (0: keep all)
  // How long rank 0 waits for the other ranks' files before giving the step up.
  std::chrono::milliseconds wait_timeout{std::chrono::minutes(10)};
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
  // A save that failed is logged to stderr when it fails; if the previous save failed this
  // throws keel::Error saying why, after the new save has started.
  void save_async(TrainState& state);

  // Waits for the write in flight; throws keel::Error if it (or an unreported earlier one)
  // failed.
  void wait();

 private:
  void write(int64_t step, uint64_t fingerprint);
  void write_manifest(int64_t step, const std::string& my_record);
  void prune(int64_t newest_step);
  void join_and_take_error(std::string* error);

  PersistentCheckpointOptions opts_;
  StoreFactory store_factory_;
  std::shared_ptr<Store> store_;  // made and used by the background thread only
  std::vector<char> staging_;     // header + payload of the save in flight
  std::thread writer_;
  std::mutex mu_;
  std::string error_;  // the failed write not yet reported; guarded by mu_
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
// usable one has another layout than `expected` (naming each field that differs).
ResumePoint find_resume_point(const std::string& dir, const CheckpointLayout& expected,
                              std::vector<std::string>* skipped = nullptr);

// Reads `rank`'s file of `point` into `state` and sets state.step(). Throws keel::InputError
// if the file does not match the manifest or the state's layout (nothing is changed then).
void load_rank(const ResumePoint& point, int rank, TrainState& state);

// "step_000040".
std::string checkpoint_dir_name(int64_t step);

}  // namespace keel
