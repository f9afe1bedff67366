#include "launcher/etcd/etcd_watch.h"

#include <glog/logging.h>

#include <algorithm>

#include "launcher/etcd/detail/etcd_rpc.h"
#include "launcher/processes.h"

namespace keel {

namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// The longest a watch may take to be in place, at least: the first call of a new client opens
// its connections, a TLS handshake with each member (launcher/etcd/etcd_tls.h), which on a
// loaded machine can outlast a short call timeout (a standby promoted while its machine was
// busy died of a 1 s one).
constexpr milliseconds kSetupAtLeast{5000};

}  // namespace

EtcdWatch::EtcdWatch(EtcdClient& client, std::string key, bool prefix, Callback callback,
                     int64_t after_revision)
    : client_(client),
      key_(std::move(key)),
      prefix_(prefix),
      callback_(std::move(callback)),
      next_revision_(after_revision > 0 ? after_revision + 1 : 0) {
  KEEL_CHECK(!key_.empty() || prefix_, "etcd watch: empty key");
  KEEL_CHECK(bool(callback_), "etcd watch: no callback");
  thread_ = std::thread([this] { run(); });
  std::unique_lock<std::mutex> lock(mu_);
  const milliseconds setup = std::max(client_.timeout(), kSetupAtLeast);
  if (!changed_.wait_for(lock, setup, [&] { return created_; })) {
    lock.unlock();
    cancel();
    throw EtcdUnavailable("etcd (" + client_.impl_->channels_now()->names + "): watch " + key_ +
                              ": not in place within " + std::to_string(setup.count()) + " ms",
                          int(grpc::StatusCode::DEADLINE_EXCEEDED));
  }
}

EtcdWatch::~EtcdWatch() {
  cancel();
}

void EtcdWatch::cancel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    if (context_) static_cast<grpc::ClientContext*>(context_)->TryCancel();
  }
  changed_.notify_all();
  if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id()) thread_.join();
}

void EtcdWatch::run() {
  set_process_name("keel-etcd-watch");
  EtcdClient::Impl& rpc = *client_.impl_;
  auto backoff = milliseconds(50);
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cancelled_) return;
    }
    size_t member = 0;
    // The members as of now (a replaced one's new address too), held while the stream is open.
    const std::shared_ptr<const EtcdChannels> ch = rpc.channels_now();
    EtcdMemberChannel& m = rpc.member(*ch, &member, steady_clock::now() + rpc.attempt);
    // The stream waits for its channel (wait_for_ready) with no deadline: opened on a member
    // that died, whose channel never connects again, it waited for ever and the watch with it
    // (a standby promoted just after slot 0 was lost with its member died of "not in place").
    // It is opened on a connected channel only; one that does not connect within an attempt
    // is passed over.
    if (!m.channel->WaitForConnected(std::chrono::system_clock::now() + rpc.attempt)) {
      rpc.pass_over(*ch, member);
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait_for(lock, backoff, [&] { return cancelled_; });
      backoff = std::min(backoff * 2, milliseconds(1000));
      continue;
    }
    grpc::ClientContext context;
    // A member without a leader ends the stream (etcd's "require leader"): its view is
    // stale, and the watch moves on instead of waiting there silently.
    context.AddMetadata("hasleader", "true");
    context.set_wait_for_ready(true);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cancelled_) return;
      context_ = &context;
    }
    auto stream = m.watch->Watch(&context);
    etcdserverpb::WatchRequest req;
    etcdserverpb::WatchCreateRequest* create = req.mutable_create_request();
    create->set_key(key_.empty() ? std::string(1, '\0') : key_);
    if (prefix_) create->set_range_end(etcd_prefix_end(key_));
    create->set_start_revision(next_revision_);
    etcdserverpb::WatchResponse resp;
    bool delivered = false;
    if (stream->Write(req)) {
      while (stream->Read(&resp)) {
        if (resp.created()) {
          // From now on: the first revision after the one the watch was created at.
          if (next_revision_ == 0) next_revision_ = resp.header().revision() + 1;
          std::lock_guard<std::mutex> lock(mu_);
          created_ = true;
          changed_.notify_all();
        }
        if (resp.compact_revision() > 0) {
          // The revisions asked for are compacted away: resume from the oldest kept.
          LOG(ERROR) << "etcd watch " << key_ << ": revisions before " << resp.compact_revision()
                     << " compacted, changes lost";
          next_revision_ = resp.compact_revision();
          break;
        }
        if (resp.canceled()) break;
        if (resp.events_size() == 0) continue;
        std::vector<EtcdEvent> events;
        events.reserve(resp.events_size());
        for (const auto& e : resp.events()) {
          const auto& kv = e.kv();
          events.push_back(EtcdEvent{
              e.type() == mvccpb::Event::DELETE ? EtcdEvent::Type::kDelete : EtcdEvent::Type::kPut,
              EtcdKeyValue{kv.key(), kv.value(), kv.create_revision(), kv.mod_revision(),
                           kv.lease()}});
        }
        next_revision_ = events.back().kv.mod_revision + 1;
        delivered = true;
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (cancelled_) break;
        }
        callback_(events);
      }
    }
    context.TryCancel();  // the stream may still be open (compacted, cancelled by etcd)
    const grpc::Status status = stream->Finish();
    std::unique_lock<std::mutex> lock(mu_);
    context_ = nullptr;
    if (cancelled_) return;
    // Ended by the member (it lost its leader, it died, it is cut off): the next member.
    if (!status.ok()) rpc.pass_over(*ch, member);
    LOG(INFO) << "etcd watch " << key_ << " reconnects (" << status.error_message() << ")";
    if (delivered) backoff = milliseconds(50);
    changed_.wait_for(lock, backoff, [&] { return cancelled_; });
    backoff = std::min(backoff * 2, milliseconds(1000));
  }
}

}  // namespace keel
