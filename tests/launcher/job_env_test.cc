// JobEnv (launcher/job_env.h): what a process reads from its environment at start-up, typed
// and checked, and the typed store values every layer writes (parallel/store.h).
#include "launcher/job_env.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "parallel/hash_store.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "runtime/check.h"

namespace keel {
namespace {

// Sets variables for one test and removes them after.
class EnvVars {
 public:
  void set(const char* name, const std::string& value) {
    ::setenv(name, value.c_str(), 1);
    names_.push_back(name);
  }
  ~EnvVars() {
    for (const char* n : names_) ::unsetenv(n);
  }

 private:
  std::vector<const char*> names_;
};

TEST(JobEnv, ReadsEveryVariableTyped) {
  EnvVars v;
  v.set(env::kJobId, "123-0000abcd");
  v.set(env::kSupervised, "1");
  v.set(env::kEpoch, "7");
  v.set(env::kRestarted, "1");
  v.set(env::kJobStart, "1700000000.25");
  v.set(env::kLineage, "");
  v.set(env::kController, "tcp://127.0.0.1:5000");
  v.set(env::kSlot, "3");
  v.set(env::kLocalWorldSize, "2");
  v.set(env::kStandby, "1");
  v.set(env::kStandbyIndex, "1");
  v.set(env::kStandbyGen, "4");
  v.set(env::kStandbyGroupSize, "2");
  v.set(env::kStandbyGroupRank, "1");
  v.set(env::kDiagnose, "diag/1/2");
  const JobEnv e = JobEnv::read();
  EXPECT_EQ(e.job, "123-0000abcd");
  EXPECT_TRUE(e.supervised);
  EXPECT_EQ(e.epoch, 7);
  EXPECT_TRUE(e.restarted);
  EXPECT_DOUBLE_EQ(e.job_start, 1700000000.25);
  ASSERT_TRUE(e.lineage.has_value());  // set, though empty: a checkpoint from before lineages
  EXPECT_EQ(*e.lineage, "");
  EXPECT_EQ(e.controller, "tcp://127.0.0.1:5000");
  EXPECT_EQ(e.slot, 3);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_TRUE(e.standby);
  EXPECT_EQ(e.standby_index, 1);
  EXPECT_EQ(e.standby_gen, 4);
  EXPECT_EQ(e.standby_group_rank, 1);
  EXPECT_EQ(e.standby_group_size, 2);
  EXPECT_EQ(e.diagnose_key, "diag/1/2");
  EXPECT_EQ(e.replay_key, "");
}

TEST(JobEnv, UnsetMeansALoneProcess) {
  const JobEnv e = JobEnv::read();
  EXPECT_EQ(e.job, "");
  EXPECT_FALSE(e.supervised);
  EXPECT_EQ(e.epoch, 0);
  EXPECT_EQ(e.slot, -1);
  EXPECT_FALSE(e.lineage.has_value());
  EXPECT_EQ(e.standby_group_size, 1);
}

// A value that is not what the variable must hold is refused, naming the variable and value.
TEST(JobEnv, ABadValueNamesTheVariableAndTheValue) {
  const std::vector<std::pair<const char*, std::string>> bad = {
      {env::kEpoch, "3x"},          {env::kEpoch, "-1"},      {env::kSlot, "one"},
      {env::kSupervised, "yes"},    {env::kJobStart, "noon"}, {env::kLocalWorldSize, "0"},
      {env::kStandbyGroupRank, "2"}};
  for (const auto& [name, value] : bad) {
    EnvVars v;
    v.set(name, value);
    try {
      JobEnv::read();
      ADD_FAILURE() << name << "=" << value << " was accepted";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(name), std::string::npos) << what;
      EXPECT_NE(what.find("'" + value + "'"), std::string::npos) << what;
    }
  }
}

TEST(JobEnv, JobIdsNameTheirOwner) {
  const std::string id = make_job_id();
  EXPECT_EQ(job_owner_pid(id), std::optional<int>(int(::getpid())));
  EXPECT_EQ(job_owner_pid("42-deadbeef"), std::optional<int>(42));
  for (const char* not_one : {"", "abc", "42", "-3-00000000", "0-00000000", "x42-1"})
    EXPECT_EQ(job_owner_pid(not_one), std::nullopt) << not_one;
}

TEST(StoreValues, TypedValuesRoundTripAndAStrangerIsRefused) {
  HashStore store;
  EXPECT_FALSE(try_get_message<store::Step>(store, keys::kProgress).has_value());
  store::Step s;
  s.set_step(41);
  set_message(store, keys::kProgress, s);
  ASSERT_TRUE(try_get_message<store::Step>(store, keys::kProgress).has_value());
  EXPECT_EQ(try_get_message<store::Step>(store, keys::kProgress)->step(), 41);
  EXPECT_EQ(get_message<store::Step>(store, keys::kProgress, std::chrono::seconds(1)).step(), 41);
  // Bytes that are no Step (a truncated varint): refused, naming the key and the type.
  store.set(keys::kProgress, std::string("\x08\xff", 2));
  try {
    get_message<store::Step>(store, keys::kProgress, std::chrono::seconds(1));
    ADD_FAILURE() << "a malformed value was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'progress'"), std::string::npos) << what;
    EXPECT_NE(what.find("keel.store.Step"), std::string::npos) << what;
  }
}

// Keys of one epoch never collide with another's, and the prefixes the controller erases an
// epoch by cover exactly that epoch's keys.
TEST(StoreKeys, EpochKeysAreDistinctAndTheirPrefixesExact) {
  EXPECT_NE(keys::ack_key(3, 0), keys::ack_key(30, 0));
  EXPECT_EQ(keys::ack_key(3, 1).rfind(keys::ack_prefix(3), 0), 0u);
  EXPECT_NE(keys::ack_key(30, 1).rfind(keys::ack_prefix(3), 0), 0u);
  EXPECT_EQ(keys::error_key(5, 2).rfind(keys::error_prefix(5), 0), 0u);
  EXPECT_EQ(keys::backup_addr_key(5, 2).rfind(keys::backup_addr_prefix(5), 0), 0u);
  EXPECT_NE(keys::standby_ready_key(1, 2, 3), keys::standby_ready_key(1, 23, 0));
  EXPECT_NE(keys::replay_key(1, 2, 3), keys::replay_key(12, 3, 0));
}

}  // namespace
}  // namespace keel
