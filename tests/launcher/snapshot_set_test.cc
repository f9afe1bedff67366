// SnapshotSet (launcher/worker/snapshot_set.h) through its public interface, in one process:
// it opens the rank's snapshot region and backup server and says where the server listens
// (store::Endpoint under backup_addr/<E>/<rank>), reports how backups are kept, and closes
// for a new rank id and reopens after the rendezvous; with snapshots off it opens nothing.
#include "launcher/worker/snapshot_set.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "model/plugin_loader.h"
#include "model/trainer.h"
#include "parallel/hash_store.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "tests/test_paths.h"

namespace keel {
namespace {

class SnapshotSetTest : public testing::Test {
 protected:
  void TearDown() override { unlink_job_segments(job); }

  SnapshotSetOptions options(bool snapshots) {
    SnapshotSetOptions o;
    o.job = job;
    o.checkpoint.set_snapshot_every_step(snapshots);
    o.checkpoint.set_persistent_every_steps(0);
    o.connect = [s = store]() -> std::shared_ptr<Store> { return s; };
    return o;
  }

  std::string job = "snapsettest" + std::to_string(getpid());
  std::shared_ptr<HashStore> store = std::make_shared<HashStore>();
  config::JobConfig cfg = [] {
    config::JobConfig c;
    c.mutable_parallel()->set_dp(2);
    return c;
  }();
  Topology topo{1, 1, 2};
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  std::shared_ptr<Plugin> plugin = Plugin::load(test::bin_dir() + "/libkeel_gpt.so");
  std::unique_ptr<TrainState> state = make_train_state(cfg, backend.get(), *plugin, topo, 0);
};

TEST_F(SnapshotSetTest, OpensPublishesReportsAndReopensUnderANewId) {
  SnapshotSet set(options(true));
  set.open(0, topo, state.get(), *store, /*epoch=*/3, nullptr);
  ASSERT_NE(set.snapshotter(), nullptr);
  ASSERT_NE(set.region(), nullptr);
  EXPECT_EQ(set.checkpointer(), nullptr);  // persistent checkpoints off
  const auto addr = try_get_message<store::Endpoint>(*store, keys::backup_addr_key(3, 0));
  ASSERT_TRUE(addr.has_value());
  EXPECT_FALSE(addr->address().empty());
  set.publish_address(*store, 4, 0);  // the next epoch
  EXPECT_EQ(try_get_message<store::Endpoint>(*store, keys::backup_addr_key(4, 0))->address(),
            addr->address());

  report::RunReport rep;
  set.fill_report(&rep, *state, /*sdc_on=*/false, 0);
  EXPECT_EQ(rep.backup_mode(), "replica");  // dp 2 without ZeRO-1: the replica is the backup
  EXPECT_EQ(rep.snapshot_bytes(), double(state->bytes()));
  EXPECT_GT(rep.state_host_bytes(), 0);
  EXPECT_FALSE(set.settle(nullptr));  // no checkpointer: nothing to settle
  EXPECT_FALSE(set.stopped());

  set.close(0);
  EXPECT_TRUE(set.reopen_pending());
  EXPECT_EQ(set.snapshotter(), nullptr);
  EXPECT_EQ(set.region(), nullptr);
  set.reopen(1, topo, state.get(), *store, 5, nullptr, CheckpointLayout{});
  EXPECT_FALSE(set.reopen_pending());
  ASSERT_NE(set.region(), nullptr);
  EXPECT_EQ(set.region()->name(), snapshot_segment_name(job, 1));
  EXPECT_TRUE(try_get_message<store::Endpoint>(*store, keys::backup_addr_key(5, 1)).has_value());
}

TEST_F(SnapshotSetTest, WithSnapshotsOffNothingOpens) {
  SnapshotSet set(options(false));
  set.open(0, topo, state.get(), *store, 0, nullptr);
  EXPECT_EQ(set.snapshotter(), nullptr);
  EXPECT_EQ(set.region(), nullptr);
  EXPECT_FALSE(store->try_get(keys::backup_addr_key(0, 0)).has_value());
  report::RunReport rep;
  set.fill_report(&rep, *state, false, 0);
  EXPECT_EQ(rep.backup_mode(), "");
}

}  // namespace
}  // namespace keel
