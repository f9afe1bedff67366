#include "parallel/traced_communicator.h"

#include <algorithm>
#include <chrono>

namespace keel {
namespace {

double unix_now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

class TracedCommunicator : public Communicator {
 public:
  TracedCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<CommActivity> a,
                     CommGroup group, uint64_t generation)
      : inner_(std::move(inner)), a_(std::move(a)), group_(group), generation_(generation) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  Millis default_timeout() const override { return inner_->default_timeout(); }
  void all_reduce(float* b, size_t n, ReduceOp op, Millis t) override {
    Mark m(*this, true);
    inner_->all_reduce(b, n, op, t);
    m.completed = true;
  }
  void reduce_scatter(float* b, size_t c, Millis t) override {
    Mark m(*this, true);
    inner_->reduce_scatter(b, c, t);
    m.completed = true;
  }
  void all_gather(float* b, size_t c, Millis t) override {
    Mark m(*this, true);
    inner_->all_gather(b, c, t);
    m.completed = true;
  }
  void broadcast(void* b, size_t n, int root, Millis t) override {
    Mark m(*this, true);
    inner_->broadcast(b, n, root, t);
    m.completed = true;
  }
  void send(const void* b, size_t n, int p, uint32_t tag, Millis t) override {
    Mark m(*this, false);
    inner_->send(b, n, p, tag, t);
  }
  void recv(void* b, size_t n, int p, uint32_t tag, Millis t) override {
    Mark m(*this, false);
    inner_->recv(b, n, p, tag, t);
  }
  void send_recv(const void* sb, size_t sn, int sp, void* rb, size_t rn, int rp, uint32_t tag,
                 Millis t) override {
    Mark m(*this, false);
    inner_->send_recv(sb, sn, sp, rb, rn, rp, tag, t);
  }
  void barrier(Millis t) override {
    Mark m(*this, true);
    inner_->barrier(t);
    m.completed = true;
  }
  void abort() override { inner_->abort(); }
  bool aborted() const override { return inner_->aborted(); }
  CommStats stats() const override { return inner_->stats(); }
  std::vector<LinkStats> link_stats() const override { return inner_->link_stats(); }

 private:
  // Marks one call from its start to its end, also when it throws.
  struct Mark {
    CommActivity& a;
    CommActivity::Call call;
    bool completed = false;
    Mark(TracedCommunicator& c, bool collective)
        : a(*c.a_), call(a.begin(c.group_, collective, c.generation_)) {}
    ~Mark() { a.end(call, completed); }
    Mark(const Mark&) = delete;
    Mark& operator=(const Mark&) = delete;
  };
  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<CommActivity> a_;
  CommGroup group_;
  uint64_t generation_;
};

}  // namespace

const char* comm_group_name(CommGroup g) {
  static constexpr const char* kNames[kCommGroups] = {"world", "tp", "pp", "dp", "emb"};
  return kNames[int(g)];
}

bool CommActivity::in_call() const {
  std::lock_guard<std::mutex> l(mu_);
  return !running_.empty();
}

double CommActivity::since() const {
  std::lock_guard<std::mutex> l(mu_);
  return running_.empty() ? 0 : *std::min_element(running_.begin(), running_.end());
}

std::array<GroupSeq, kCommGroups> CommActivity::groups() const {
  std::lock_guard<std::mutex> l(mu_);
  std::array<GroupSeq, kCommGroups> out;
  for (int i = 0; i < kCommGroups; ++i)
    out[size_t(i)] = {CommGroup(i), g_[size_t(i)].entered, g_[size_t(i)].finished,
                      g_[size_t(i)].since};
  return out;
}

uint64_t CommActivity::new_epoch() {
  std::lock_guard<std::mutex> l(mu_);
  g_ = {};
  return ++generation_;
}

CommActivity::Call CommActivity::begin(CommGroup group, bool collective, uint64_t generation) {
  Call c{group, 0, unix_now(), generation};
  std::lock_guard<std::mutex> l(mu_);
  running_.push_back(c.start);
  if (collective && generation == generation_) {
    Group& g = g_[size_t(group)];
    c.seq = ++g.next;
    g.entered = c.seq;
    g.since = c.start;
  }
  return c;
}

void CommActivity::end(const Call& call, bool completed) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = std::find(running_.begin(), running_.end(), call.start);
  if (it != running_.end()) running_.erase(it);
  Group& g = g_[size_t(call.group)];
  // A call of an older epoch must not touch the new epoch's numbers.
  if (call.seq == 0 || call.generation != generation_) return;
  g.entered = 0;
  g.since = 0;
  if (completed) {
    g.finished = call.seq;
    g.finished_start = call.start;
  }
}

void CommActivity::stay_inside_last(CommGroup group) {
  std::lock_guard<std::mutex> l(mu_);
  Group& g = g_[size_t(group)];
  if (g.finished == 0) return;
  g.entered = g.finished--;
  g.since = g.finished_start;
  running_.push_back(g.since);
}

void trace_communicators(ProcessGroups& groups, std::shared_ptr<CommActivity> activity) {
  const uint64_t generation = activity->new_epoch();
  const std::array<std::unique_ptr<Communicator>*, kCommGroups> comms = {
      &groups.world, &groups.tp, &groups.pp, &groups.dp, &groups.emb};
  for (int i = 0; i < kCommGroups; ++i) {
    auto& comm = *comms[size_t(i)];
    if (comm)
      comm =
          std::make_unique<TracedCommunicator>(std::move(comm), activity, CommGroup(i), generation);
  }
}

}  // namespace keel
