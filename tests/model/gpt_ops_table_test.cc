// The OpsTable: cross-entropy through the table, and how a failing communicator's typed
// exception travels through the C boundary (and through the GPT plugin) back to the caller.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/ops_table.h"
#include "parallel/comm_error.h"
#include "parallel/communicator.h"
#include "runtime/backend.h"
#include "tests/model/gpt_test_harness.h"

namespace keel {
namespace {

// A TP group of two whose every collective fails as if the peer had died.
class DeadPeerComm : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  const std::string& name() const override { return name_; }
  Millis default_timeout() const override { return Millis(1000); }
  void all_reduce(float*, size_t, ReduceOp, Millis) override { fail(); }
  void reduce_scatter(float*, size_t, Millis) override { fail(); }
  void all_gather(float*, size_t, Millis) override { fail(); }
  void broadcast(void*, size_t, int, Millis) override { fail(); }
  void send(const void*, size_t, int, uint32_t, Millis) override { fail(); }
  void recv(void*, size_t, int, uint32_t, Millis) override { fail(); }
  void send_recv(const void*, size_t, int, void*, size_t, int, uint32_t, Millis) override {
    fail();
  }
  void barrier(Millis) override { fail(); }
  void abort() override {}
  bool aborted() const override { return false; }
  CommStats stats() const override { return {}; }
  int calls = 0;

 private:
  void fail() {
    ++calls;
    throw PeerFailure("dead/tp/0: peer 1 closed the connection", 1);
  }
  std::string name_ = "dead/tp/0";
};

TEST(GptOpsTable, CrossEntropyOfUniformLogits) {
  auto be = make_cpu_backend(1);
  OpsTable table(be.get(), nullptr);
  const keel_ops* o = table.ops();
  EXPECT_EQ(o->struct_size, sizeof(keel_ops));
  const int N = 3, V = 5, Vp = 8;  // columns 5..7 are padding
  auto* logits = static_cast<float*>(be->alloc(N * Vp * sizeof(float)));
  auto* losses = static_cast<float*>(be->alloc(N * sizeof(float)));
  auto* targets = static_cast<int32_t*>(be->alloc(N * sizeof(int32_t)));
  const int32_t t[N] = {0, 4, 2};
  be->copy_from_host(targets, t, sizeof(t));
  // Twice, so the temporaries are reused; the second call on more rows grows them.
  for (int rows : {2, N}) {
    o->fill(o->impl, logits, size_t(N) * Vp, 0.0f);
    ASSERT_EQ(o->cross_entropy(o->impl, losses, logits, logits, targets, rows, Vp, 0, V, 0.5f), 0);
    std::vector<float> l(rows), d(size_t(rows) * Vp);
    be->copy_to_host(l.data(), losses, l.size() * sizeof(float));
    be->copy_to_host(d.data(), logits, d.size() * sizeof(float));
    for (int i = 0; i < rows; ++i) {
      EXPECT_NEAR(l[i], std::log(5.0), 1e-6);
      for (int j = 0; j < Vp; ++j) {
        const float want = j >= V ? 0.0f : 0.5f * (0.2f - (j == t[i] ? 1.0f : 0.0f));
        EXPECT_NEAR(d[size_t(i) * Vp + j], want, 1e-6) << i << "," << j;
      }
    }
    EXPECT_NEAR(o->sum(o->impl, losses, size_t(rows)), rows * std::log(5.0), 1e-5);
  }
  table.rethrow_if_failed();  // nothing failed: returns
  for (void* p :
       {static_cast<void*>(logits), static_cast<void*>(losses), static_cast<void*>(targets)})
    be->free(p);
}

TEST(GptOpsTable, FailedCollectiveRethrowsItsTypeOnce) {
  auto be = make_cpu_backend(1);
  DeadPeerComm comm;
  OpsTable table(be.get(), &comm);
  const keel_ops* o = table.ops();
  auto* x = static_cast<float*>(be->alloc(4 * sizeof(float)));
  EXPECT_NE(o->tp_all_reduce(o->impl, x, 4), 0);
  EXPECT_TRUE(table.failed());
  // After a failure every op is skipped, so nothing computes on a broken state.
  o->fill(o->impl, x, 4, 1.0f);
  float host[4];
  be->copy_to_host(host, x, sizeof(host));
  EXPECT_EQ(host[0], 0.0f);
  EXPECT_NE(o->tp_all_reduce(o->impl, x, 4), 0);
  EXPECT_EQ(comm.calls, 1);
  try {
    table.rethrow_if_failed();
    ADD_FAILURE() << "nothing rethrown";
  } catch (const PeerFailure& e) {
    EXPECT_EQ(e.peer(), 1);
    EXPECT_NE(std::string(e.what()).find("peer 1 closed"), std::string::npos);
  }
  EXPECT_FALSE(table.failed());
  EXPECT_NO_THROW(table.rethrow_if_failed());
  be->free(x);
}

TEST(GptOpsTable, GradReadyReachesTheRuntime) {
  auto be = make_cpu_backend(1);
  OpsTable table(be.get(), nullptr);
  std::vector<int> seen;
  table.set_grad_ready([&](int i) { seen.push_back(i); });
  table.ops()->grad_ready(table.ops()->impl, 7);
  table.ops()->grad_ready(table.ops()->impl, 3);
  EXPECT_EQ(seen, (std::vector<int>{7, 3}));
  // A callback that throws is recorded like any failed op, never unwound through C.
  table.set_grad_ready([](int) { throw CommAborted("aborted"); });
  table.ops()->grad_ready(table.ops()->impl, 1);
  EXPECT_THROW(table.rethrow_if_failed(), CommAborted);
}

TEST(GptOpsTable, AnAbortedEpochStopsEveryLaterOp) {
  auto be = make_cpu_backend(1);
  OpsTable table(be.get(), nullptr);
  bool aborted = false;
  table.set_abort_probe([&] { return aborted; });
  float* x = static_cast<float*>(be->alloc(4 * sizeof(float)));
  table.ops()->fill(table.ops()->impl, x, 4, 1.0f);
  EXPECT_FALSE(table.failed());
  // The abort comes between two ops: the next does nothing, and the abort is rethrown once.
  aborted = true;
  table.ops()->fill(table.ops()->impl, x, 4, 2.0f);
  std::vector<float> host(4);
  be->copy_to_host(host.data(), x, 4 * sizeof(float));
  EXPECT_EQ(host, (std::vector<float>{1, 1, 1, 1}));
  EXPECT_TRUE(table.failed());
  EXPECT_THROW(table.rethrow_if_failed(), CommAborted);
  be->free(x);
}

// Each communicating step of the plugin hands the failure back at once, in forward (the
// embedding's all-reduce on stage 0; a block's on a later stage) and in backward.
TEST(GptOpsTable, PluginReturnsCommunicatorFailure) {
  test::GptHarness gpt({2, 16, 4, 64, 8, 64, 72, 0.02f}, 2, 8);
  const keel_plugin& table = gpt.plugin().table();
  keel_model_dims dims = gpt.dims();
  auto be = make_cpu_backend(1);
  for (keel_stage stage : {keel_stage{0, 2, 0, 1, 0, 2}, keel_stage{0, 2, 1, 2, 1, 2}}) {
    for (bool backward : {false, true}) {
      DeadPeerComm comm;
      OpsTable ops(be.get(), &comm);
      auto descs = gpt.plugin().describe(dims, stage);
      std::vector<void*> owned;
      auto alloc = [&](size_t n) {
        owned.push_back(be->alloc(std::max<size_t>(n, 1) * sizeof(float)));
        return static_cast<float*>(owned.back());
      };
      std::vector<float*> params, grads;
      for (const auto& d : descs) {
        params.push_back(alloc(test::numel(d)));
        grads.push_back(alloc(test::numel(d)));
      }
      keel_stage_args a{};
      a.ops = ops.ops();
      a.params = params.data();
      a.grads = grads.data();
      a.B = 2;
      a.T = 8;
      a.tokens = reinterpret_cast<int32_t*>(alloc(16));
      a.targets = reinterpret_cast<int32_t*>(alloc(16));
      a.input = alloc(2 * 8 * 16);
      a.output = alloc(2 * 8 * 16);
      a.dout = alloc(2 * 8 * 16);
      a.dinput = alloc(2 * 8 * 16);
      a.activations = alloc(table.activation_floats(&dims, &stage, 2, 8));
      a.scratch = alloc(table.scratch_floats(&dims, &stage, 2, 8));
      a.loss_scale = 1.0f / 16;
      int rc = (backward ? table.backward : table.forward)(&dims, &stage, &a);
      EXPECT_NE(rc, 0) << "pp_rank " << stage.pp_rank << (backward ? " backward" : " forward");
      EXPECT_EQ(comm.calls, 1);
      EXPECT_THROW(ops.rethrow_if_failed(), PeerFailure);
      for (void* p : owned) be->free(p);
    }
  }
}

}  // namespace
}  // namespace keel
