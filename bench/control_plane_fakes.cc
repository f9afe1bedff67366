#include "bench/control_plane_fakes.h"

#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "launcher/control_plane.h"
#include "launcher/etcd/etcd_store.h"
#include "launcher/recovery_protocol.h"
#include "parallel/store.h"
#include "proto/control.pb.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "runtime/check.h"

namespace keel::bench {
namespace {

using Clock = std::chrono::steady_clock;

// The plane thread's longest wait for a message: it also paces the heartbeats and progress.
constexpr int kPollMs = 2;
// How often the store thread looks for the next epoch's abort and rebuild (a worker's watcher
// thread looks about as often, launcher/worker/recovery_client.h).
constexpr std::chrono::milliseconds kStorePoll{20};
// The fake pids of ranks and agents: never a process of this machine that a reader could
// mistake for one (above pid_max's default).
constexpr int kFakePid = 5'000'000;

std::string serialize(const control::Envelope& m) {
  std::string s;
  KEEL_CHECK(m.SerializeToString(&s), "cannot serialize a control Envelope");
  return s;
}

control::Envelope envelope(int epoch) {
  control::Envelope m;
  m.set_epoch(epoch);
  m.set_sent_at(recovery::unix_now());
  return m;
}

void* open_dealer(void* ctx, const std::string& identity, const std::string& endpoint) {
  void* s = zmq_socket(ctx, ZMQ_DEALER);
  KEEL_CHECK(s, "zmq_socket: ", zmq_strerror(zmq_errno()));
  const int zero = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
  zmq_setsockopt(s, ZMQ_ROUTING_ID, identity.data(), identity.size());
  // The real client's bounded queue (launcher/control_plane.h): 1000 messages.
  const int hwm = 1000;
  zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof(hwm));
  // The job's CURVE keys, as ControlClient sets them: the controller admits nothing else.
  static const CurveKeyPair server = control_curve_keys(process_job_key(), true),
                            client = control_curve_keys(process_job_key(), false);
  zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, server.pub.data(), server.pub.size());
  zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, client.pub.data(), client.pub.size());
  zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, client.sec.data(), client.sec.size());
  KEEL_CHECK(zmq_connect(s, endpoint.c_str()) == 0, "zmq_connect ", endpoint, ": ",
             zmq_strerror(zmq_errno()));
  return s;
}

void close_socket(void** s) {
  if (*s) zmq_close(*s);
  *s = nullptr;
}

bool send_bytes(void* s, const std::string& bytes) {
  return s && zmq_send(s, bytes.data(), bytes.size(), ZMQ_DONTWAIT) >= 0;
}

}  // namespace

struct FakeCluster::Zmq {
  void* ctx = nullptr;
  Zmq() {
    ctx = zmq_ctx_new();
    KEEL_CHECK(ctx, "zmq_ctx_new: ", zmq_strerror(zmq_errno()));
    // Two sockets a slot: thousands of them, past ZeroMQ's default of 1023 a context.
    zmq_ctx_set(ctx, ZMQ_MAX_SOCKETS, 65536);
    zmq_ctx_set(ctx, ZMQ_IO_THREADS, 1);
  }
  ~Zmq() { zmq_ctx_term(ctx); }
};

struct FakeCluster::Slot {
  int id = 0;
  bool standby = false;
  bool lost = false;      // lose_slot(): gone for good
  std::set<int> running;  // the ranks whose (fake) workers run here (under mu_)
  void* agent = nullptr;  // sockets: the plane thread's alone
  void* workers = nullptr;
  bool welcomed = false;
  Clock::time_point next_heartbeat, next_progress;
};

FakeCluster::FakeCluster(FakeClusterOptions o) : o_(std::move(o)), zmq_(std::make_unique<Zmq>()) {
  const int slots = o_.active_slots + o_.standby_slots;
  const auto now = Clock::now();
  for (int k = 0; k < slots; ++k) {
    auto s = std::make_unique<Slot>();
    s->id = k;
    s->standby = k >= o_.active_slots;
    if (!s->standby)
      for (int i = 0; i < o_.per_slot; ++i) s->running.insert(k * o_.per_slot + i);
    // Spread over the period, as independent machines are.
    s->next_heartbeat = now + o_.heartbeat * k / slots;
    s->next_progress = now + o_.progress * k / slots;
    slots_.push_back(std::move(s));
  }
  step_origin_ = now;
  plane_ = std::thread([this] {
    try {
      plane_loop();
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> l(mu_);
      error_ = std::string("the control plane: ") + e.what();
    }
  });
  store_ = std::thread([this] { store_loop(); });
}

FakeCluster::~FakeCluster() {
  stop_ = true;
  if (plane_.joinable()) plane_.join();
  if (store_.joinable()) store_.join();
  for (auto& s : slots_) {
    close_socket(&s->agent);
    close_socket(&s->workers);
  }
}

void FakeCluster::follow(const std::string& endpoint) {
  std::lock_guard<std::mutex> l(mu_);
  endpoint_ = endpoint;
  ++follow_gen_;
}

int FakeCluster::live_slots() const {
  std::lock_guard<std::mutex> l(mu_);
  int n = 0;
  for (const auto& s : slots_) n += !s->lost;
  return n;
}

double FakeCluster::lose_slot(int slot) {
  KEEL_CHECK(slot >= 0 && slot < int(slots_.size()), "no slot ", slot);
  std::unique_lock<std::mutex> l(mu_);
  lose_.insert(slot);
  l.unlock();
  // The plane thread closes the sockets (they are its own): wait until it has.
  while (true) {
    l.lock();
    const bool done = slots_[size_t(slot)]->lost;
    const std::string error = error_;
    l.unlock();
    if (done) break;
    KEEL_CHECK(error.empty(), "slot ", slot, " cannot be lost: ", error);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return recovery::unix_now();
}

std::optional<membership::Rebuild> FakeCluster::rebuild(int epoch) const {
  std::lock_guard<std::mutex> l(mu_);
  for (const auto& rb : rebuilds_)
    if (rb.membership().epoch() == epoch) return rb;
  return std::nullopt;
}

std::string FakeCluster::error() const {
  std::lock_guard<std::mutex> l(mu_);
  return error_;
}

int64_t FakeCluster::step_now() const {
  if (in_transition_) return frozen_step_;
  return step_base_ + (Clock::now() - step_origin_) / o_.step;
}

void FakeCluster::plane_loop() {
  int64_t gen = 0;
  std::string endpoint;
  std::vector<zmq_pollitem_t> items;
  std::vector<int> item_slot;
  bool rebuild_items = true;
  char buf[1 << 16];
  while (!stop_) {
    std::set<int> lose;
    bool reconnect = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      lose.swap(lose_);
      if (follow_gen_ != gen) {
        gen = follow_gen_;
        endpoint = endpoint_;
        reconnect = true;
      }
    }
    for (int k : lose) {
      Slot& s = *slots_[size_t(k)];
      close_socket(&s.agent);
      close_socket(&s.workers);
      std::lock_guard<std::mutex> l(mu_);
      if (s.welcomed) --welcomed_;
      s.welcomed = false;
      s.lost = true;
      s.running.clear();
      rebuild_items = true;
    }
    if (reconnect) {
      welcomed_ = 0;
      for (auto& sp : slots_) {
        Slot& s = *sp;
        if (s.lost) continue;
        close_socket(&s.agent);
        close_socket(&s.workers);
        s.welcomed = false;
        s.agent = open_dealer(
            zmq_->ctx, "agent/" + std::to_string(s.id) + "/" + std::to_string(kFakePid + s.id),
            endpoint);
        s.workers = open_dealer(zmq_->ctx, "worker/" + std::to_string(s.id), endpoint);
        control::Envelope m = envelope(0);
        control::Register* r = m.mutable_registration();
        r->set_slot(s.id);
        r->set_host("127.0.0.1");
        r->set_pid(kFakePid + s.id);
        r->set_workers(o_.per_slot);
        r->set_standby(s.standby);
        r->set_job(o_.job);
        r->set_rejoin(true);
        std::lock_guard<std::mutex> l(mu_);
        for (int rank : s.running) (*r->mutable_running())[rank] = kFakePid + rank;
        if (s.running.empty())
          for (int i = 0; i < o_.per_slot; ++i) r->add_parked(i);
        send_bytes(s.agent, serialize(m));
      }
      rebuild_items = true;
    }
    if (rebuild_items) {
      items.clear();
      item_slot.clear();
      for (auto& s : slots_)
        if (s->agent) {
          items.push_back(zmq_pollitem_t{s->agent, 0, ZMQ_POLLIN, 0});
          item_slot.push_back(s->id);
        }
      rebuild_items = false;
    }
    if (items.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(kPollMs));
      continue;
    }
    if (zmq_poll(items.data(), int(items.size()), kPollMs) < 0 && zmq_errno() != EINTR)
      KEEL_CHECK(false, "zmq_poll: ", zmq_strerror(zmq_errno()));
    for (size_t i = 0; i < items.size(); ++i) {
      if (!(items[i].revents & ZMQ_POLLIN)) continue;
      while (true) {
        const int n = zmq_recv(items[i].socket, buf, sizeof(buf), ZMQ_DONTWAIT);
        if (n < 0) break;
        ++received_;
        received_bytes_ += n;
        if (n > int(sizeof(buf))) {
          ++surprises_;  // truncated: no command of the controller is this long
          continue;
        }
        handle(item_slot[i], std::string(buf, size_t(n)));
      }
    }
    const auto now = Clock::now();
    const double unix_now = recovery::unix_now();
    for (auto& sp : slots_) {
      Slot& s = *sp;
      if (s.lost || !s.agent) continue;
      if (now >= s.next_heartbeat) {
        // A machine that fell behind (this thread was busy) does not send a burst.
        s.next_heartbeat = std::max(s.next_heartbeat + o_.heartbeat, now);
        control::Envelope m;
        {
          std::lock_guard<std::mutex> l(mu_);
          m = envelope(epoch_);
          m.mutable_heartbeat()->set_slot(s.id);
          for (int r : s.running) m.mutable_heartbeat()->add_ranks_alive(r);
        }
        if (send_bytes(s.agent, serialize(m))) ++heartbeats_sent_;
      }
      if (now >= s.next_progress) {
        s.next_progress = std::max(s.next_progress + o_.progress, now);
        send_progress(s.id, unix_now);
      }
    }
  }
}

void FakeCluster::send_progress(int slot, double now) {
  Slot& s = *slots_[size_t(slot)];
  std::vector<int> ranks;
  int epoch = 0;
  int64_t step = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    ranks.assign(s.running.begin(), s.running.end());
    epoch = epoch_;
    step = step_now();
  }
  const double step_s = std::chrono::duration<double>(o_.step).count();
  for (int r : ranks) {
    control::Envelope m = envelope(epoch);
    control::WorkerProgress* p = m.mutable_progress();
    p->set_rank(r);
    p->set_slot(slot);
    p->set_step(step);
    p->set_loss(5.0 - 1e-4 * double(step));
    p->set_step_s(step_s);
    p->set_compute_s(0.8 * step_s);
    p->set_comm_s(0.2 * step_s);
    p->set_pid(kFakePid + r);
    p->set_alive_at(now);
    // Every group finished its step's collectives, none entered: a healthy rank between two.
    for (const char* g : {"tp", "dp", "world"}) {
      control::GroupSeq* gs = p->add_groups();
      gs->set_group(g);
      gs->set_finished(step * 4);
    }
    if (send_bytes(s.workers, serialize(m))) ++progress_sent_;
  }
}

void FakeCluster::handle(int slot, const std::string& bytes) {
  Slot& s = *slots_[size_t(slot)];
  control::Envelope m;
  if (!m.ParseFromString(bytes) || !m.has_command()) {
    ++surprises_;
    return;
  }
  const control::Command& c = m.command();
  switch (c.kind()) {
    case control::Command::welcome:
      if (!s.welcomed) ++welcomed_;
      s.welcomed = true;
      return;
    case control::Command::keepalive:
    case control::Command::follow:
    case control::Command::renumber:
      return;
    case control::Command::survey: {
      // Every rank's own snapshot on its slot, and the backup of the previous active slot's
      // ranks: with a TP group a slot and a DP replica a slot, rank (d, t)'s backup holder is
      // (d+1, t) (ckpt/backup_placement.h). The last three steps.
      control::Envelope e = envelope(m.epoch());
      control::Event* ev = e.mutable_event();
      ev->set_kind(control::Event::snapshots);
      ev->set_slot(slot);
      std::lock_guard<std::mutex> l(mu_);
      const int64_t step = step_now();
      auto hold = [&](int rank, bool own) {
        control::SnapshotHolding* h = ev->add_holdings();
        h->set_owner_rank(rank);
        h->set_own(own);
        for (int64_t st = std::max<int64_t>(1, step - 2); st <= step; ++st) h->add_steps(st);
      };
      for (int r : s.running) hold(r, true);
      if (!s.running.empty() && o_.active_slots > 1) {
        const int prev = (slot + o_.active_slots - 1) % o_.active_slots;
        for (int i = 0; i < o_.per_slot; ++i) hold(prev * o_.per_slot + i, false);
      }
      if (send_bytes(s.agent, serialize(e))) ++surveys_;
      return;
    }
    case control::Command::kill: {
      control::Envelope e = envelope(m.epoch());
      e.mutable_event()->set_kind(control::Event::worker_exit);
      e.mutable_event()->set_slot(slot);
      e.mutable_event()->set_rank(c.rank());
      e.mutable_event()->set_signal(9);
      std::lock_guard<std::mutex> l(mu_);
      if (!s.running.erase(c.rank())) ++surprises_;
      send_bytes(s.agent, serialize(e));
      return;
    }
    case control::Command::spawn: {
      if (c.rank() < 0) return;  // a parked standby worker: the fakes park none anew
      control::Envelope e = envelope(m.epoch());
      e.mutable_event()->set_kind(control::Event::worker_started);
      e.mutable_event()->set_slot(slot);
      e.mutable_event()->set_rank(c.rank());
      e.mutable_event()->set_pid(kFakePid + c.rank());
      std::lock_guard<std::mutex> l(mu_);
      s.running.insert(c.rank());
      send_bytes(s.agent, serialize(e));
      return;
    }
    default:
      // reset, shutdown, stacks, etcd_start, refuse: not what a healthy scaled job is told.
      ++surprises_;
      return;
  }
}

void FakeCluster::store_loop() {
  try {
    std::shared_ptr<Store> store = connect_etcd_store(o_.store_addr);
    std::vector<std::shared_ptr<Store>> writers;
    for (int i = 0; i < std::max(1, o_.store_threads); ++i)
      writers.push_back(connect_etcd_store(o_.store_addr));
    // Writes `value_of(rank)` under `key_of(rank)` for every running rank, split among the
    // writer connections: each fake rank writes its own key, as each worker does.
    auto write_all = [&](const std::vector<int>& ranks, auto key_of, auto value_of) {
      std::vector<std::thread> ts;
      for (size_t w = 0; w < writers.size(); ++w)
        ts.emplace_back([&, w] {
          for (size_t i = w; i < ranks.size(); i += writers.size())
            writers[w]->set(key_of(ranks[i]), value_of(ranks[i]));
        });
      for (auto& t : ts) t.join();
    };
    auto running = [&] {
      std::vector<int> out;
      std::lock_guard<std::mutex> l(mu_);
      for (const auto& s : slots_) out.insert(out.end(), s->running.begin(), s->running.end());
      return out;
    };
    while (!stop_) {
      int next = 0;
      {
        std::lock_guard<std::mutex> l(mu_);
        next = epoch_ + 1;
      }
      if (!store->try_get(keys::abort_key(next))) {
        std::this_thread::sleep_for(kStorePoll);
        continue;
      }
      // 2. Every surviving rank aborts and acks with the step it holds.
      membership::Ack ack;
      {
        std::lock_guard<std::mutex> l(mu_);
        frozen_step_ = step_now();
        in_transition_ = true;
        ack.set_steps_completed(frozen_step_);
        ack.set_step_in_flight(frozen_step_ + 1);
      }
      write_all(
          running(), [&](int r) { return keys::ack_key(next, r); },
          [&](int r) {
            membership::Ack mine = ack;
            mine.set_rank(r);
            return mine.SerializeAsString();
          });
      // 4. The rebuild: every rank of the new membership restores and goes on.
      std::optional<membership::Rebuild> rb;
      while (!stop_ && !rb) {
        rb = try_get_message<membership::Rebuild>(*store, keys::rebuild_key(next));
        if (!rb) std::this_thread::sleep_for(kStorePoll);
      }
      if (!rb) break;
      {
        std::lock_guard<std::mutex> l(mu_);
        rebuilds_.push_back(*rb);
        epoch_ = next;
        in_transition_ = false;
        step_base_ = std::max<int64_t>(0, rb->restore_step());
        step_origin_ = Clock::now();
      }
      store::Time t;
      t.set_at(recovery::unix_now());
      const std::string restored = t.SerializeAsString();
      write_all(
          running(), [&](int r) { return keys::restored_key(next, r); },
          [&](int) { return restored; });
      restored_epoch_ = next;
    }
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> l(mu_);
    error_ = std::string("the store: ") + e.what();
  }
}

}  // namespace keel::bench
