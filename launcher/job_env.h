// What a keel process learns from its environment at start-up, read once, typed and checked
// (JobEnv::get()), and the names of those variables for the processes that set them (the
// controller for its ranks, an agent for its workers, keel-launch for its slots). Nothing else
// reads a KEEL_* variable. Only start-up facts travel here: who the process is and where its
// job lives. The layout and the placement of ranks come with the Membership (rebuild/<E> in
// the store, proto/membership.proto), never in the environment, because they change while
// the process runs.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ckpt/persistent_checkpoint.h"

namespace keel {

// The variables, by name.
namespace env {
inline constexpr const char* kJobId = "KEEL_JOB_ID";                // names the job's memory
inline constexpr const char* kSupervised = "KEEL_SUPERVISED";       // "1": a controller runs it
inline constexpr const char* kEpoch = "KEEL_EPOCH";                 // the epoch it starts in
inline constexpr const char* kRestarted = "KEEL_RESTARTED";         // "1": replaces a dead rank
inline constexpr const char* kJobStart = "KEEL_JOB_START";          // unix seconds (ETTR)
inline constexpr const char* kResumeLatest = "KEEL_RESUME_LATEST";  // restart_all's checkpoints
inline constexpr const char* kLineage = "KEEL_LINEAGE";             // of the job's checkpoints
inline constexpr const char* kController = "KEEL_CONTROLLER";       // control-plane endpoint
// The job's etcd ("host:port,..."), when it has one: the leader controller is found there
// (a new one takes over when it dies), and the job's store lives there.
inline constexpr const char* kEtcd = "KEEL_ETCD";
// The rendezvous store the ranks meet through: "host:port" (a TcpStore) or an etcd store's
// address (launcher/etcd/etcd_store.h).
inline constexpr const char* kStoreAddr = "KEEL_STORE_ADDR";
inline constexpr const char* kSlot = "KEEL_SLOT";                        // the slot it runs on
inline constexpr const char* kLocalWorldSize = "KEEL_LOCAL_WORLD_SIZE";  // workers per slot
inline constexpr const char* kIfname = "KEEL_IFNAME";  // the slot's own network interface
// A parked standby worker (launcher/worker/standby.h).
inline constexpr const char* kStandby = "KEEL_STANDBY";
inline constexpr const char* kStandbyIndex = "KEEL_STANDBY_INDEX";
inline constexpr const char* kStandbyGen = "KEEL_STANDBY_GEN";
inline constexpr const char* kStandbyGroup = "KEEL_STANDBY_GROUP";
inline constexpr const char* kStandbyGroupRank = "KEEL_STANDBY_GROUP_RANK";
inline constexpr const char* kStandbyGroupSize = "KEEL_STANDBY_GROUP_SIZE";
// A stand-in: the store key of its task (store::DiagnoseTask, store::ReplayTask).
inline constexpr const char* kDiagnose = "KEEL_DIAGNOSE";
inline constexpr const char* kReplay = "KEEL_REPLAY";
// Agent-internal (the controller's spawn command to an agent, never a worker's): hand the
// rank to this parked worker instead of starting a process.
inline constexpr const char* kAdoptIndex = "KEEL_ADOPT_INDEX";
}  // namespace env

struct JobEnv {
  std::string job;          // "" : the process is a job of its own
  bool supervised = false;  // a controller restarts ranks and runs the recovery protocol
  int epoch = 0;
  bool restarted = false;              // this process replaces a rank that died in epoch - 1
  double job_start = 0;                // unix seconds the job started (0: not given)
  std::string resume_latest;           // restart_all: resume from the newest checkpoint here
  std::optional<std::string> lineage;  // of the job's persistent checkpoints
  std::string controller;              // the control plane's endpoint ("" : none)
  std::vector<std::string> etcd;       // the job's etcd endpoints (empty: none)
  int slot = -1;                       // the slot (machine) it runs on; -1: no slots
  int local_world_size = 0;            // workers sharing this machine (0: not given)
  std::string ifname;                  // the slot's own network interface ("" : none)
  bool standby = false;                // a parked standby worker
  int standby_index = 0, standby_gen = 0;
  std::string standby_group;
  int standby_group_rank = 0, standby_group_size = 1;
  std::string diagnose_key;  // a stop-time diagnostics stand-in: its task's key
  std::string replay_key;    // a stop-time replay worker: its task's key

  // The process's environment, read on the first call. A variable that is set but does not
  // hold what it must throws keel::InputError naming it and its value.
  static const JobEnv& get();
  // Reads it now (tests).
  static JobEnv read();
};

// A job id: "<pid>-<8 hex digits>", the PID being the process that cleans the job up (so a
// later one can tell an ended job by its PID).
std::string make_job_id();

// The PID a job id starts with; nullopt if it is not one.
std::optional<int> job_owner_pid(const std::string& job);

// The lineage of job `job`'s persistent checkpoints (ckpt/persistent_checkpoint.h): the job's
// id, or when it resumes from `resumed`, that checkpoint's lineage, so that it may return
// there ("" for one written before lineages).
std::string checkpoint_lineage(const std::string& job, const ResumePoint* resumed);

}  // namespace keel
