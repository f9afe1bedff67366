// A step is a transaction (DESIGN.md, State and seams): a CommError anywhere in it, also
// between a ZeRO-1 shard update and the all-gather that follows, or a non-finite loss,
// leaves the TrainState exactly as it was at the step's start (an epoch aborted from another
// thread ends the step before more compute); and after rebind() to new
// communicators the job goes on to exactly the weights of a run that never failed.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>

#include "model/data_loader.h"
#include "model/plugin_loader.h"
#include "model/token_shards.h"
#include "model/trainer.h"
#include "parallel/hash_store.h"
#include "proto/config_loader.h"
#include "test_paths.h"

namespace keel::test {
namespace {

// Forwards to a real communicator, but every all_gather fails as a dead peer would.
class FailingGather : public Communicator {
 public:
  explicit FailingGather(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  Millis default_timeout() const override { return inner_->default_timeout(); }
  void all_reduce(float* b, size_t n, ReduceOp op, Millis t) override {
    inner_->all_reduce(b, n, op, t);
  }
  void reduce_scatter(float* b, size_t c, Millis t) override { inner_->reduce_scatter(b, c, t); }
  void all_gather(float*, size_t, Millis) override {
    throw PeerFailure("injected: peer died during the ZeRO-1 all-gather", 1 - rank());
  }
  void broadcast(void* b, size_t n, int root, Millis t) override {
    inner_->broadcast(b, n, root, t);
  }
  void send(const void* b, size_t n, int p, uint32_t tag, Millis t) override {
    inner_->send(b, n, p, tag, t);
  }
  void recv(void* b, size_t n, int p, uint32_t tag, Millis t) override {
    inner_->recv(b, n, p, tag, t);
  }
  void send_recv(const void* sb, size_t sn, int sp, void* rb, size_t rn, int rp, uint32_t tag,
                 Millis t) override {
    inner_->send_recv(sb, sn, sp, rb, rn, rp, tag, t);
  }
  void barrier(Millis t) override { inner_->barrier(t); }
  void abort() override { inner_->abort(); }
  bool aborted() const override { return inner_->aborted(); }
  CommStats stats() const override { return inner_->stats(); }

 private:
  std::unique_ptr<Communicator> inner_;
};

config::JobConfig job(const std::string& dir) {
  std::vector<uint16_t> tokens(1 << 16);
  std::mt19937 gen(3);
  for (auto& t : tokens) t = uint16_t(gen() % 256);
  write_token_shard(dir + "/train_000000.bin", tokens);
  return parse_config_text("model { plugin: \"" + bin_dir() +
                               "/libkeel_gpt.so\" num_layers: 2 hidden_size: 32 "
                               "num_heads: 4 seq_len: 16 }\n"
                               "train { micro_batch_size: 2 global_batch_size: 4 steps: 3 }\n"
                               "parallel { dp: 2 zero1: true comm_timeout_ms: 20000 }\n"
                               "runtime { threads: 1 }\n"
                               "data { train_files: \"" +
                               dir + "/train_*.bin\" }\n",
                           "transaction-test", {});
}

std::vector<char> bytes_of(TrainState& s) {
  std::vector<char> out;
  for (const StateSpan& sp : s.spans()) {
    size_t at = out.size();
    out.resize(at + sp.bytes());
    s.backend()->copy_to_host(out.data() + at, sp.data, sp.bytes());
  }
  return out;
}

// Each DP rank in a thread: `body(rank, trainer, state, store)`.
template <typename Body>
void two_ranks(const config::JobConfig& cfg, Body body) {
  auto store = std::make_shared<HashStore>();
  auto plugin = Plugin::load(cfg.model().plugin());
  Topology topo(1, 1, 2);
  std::thread t[2];
  std::exception_ptr err[2];
  for (int r = 0; r < 2; ++r)
    t[r] = std::thread([&, r] {
      try {
        auto backend = make_cpu_backend(1);
        DataLoader data = DataLoader::from_config(cfg);
        auto state = make_train_state(cfg, backend.get(), *plugin, topo, r);
        ProcessGroupOptions o;
        auto groups = std::make_unique<ProcessGroups>(make_process_groups(topo, r, store, o));
        Trainer trainer(cfg, backend.get(), plugin, topo, r, state.get(), groups.get(), &data);
        trainer.init_params();
        body(r, trainer, *state, store, groups);
      } catch (...) {
        err[r] = std::current_exception();
      }
    });
  for (auto& th : t) th.join();
  for (auto& e : err)
    if (e) std::rethrow_exception(e);
}

TEST(TrainerTransaction, FailedZero1AllGatherLeavesTheStateAsItWas) {
  const config::JobConfig cfg = job(temp_dir("txn"));
  std::vector<char> control[2], recovered[2];
  two_ranks(cfg, [&](int r, Trainer& tr, TrainState& st, auto&, auto&) {
    tr.step();
    tr.step();
    control[r] = bytes_of(st);
  });
  two_ranks(cfg, [&](int r, Trainer& tr, TrainState& st, auto& store, auto& groups) {
    tr.step();
    const std::vector<char> before = bytes_of(st);
    groups->dp = std::make_unique<FailingGather>(std::move(groups->dp));
    tr.rebind(groups.get());
    EXPECT_THROW(tr.step(), PeerFailure);
    EXPECT_EQ(st.step(), 1);
    EXPECT_TRUE(bytes_of(st) == before) << "rank " << r << ": the state changed";
    // New communicators (epoch 1), same state: the step runs again as if nothing happened.
    ProcessGroupOptions o;
    o.epoch = 1;
    auto fresh =
        std::make_unique<ProcessGroups>(make_process_groups(Topology(1, 1, 2), r, store, o));
    tr.rebind(fresh.get());
    tr.step();
    recovered[r] = bytes_of(st);
    groups = std::move(fresh);
  });
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(recovered[r] == control[r]) << "rank " << r;
}

TEST(TrainerTransaction, NonFiniteLossIsRefusedBeforeTheUpdate) {
  const config::JobConfig cfg = job(temp_dir("txn-nan"));
  two_ranks(cfg, [&](int r, Trainer& tr, TrainState& st, auto&, auto&) {
    tr.step();
    const std::vector<char> before = bytes_of(st);
    TrainerHooks h;
    h.local_metrics = [r](int64_t, float* m) {
      if (r == 1) m[0] = std::nanf("");
    };
    tr.set_hooks(h);
    try {
      tr.step();
      ADD_FAILURE() << "rank " << r << ": a NaN loss was applied";
    } catch (const NonFiniteStep& e) {
      EXPECT_EQ(e.step(), 1);
      EXPECT_NE(std::string(e.what()).find("step 2"), std::string::npos) << e.what();
    }
    EXPECT_EQ(st.step(), 1);
    EXPECT_TRUE(bytes_of(st) == before);
  });
}

// The recovery watcher aborts a rank's communicators when the epoch ends: the step ends at
// once, before any more compute (no activation computed), and leaves the state as it was.
TEST(TrainerTransaction, AnAbortedEpochEndsTheStepBeforeMoreCompute) {
  const config::JobConfig cfg = job(temp_dir("txn-abort"));
  two_ranks(cfg, [&](int r, Trainer& tr, TrainState& st, auto&, auto& groups) {
    tr.step();
    const std::vector<char> before = bytes_of(st);
    std::vector<TensorClass> computed;
    TrainerHooks h;
    h.computed = [&](int64_t, TensorClass cls, float*, size_t, bool) { computed.push_back(cls); };
    tr.set_hooks(h);
    groups->abort_all();
    try {
      tr.step();
      ADD_FAILURE() << "rank " << r << ": an aborted epoch's step ran";
    } catch (const CommAborted& e) {
      EXPECT_NE(std::string(e.what()).find("step 2: the epoch was aborted"), std::string::npos)
          << e.what();
    }
    EXPECT_TRUE(computed.empty()) << "rank " << r << " computed " << computed.size()
                                  << " tensors of an aborted step";
    EXPECT_EQ(st.step(), 1);
    EXPECT_TRUE(bytes_of(st) == before);
  });
}

}  // namespace
}  // namespace keel::test
