#include "parallel/traced_communicator.h"

#include <chrono>

namespace keel {
namespace {

double unix_now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

class TracedCommunicator : public Communicator {
 public:
  TracedCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<CommActivity> a)
      : inner_(std::move(inner)), a_(std::move(a)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  Millis default_timeout() const override { return inner_->default_timeout(); }
  void all_reduce(float* b, size_t n, ReduceOp op, Millis t) override {
    Mark m(*a_);
    inner_->all_reduce(b, n, op, t);
  }
  void reduce_scatter(float* b, size_t c, Millis t) override {
    Mark m(*a_);
    inner_->reduce_scatter(b, c, t);
  }
  void all_gather(float* b, size_t c, Millis t) override {
    Mark m(*a_);
    inner_->all_gather(b, c, t);
  }
  void broadcast(void* b, size_t n, int root, Millis t) override {
    Mark m(*a_);
    inner_->broadcast(b, n, root, t);
  }
  void send(const void* b, size_t n, int p, uint32_t tag, Millis t) override {
    Mark m(*a_);
    inner_->send(b, n, p, tag, t);
  }
  void recv(void* b, size_t n, int p, uint32_t tag, Millis t) override {
    Mark m(*a_);
    inner_->recv(b, n, p, tag, t);
  }
  void send_recv(const void* sb, size_t sn, int sp, void* rb, size_t rn, int rp, uint32_t tag,
                 Millis t) override {
    Mark m(*a_);
    inner_->send_recv(sb, sn, sp, rb, rn, rp, tag, t);
  }
  void barrier(Millis t) override {
    Mark m(*a_);
    inner_->barrier(t);
  }
  void abort() override { inner_->abort(); }
  bool aborted() const override { return inner_->aborted(); }
  CommStats stats() const override { return inner_->stats(); }

 private:
  // Marks one call from its start to its end, also when it throws.
  struct Mark {
    CommActivity& a;
    explicit Mark(CommActivity& act) : a(act) {
      if (a.active.fetch_add(1) == 0) a.since = unix_now();
    }
    ~Mark() {
      if (a.active.fetch_sub(1) == 1) a.since = 0;
    }
  };
  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<CommActivity> a_;
};

}  // namespace

void trace_communicators(ProcessGroups& groups, std::shared_ptr<CommActivity> activity) {
  for (auto* comm : {&groups.world, &groups.tp, &groups.pp, &groups.dp, &groups.emb})
    if (*comm) *comm = std::make_unique<TracedCommunicator>(std::move(*comm), activity);
}

}  // namespace keel
