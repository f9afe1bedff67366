#include "parallel/nccl/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>

#include "parallel/nccl/nccl_check.h"

namespace keel {
namespace {

using Clock = std::chrono::steady_clock;

// What precedes every point-to-point payload (see the header). 16 bytes, so it is one small
// NCCL message.
struct P2pHeader {
  uint32_t magic;
  uint32_t tag;
  uint64_t bytes;
};
static_assert(sizeof(P2pHeader) == 16);
constexpr uint32_t kHeaderMagic = 0x6b65656cu;  // "keel"

std::string to_hex(const void* data, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    const auto b = static_cast<const unsigned char*>(data)[i];
    s.push_back(digits[b >> 4]);
    s.push_back(digits[b & 15]);
  }
  return s;
}

bool from_hex(const std::string& s, void* out, size_t n) {
  if (s.size() != 2 * n) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < n; ++i) {
    int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    static_cast<unsigned char*>(out)[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return true;
}

// Short waits are the common case (a TP all-reduce takes tens of microseconds), so polling
// yields at first and only then sleeps, to stay cheap on a CPU that also runs the data loader.
void backoff(int& spins) {
  if (spins++ < 2000) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// Makes `device` current for a scope and restores the caller's device after: abort() and the
// destructor may run on a thread that drives another GPU.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    cudaSetDevice(device);
    cudaGetLastError();
  }
  ~DeviceScope() {
    if (prev_ >= 0) cudaSetDevice(prev_);
    cudaGetLastError();
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = -1;
};

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(const NcclCommOptions& opts)
      : name_(opts.name),
        rank_(opts.rank),
        size_(opts.size),
        device_(opts.device),
        timeout_(opts.timeout) {}

  ~NcclCommunicator() override {
    // A destructor must not wait on peers that may be gone, so the NCCL communicator is
    // aborted (local teardown) rather than finalized (which flushes with the peers). A call
    // that completed left nothing in flight; one that failed aborted its kernels already.
    DeviceScope device(device_);
    {
      std::lock_guard<std::mutex> lock(nccl_mu_);
      destroy_comm_locked();
    }
    // Should a kernel outlive the abort anyway, leak the few bytes it may touch rather than
    // hang here: cudaFree would wait for the device.
    bool idle = stream_ == nullptr;
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (!idle && Clock::now() < until) {
      idle = cudaStreamQuery(stream_) != cudaErrorNotReady;
      cudaGetLastError();  // see run()
      if (!idle) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);  // released once its work is done
    if (!idle) return;
    if (ready_ != nullptr) cudaEventDestroy(ready_);
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (device_scratch_ != nullptr) cudaFree(device_scratch_);
    if (host_headers_ != nullptr) cudaFreeHost(host_headers_);
  }

  void init(Store& store) {
    KEEL_CHECK(size_ >= 1 && rank_ >= 0 && rank_ < size_, "bad NCCL group for '", name_, "': rank ",
               rank_, " of ", size_);
    KEEL_CHECK(timeout_.count() > 0, "NCCL communicator '", name_, "' needs a positive timeout");
    const auto deadline = Clock::now() + timeout_;
    check_cuda("init", cudaSetDevice(device_), "cudaSetDevice");
    // Non-blocking: a collective stuck on a dead peer must not stall the legacy default stream,
    // which every call below uses to order itself after compute.
    check_cuda("init", cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags");
    check_cuda("init", cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming),
               "cudaEventCreateWithFlags");
    check_cuda("init", cudaEventCreateWithFlags(&done_, cudaEventDisableTiming),
               "cudaEventCreateWithFlags");
    // Device scratch: send header | receive header | barrier word.
    check_cuda("init", cudaMalloc(&device_scratch_, 2 * sizeof(P2pHeader) + sizeof(float)),
               "cudaMalloc");
    check_cuda("init", cudaMemset(device_scratch_, 0, 2 * sizeof(P2pHeader) + sizeof(float)),
               "cudaMemset");
    check_cuda("init", cudaMallocHost(&host_headers_, 2 * sizeof(P2pHeader)), "cudaMallocHost");

    ncclUniqueId id;
    const std::string key = name_ + "/nccl_id";
    if (rank_ == 0) {
      KEEL_CHECK_NCCL(ncclGetUniqueId(&id));
      // Hex, so any store implementation can carry it whatever its value encoding.
      store.set(key, to_hex(&id, sizeof(id)));
    } else {
      auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
      std::string hex = store.get(key, std::max(left, Millis(1)));
      KEEL_CHECK(from_hex(hex, &id, sizeof(id)), "malformed NCCL id under '", key, "'");
    }

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = name_.c_str();
    ncclResult_t r;
    {
      std::lock_guard<std::mutex> lock(nccl_mu_);
      r = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    }
    if (r != ncclSuccess && r != ncclInProgress) fail_nccl("init", r, -1);
    wait_comm_ready("init", deadline, -1);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  Millis default_timeout() const override { return timeout_; }

  void all_reduce(float* buf, size_t n, ReduceOp op, Millis timeout) override {
    Call call(this, "all_reduce", timeout);
    if (n == 0) return;
    const ncclRedOp_t nop = op == ReduceOp::kMax ? ncclMax : ncclSum;
    run(call, -1,
        [&](ncclComm_t c) { return ncclAllReduce(buf, buf, n, ncclFloat32, nop, c, stream_); });
    // Ring-algorithm volume, the convention of nccl-tests' bus bandwidth.
    count(2 * (size_ - 1) * n * sizeof(float) / size_, 2 * (size_ - 1) * n * sizeof(float) / size_);
  }

  void reduce_scatter(float* buf, size_t chunk, Millis timeout) override {
    Call call(this, "reduce_scatter", timeout);
    if (chunk == 0) return;
    run(call, -1, [&](ncclComm_t c) {
      return ncclReduceScatter(buf, buf + rank_ * chunk, chunk, ncclFloat32, ncclSum, c, stream_);
    });
    count((size_ - 1) * chunk * sizeof(float), (size_ - 1) * chunk * sizeof(float));
  }

  void all_gather(float* buf, size_t chunk, Millis timeout) override {
    Call call(this, "all_gather", timeout);
    if (chunk == 0) return;
    run(call, -1, [&](ncclComm_t c) {
      return ncclAllGather(buf + rank_ * chunk, buf, chunk, ncclFloat32, c, stream_);
    });
    count((size_ - 1) * chunk * sizeof(float), (size_ - 1) * chunk * sizeof(float));
  }

  void broadcast(void* buf, size_t bytes, int root, Millis timeout) override {
    Call call(this, "broadcast", timeout);
    KEEL_CHECK(root >= 0 && root < size_, "broadcast root ", root, " outside group of ", size_);
    if (bytes == 0) return;
    run(call, -1,
        [&](ncclComm_t c) { return ncclBroadcast(buf, buf, bytes, ncclUint8, root, c, stream_); });
    if (size_ > 1) count(rank_ == root ? bytes : 0, rank_ == root ? 0 : bytes);
  }

  void send(const void* buf, size_t bytes, int peer, uint32_t tag, Millis timeout) override {
    Call call(this, "send", timeout);
    check_peer(peer);
    exchange(call, buf, bytes, peer, nullptr, 0, -1, tag);
  }

  void recv(void* buf, size_t bytes, int peer, uint32_t tag, Millis timeout) override {
    Call call(this, "recv", timeout);
    check_peer(peer);
    exchange(call, nullptr, 0, -1, buf, bytes, peer, tag);
  }

  void send_recv(const void* send_buf, size_t send_bytes, int send_peer, void* recv_buf,
                 size_t recv_bytes, int recv_peer, uint32_t tag, Millis timeout) override {
    Call call(this, "send_recv", timeout);
    if (send_buf != nullptr) check_peer(send_peer);
    if (recv_buf != nullptr) check_peer(recv_peer);
    exchange(call, send_buf, send_bytes, send_buf != nullptr ? send_peer : -1, recv_buf, recv_bytes,
             recv_buf != nullptr ? recv_peer : -1, tag);
  }

  void barrier(Millis timeout) override {
    Call call(this, "barrier", timeout);
    float* word =
        reinterpret_cast<float*>(static_cast<char*>(device_scratch_) + 2 * sizeof(P2pHeader));
    run(call, -1, [&](ncclComm_t c) {
      return ncclAllReduce(word, word, 1, ncclFloat32, ncclSum, c, stream_);
    });
  }

  void abort() override {
    aborted_.store(true);
    DeviceScope device(device_);
    std::lock_guard<std::mutex> lock(nccl_mu_);
    if (comm_ == nullptr) return;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    // Revoke first: it stops the in-flight kernels without freeing anything, and we let it
    // settle (briefly; a revoke that does not settle is followed by the abort anyway) so the
    // abort below tears down a quiet communicator.
    if (ncclCommRevoke(comm_, NCCL_REVOKE_DEFAULT) == ncclInProgress) {
      const auto until = Clock::now() + std::chrono::seconds(2);
      ncclResult_t state = ncclInProgress;
      while (Clock::now() < until && ncclCommGetAsyncError(comm_, &state) == ncclSuccess &&
             state == ncclInProgress) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
#endif
    destroy_comm_locked();
  }

  bool aborted() const override {
    return aborted_.load();
  }

  CommStats stats() const override {
    std::lock_guard<std::mutex> lock(stats_mu_);
    return stats_;
  }

 private:
  enum class Failure { kNone, kTimeout, kPeer, kError };

  // One public call: checks the communicator is usable, selects the device, computes the
  // deadline, and adds the call's wall time to the stats however it ends.
  struct Call {
    Call(NcclCommunicator* comm, const char* what, Millis timeout)
        : self(comm), what(what), start(Clock::now()) {
      deadline = start + (timeout.count() > 0 ? timeout : comm->timeout_);
      self->check_usable(what);
      self->check_cuda(what, cudaSetDevice(self->device_), "cudaSetDevice");
    }
    ~Call() {
      std::chrono::duration<double> d = Clock::now() - start;
      std::lock_guard<std::mutex> lock(self->stats_mu_);
      self->stats_.wait_s += d.count();
    }
    NcclCommunicator* self;
    const char* what;
    Clock::time_point start;
    Clock::time_point deadline;
  };

  // cudaError_t → CommError that breaks the communicator (a CUDA error here is not a bug in
  // the caller's arguments but a device or driver failure mid-operation).
  void check_cuda(const char* what, cudaError_t err, const char* expr) {
    if (err == cudaSuccess) return;
    fail(Failure::kError,
         detail::concat(what, ": ", expr, ": ", cudaGetErrorName(err), ": ",
                        cudaGetErrorString(err)),
         -1);
  }

  void check_peer(int peer) const {
    KEEL_CHECK(peer >= 0 && peer < size_, "peer ", peer, " outside NCCL group '", name_,
               "' of size ", size_);
  }

  void check_usable(const char* what) {
    if (aborted_.load()) {
      throw CommAborted(detail::concat(prefix(), what, ": communicator was aborted"));
    }
    std::lock_guard<std::mutex> lock(failure_mu_);
    if (failure_ == Failure::kNone) return;
    const std::string msg = detail::concat(
        prefix(), what, ": communicator is broken by an earlier failure: ", failure_msg_);
    throw_typed(failure_, msg, failure_peer_);
  }

  std::string prefix() const {
    return detail::concat("NCCL '", name_, "' rank ", rank_, ": ");
  }

  [[noreturn]] static void throw_typed(Failure kind, const std::string& msg, int peer) {
    switch (kind) {
      case Failure::kTimeout:
        throw CommTimeout(msg);
      case Failure::kPeer:
        throw PeerFailure(msg, peer);
      default:
        throw CommError(msg);
    }
  }

  // Records the first failure, tears the NCCL communicator down so nothing of it keeps
  // running on the device, and throws. An abort() that raced with it wins: the caller asked.
  [[noreturn]] void fail(Failure kind, const std::string& msg, int peer) {
    {
      std::lock_guard<std::mutex> lock(failure_mu_);
      if (failure_ == Failure::kNone) {
        failure_ = kind;
        failure_msg_ = msg;
        failure_peer_ = peer;
      }
    }
    {
      std::lock_guard<std::mutex> lock(nccl_mu_);
      destroy_comm_locked();
    }
    if (aborted_.load()) throw CommAborted(prefix() + "aborted");
    throw_typed(kind, prefix() + msg, peer);
  }

  // A dead or unreachable peer shows up as a remote or system error; anything else is a
  // failure of ours.
  [[noreturn]] void fail_nccl(const char* what, ncclResult_t r, int peer) {
    const char* last = ncclGetLastError(nullptr);
    std::string msg =
        detail::concat(what, ": ", ncclGetErrorString(r), (last != nullptr && *last) ? ": " : "",
                       last != nullptr ? last : "");
    const bool peer_side = r == ncclRemoteError || r == ncclSystemError;
    fail(peer_side ? Failure::kPeer : Failure::kError, msg, peer);
  }

  [[noreturn]] void fail_timeout(const char* what, Clock::time_point start, int peer) {
    auto ms = std::chrono::duration_cast<Millis>(Clock::now() - start).count();
    fail(Failure::kTimeout, detail::concat(what, " did not complete after ", ms, " ms"), peer);
  }

  // Under nccl_mu_. After this, comm_ is null and every NCCL call is refused.
  void destroy_comm_locked() {
    if (comm_ == nullptr) return;
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  // Polls the communicator's state until it leaves ncclInProgress: after init, and after a
  // non-blocking call that returned ncclInProgress (its work is not on the stream until then).
  void wait_comm_ready(const char* what, Clock::time_point deadline, int peer) {
    const auto start = Clock::now();
    int spins = 0;
    for (;;) {
      if (aborted_.load()) throw CommAborted(prefix() + what + ": aborted");
      ncclResult_t state = ncclInProgress;
      ncclResult_t r;
      {
        std::lock_guard<std::mutex> lock(nccl_mu_);
        if (comm_ == nullptr) throw CommAborted(prefix() + what + ": aborted");
        r = ncclCommGetAsyncError(comm_, &state);
      }
      if (r != ncclSuccess) fail_nccl(what, r, peer);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail_nccl(what, state, peer);
      if (Clock::now() >= deadline) fail_timeout(what, start, peer);
      backoff(spins);
    }
  }

  // Queues `enqueue` (NCCL calls on stream_, under nccl_mu_) after the device's pending
  // compute, then `after` (CUDA calls on stream_), then waits for all of it.
  template <typename Enqueue, typename After>
  void run(const Call& call, int peer, Enqueue&& enqueue, After&& after) {
    const char* what = call.what;
    // The legacy default stream waits for every blocking stream of the device, so this event
    // completes once the compute queued so far (e.g. the gradients to reduce) is done.
    check_cuda(what, cudaEventRecord(ready_, cudaStreamLegacy), "cudaEventRecord(ready)");
    check_cuda(what, cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
    ncclResult_t r;
    {
      std::lock_guard<std::mutex> lock(nccl_mu_);
      if (comm_ == nullptr) throw CommAborted(prefix() + what + ": aborted");
      r = enqueue(comm_);
    }
    if (r == ncclInProgress) {
      wait_comm_ready(what, call.deadline, peer);
    } else if (r != ncclSuccess) {
      fail_nccl(what, r, peer);
    }
    after();
    check_cuda(what, cudaEventRecord(done_, stream_), "cudaEventRecord(done)");
    int spins = 0;
    for (;;) {
      if (aborted_.load()) throw CommAborted(prefix() + what + ": aborted");
      cudaError_t e = cudaEventQuery(done_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) check_cuda(what, e, "cudaEventQuery");
      // "Not ready" is recorded as the thread's last error; left there, the next kernel launch
      // check anywhere on this thread (cudaGetLastError) would report it as a failure.
      cudaGetLastError();
      ncclResult_t state = ncclSuccess;
      {
        std::lock_guard<std::mutex> lock(nccl_mu_);
        if (comm_ == nullptr) throw CommAborted(prefix() + what + ": aborted");
        r = ncclCommGetAsyncError(comm_, &state);
      }
      if (r != ncclSuccess) fail_nccl(what, r, peer);
      if (state != ncclSuccess && state != ncclInProgress) fail_nccl(what, state, peer);
      if (Clock::now() >= call.deadline) fail_timeout(what, call.start, peer);
      backoff(spins);
    }
  }
  template <typename Enqueue>
  void run(const Call& call, int peer, Enqueue&& enqueue) {
    run(call, peer, std::forward<Enqueue>(enqueue), [] {});
  }

  // Point-to-point in two rounds (see the header): headers both ways, check, payloads both
  // ways. A side with peer -1 is skipped. Grouping the send and the receive makes an exchange
  // between two ranks in opposite directions safe.
  void exchange(const Call& call, const void* send_buf, size_t send_bytes, int send_peer,
                void* recv_buf, size_t recv_bytes, int recv_peer, uint32_t tag) {
    const char* what = call.what;
    const bool sending = send_peer >= 0, receiving = recv_peer >= 0;
    if (!sending && !receiving) return;
    const int peer = receiving ? recv_peer : send_peer;
    auto* dev_headers = static_cast<P2pHeader*>(device_scratch_);
    auto* host_headers = static_cast<P2pHeader*>(host_headers_);
    if (sending) {
      host_headers[0] = P2pHeader{kHeaderMagic, tag, send_bytes};
      check_cuda(what,
                 cudaMemcpyAsync(&dev_headers[0], &host_headers[0], sizeof(P2pHeader),
                                 cudaMemcpyHostToDevice, stream_),
                 "cudaMemcpyAsync(header)");
    }
    run(
        call, peer,
        [&](ncclComm_t c) {
          return grouped(c, sending ? &dev_headers[0] : nullptr, sizeof(P2pHeader), send_peer,
                         receiving ? &dev_headers[1] : nullptr, sizeof(P2pHeader), recv_peer);
        },
        [&] {
          if (receiving) {
            check_cuda(what,
                       cudaMemcpyAsync(&host_headers[1], &dev_headers[1], sizeof(P2pHeader),
                                       cudaMemcpyDeviceToHost, stream_),
                       "cudaMemcpyAsync(header)");
          }
        });
    if (receiving) {
      const P2pHeader h = host_headers[1];
      if (h.magic != kHeaderMagic || h.tag != tag || h.bytes != recv_bytes) {
        fail(Failure::kError,
             detail::concat(what, ": expected tag ", tag, " (", recv_bytes, " bytes) from peer ",
                            recv_peer, ", got ",
                            h.magic == kHeaderMagic ? "" : "a corrupt header: ", "tag ", h.tag,
                            " (", h.bytes, " bytes)"),
             recv_peer);
      }
    }
    const bool send_payload = sending && send_bytes > 0;
    const bool recv_payload = receiving && recv_bytes > 0;
    if (send_payload || recv_payload) {
      run(call, peer, [&](ncclComm_t c) {
        return grouped(c, send_payload ? send_buf : nullptr, send_bytes, send_peer,
                       recv_payload ? recv_buf : nullptr, recv_bytes, recv_peer);
      });
    }
    count(sending ? sizeof(P2pHeader) + send_bytes : 0,
          receiving ? sizeof(P2pHeader) + recv_bytes : 0);
  }

  // One NCCL group with an optional send and an optional receive (null buffer: skipped).
  ncclResult_t grouped(ncclComm_t c, const void* send_buf, size_t send_bytes, int send_peer,
                       void* recv_buf, size_t recv_bytes, int recv_peer) {
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return r;
    ncclResult_t rs = ncclSuccess, rr = ncclSuccess;
    if (send_buf != nullptr) rs = ncclSend(send_buf, send_bytes, ncclUint8, send_peer, c, stream_);
    if (recv_buf != nullptr) rr = ncclRecv(recv_buf, recv_bytes, ncclUint8, recv_peer, c, stream_);
    r = ncclGroupEnd();
    if (rs != ncclSuccess && rs != ncclInProgress) return rs;
    if (rr != ncclSuccess && rr != ncclInProgress) return rr;
    return r;
  }

  void count(uint64_t sent, uint64_t received) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.bytes_sent += sent;
    stats_.bytes_received += received;
  }

  const std::string name_;
  const int rank_, size_, device_;
  const Millis timeout_;

  std::atomic<bool> aborted_{false};
  // Guards comm_ and every NCCL call on it, so abort() from another thread never frees the
  // communicator under a call. Non-blocking NCCL calls return at once, so it is held briefly.
  std::mutex nccl_mu_;
  ncclComm_t comm_ = nullptr;

  std::mutex failure_mu_;
  Failure failure_ = Failure::kNone;
  std::string failure_msg_;
  int failure_peer_ = -1;

  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  cudaEvent_t done_ = nullptr;
  void* device_scratch_ = nullptr;
  void* host_headers_ = nullptr;  // pinned: send header | received header

  mutable std::mutex stats_mu_;
  CommStats stats_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Store> store,
                                                     const NcclCommOptions& opts) {
  KEEL_CHECK(store != nullptr, "make_nccl_communicator needs a store");
  auto comm = std::make_unique<NcclCommunicator>(opts);
  comm->init(*store);  // on failure, comm's destructor releases what init created
  return comm;
}

}  // namespace keel
