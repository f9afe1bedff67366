// Runs the GPT-2 plugin (libkeel_gpt.so) for the tests in gpt_*_test.cc: any tp × pp split of
// one model on CPU backends in one process, with TP ranks as threads joined by an in-memory
// Communicator. Parameters and gradients go in and come out whole (as tp = pp = 1 would hold
// them), so runs with different splits compare directly.
#pragma once

#include <barrier>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/plugin.h"
#include "model/plugin_loader.h"
#include "parallel/communicator.h"

namespace keel::test {

// The members of one TP group, as threads of this process.
class Hub {
 public:
  explicit Hub(int n) : n_(n), barrier_(n), bufs_(n) {}

 private:
  friend class HubComm;
  int n_;
  std::barrier<> barrier_;
  std::vector<float*> bufs_;
};

// A Communicator over a Hub: all_reduce and barrier are real (every rank reduces the published
// buffers in rank order, so results are bitwise identical on every rank); the rest, which the
// plugin never uses, throws.
class HubComm : public Communicator {
 public:
  HubComm(Hub* hub, int rank) : hub_(hub), rank_(rank), name_("hub/" + std::to_string(rank)) {}
  int rank() const override { return rank_; }
  int size() const override { return hub_->n_; }
  const std::string& name() const override { return name_; }
  Millis default_timeout() const override { return Millis(60000); }
  void all_reduce(float* buf, size_t n, ReduceOp op, Millis timeout) override;
  void reduce_scatter(float*, size_t, Millis) override { unused("reduce_scatter"); }
  void all_gather(float*, size_t, Millis) override { unused("all_gather"); }
  void broadcast(void*, size_t, int, Millis) override { unused("broadcast"); }
  void send(const void*, size_t, int, uint32_t, Millis) override { unused("send"); }
  void recv(void*, size_t, int, uint32_t, Millis) override { unused("recv"); }
  void send_recv(const void*, size_t, int, void*, size_t, int, uint32_t, Millis) override {
    unused("send_recv");
  }
  void barrier(Millis) override { hub_->barrier_.arrive_and_wait(); }
  void abort() override {}
  bool aborted() const override { return false; }
  CommStats stats() const override { return {}; }

 private:
  [[noreturn]] static void unused(const char* what);
  Hub* hub_;
  int rank_;
  std::string name_;
};

using Tensors = std::map<std::string, std::vector<float>>;  // whole tensors by name

struct GptRun {
  double loss_sum = 0;
  Tensors grads;  // whole; the head's tied copy of wte is added into "wte"
  // Anything the plugin did against its contract: TP replicas that differ, grad_ready
  // called twice, out of order or before the gradient was final, writes past a buffer.
  std::vector<std::string> problems;
};

class GptHarness {
 public:
  // `plugin_file` is looked up in the build's bin/; any plugin without tied parameters
  // other than the GPT's (wte) works too (tests/model/llama_plugin_test.cc).
  GptHarness(const keel_model_dims& dims, int B, int T,
             const std::string& plugin_file = "libkeel_gpt.so");

  const keel_model_dims& dims() const { return dims_; }
  int B() const { return B_; }
  int T() const { return T_; }
  const Plugin& plugin() const { return *plugin_; }
  // The tp = pp = 1 description, in describe order.
  const std::vector<keel_param_desc>& descs() const { return descs_; }

  // Parameters initialised as the descriptors say (Philox, keyed by name). With `perturb`,
  // every element also gets N(0, 0.1) noise, so that no bias or gain sits at a special point.
  Tensors init(uint64_t seed, bool perturb) const;
  // Random tokens (and targets) in [0, vocab_size).
  std::vector<int32_t> tokens(uint64_t seed) const;

  // One micro-batch: forward on every stage, then (if `backward`) backward in reverse.
  GptRun run(const Tensors& params, const std::vector<int32_t>& tokens,
             const std::vector<int32_t>& targets, int tp, int pp, bool backward,
             float loss_scale) const;

 private:
  keel_model_dims dims_;
  int B_, T_;
  std::shared_ptr<Plugin> plugin_;
  std::vector<keel_param_desc> descs_;
};

// Rank r's TP shard of a whole tensor, and the reverse (see keel_param_desc).
std::vector<float> shard(const std::vector<float>& whole, const keel_param_desc& d, int tp, int r);
void unshard(std::vector<float>& whole, const std::vector<float>& part, const keel_param_desc& d,
             int tp, int r);
size_t numel(const keel_param_desc& d);

}  // namespace keel::test
