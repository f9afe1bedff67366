#include "parallel/sealed_channel.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "runtime/check.h"

namespace keel {

using detail::Clock;
using detail::IoResult;

namespace {

std::atomic<SealPolicy> g_policy{SealPolicy::kBetweenMachines};

constexpr size_t kNonceBytes = 12;

// Fetched once: each key set up with it then takes no lock of OpenSSL's method store, as an
// implicit fetch (EVP_aes_256_gcm()) does each time.
const EVP_CIPHER* aes_256_gcm() {
  static const EVP_CIPHER* const cipher = [] {
    KEEL_CHECK(OPENSSL_init_crypto(OPENSSL_INIT_LOAD_CONFIG, nullptr) == 1,
               "OpenSSL failed to start");
    EVP_CIPHER* c = EVP_CIPHER_fetch(nullptr, "AES-256-GCM", nullptr);
    KEEL_CHECK(c != nullptr, "OpenSSL has no AES-256-GCM (its default provider missing?)");
    return c;
  }();
  return cipher;
}

bool read_name(int fd, bool peer, sockaddr_storage* ss) {
  socklen_t len = sizeof(*ss);
  auto* sa = reinterpret_cast<sockaddr*>(ss);
  return (peer ? ::getpeername(fd, sa, &len) : ::getsockname(fd, sa, &len)) == 0;
}

bool loopback(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in&>(ss).sin_addr.s_addr) >> 24) == 127;
  if (ss.ss_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6&>(ss).sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&a)) return true;
    // ::ffff:127.x.y.z
    return IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127;
  }
  return false;
}

bool same_address(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET)
    return reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in&>(b).sin_addr.s_addr;
  if (a.ss_family == AF_INET6)
    return std::memcmp(&reinterpret_cast<const sockaddr_in6&>(a).sin6_addr,
                       &reinterpret_cast<const sockaddr_in6&>(b).sin6_addr, sizeof(in6_addr)) == 0;
  return a.ss_family == AF_UNIX;
}

}  // namespace

void set_seal_policy(SealPolicy p) {
  g_policy.store(p);
}
SealPolicy seal_policy() {
  return g_policy.load();
}
const char* seal_policy_name(SealPolicy p) {
  switch (p) {
    case SealPolicy::kBetweenMachines:
      return "between_machines";
    case SealPolicy::kAlways:
      return "always";
    case SealPolicy::kNever:
      return "never";
  }
  return "?";
}

SealPolicy seal_policy_of(const config::SecurityConfig& c) {
  switch (c.encrypt()) {
    case config::SecurityConfig::always:
      return SealPolicy::kAlways;
    case config::SecurityConfig::never:
      return SealPolicy::kNever;
    default:
      return SealPolicy::kBetweenMachines;
  }
}

bool same_machine(int fd) {
  sockaddr_storage mine{}, theirs{};
  // An address that cannot be read is not known to be local: seal.
  if (!read_name(fd, false, &mine) || !read_name(fd, true, &theirs)) return false;
  return (loopback(mine) && loopback(theirs)) || same_address(mine, theirs);
}

bool seals(int fd, SealPolicy policy) {
  if (policy == SealPolicy::kNever) return false;
  return policy == SealPolicy::kAlways || !same_machine(fd);
}

struct RecordCipher::Impl {
  EVP_CIPHER_CTX* ctx = nullptr;
  uint64_t next = 0;  // the next record's number: its nonce

  std::array<uint8_t, kNonceBytes> nonce() {
    std::array<uint8_t, kNonceBytes> iv{};
    for (int i = 0; i < 8; ++i) iv[size_t(4 + i)] = static_cast<uint8_t>(next >> (8 * i));
    ++next;
    return iv;
  }
};

void prepare_sealing() {
  aes_256_gcm();
}

RecordCipher::RecordCipher(const std::array<uint8_t, 32>& key, bool seal)
    : impl_(std::make_unique<Impl>()) {
  impl_->ctx = EVP_CIPHER_CTX_new();
  KEEL_CHECK(impl_->ctx != nullptr, "EVP_CIPHER_CTX_new failed");
  const int ok = seal ? EVP_EncryptInit_ex(impl_->ctx, aes_256_gcm(), nullptr, key.data(), nullptr)
                      : EVP_DecryptInit_ex(impl_->ctx, aes_256_gcm(), nullptr, key.data(), nullptr);
  KEEL_CHECK(ok == 1, "AES-256-GCM key setup failed");
}

RecordCipher::~RecordCipher() {
  EVP_CIPHER_CTX_free(impl_->ctx);
}

size_t RecordCipher::length(const uint8_t* header) {
  size_t n = 0;
  for (size_t i = 0; i < kHeaderBytes; ++i) n |= size_t{header[i]} << (8 * i);
  return n;
}

void RecordCipher::seal(const void* in, size_t n, uint8_t* out) {
  for (size_t i = 0; i < kHeaderBytes; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  EVP_CIPHER_CTX* ctx = impl_->ctx;
  const auto iv = impl_->nonce();
  uint8_t* body = out + kHeaderBytes;
  int len = 0;
  KEEL_CHECK(EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, iv.data()) == 1 &&
                 EVP_EncryptUpdate(ctx, nullptr, &len, out, int(kHeaderBytes)) == 1 &&
                 EVP_EncryptUpdate(ctx, body, &len, static_cast<const uint8_t*>(in), int(n)) == 1 &&
                 EVP_EncryptFinal_ex(ctx, body + len, &len) == 1 &&
                 EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, int(kTagBytes), body + n) == 1,
             "AES-256-GCM sealing failed");
}

bool RecordCipher::open(const uint8_t* header, uint8_t* body, size_t n, const uint8_t* tag) {
  EVP_CIPHER_CTX* ctx = impl_->ctx;
  const auto iv = impl_->nonce();
  int len = 0;
  KEEL_CHECK(EVP_DecryptInit_ex(ctx, nullptr, nullptr, nullptr, iv.data()) == 1 &&
                 EVP_DecryptUpdate(ctx, nullptr, &len, header, int(kHeaderBytes)) == 1 &&
                 EVP_DecryptUpdate(ctx, body, &len, body, int(n)) == 1 &&
                 EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, int(kTagBytes),
                                     const_cast<uint8_t*>(tag)) == 1,
             "AES-256-GCM opening failed");
  return EVP_DecryptFinal_ex(ctx, body + len, &len) == 1;
}

SealedChannel::SealedChannel(int fd, const SessionKeys& keys, bool client, SealPolicy policy)
    : fd_(fd) {
  if (!seals(fd, policy)) return;
  out_ = std::make_unique<RecordCipher>(client ? keys.to_server : keys.to_client, true);
  in_ = std::make_unique<RecordCipher>(client ? keys.to_client : keys.to_server, false);
}

SealedChannel::SealedChannel() = default;
SealedChannel::~SealedChannel() = default;
SealedChannel::SealedChannel(SealedChannel&&) noexcept = default;
SealedChannel& SealedChannel::operator=(SealedChannel&&) noexcept = default;

IoResult SealedChannel::send(const void* buf, size_t len, Clock::time_point deadline,
                             std::string* err) {
  if (!out_) return detail::send_all(fd_, buf, len, deadline, err);
  const auto* p = static_cast<const uint8_t*>(buf);
  for (size_t off = 0; off < len; off += kMaxRecord) {
    const size_t n = std::min(kMaxRecord, len - off);
    wire_.resize(RecordCipher::kHeaderBytes + n + RecordCipher::kTagBytes);
    auto* w = reinterpret_cast<uint8_t*>(wire_.data());
    out_->seal(p + off, n, w);
    IoResult r = detail::send_all(fd_, w, wire_.size(), deadline, err);
    if (r != IoResult::kOk) return r;
  }
  return IoResult::kOk;
}

IoResult SealedChannel::recv(void* buf, size_t len, Clock::time_point deadline, std::string* err) {
  if (!in_) return detail::recv_all(fd_, buf, len, deadline, err);
  char* p = static_cast<char*>(buf);
  while (len > 0) {
    if (held_pos_ < held_end_) {
      const size_t n = std::min(len, held_end_ - held_pos_);
      std::memcpy(p, held_.data() + held_pos_, n);
      held_pos_ += n;
      p += n;
      len -= n;
      continue;
    }
    size_t got = 0;
    IoResult r = recv_record(p, len, &got, deadline, err);
    if (r != IoResult::kOk) return r;
    p += got;
    len -= got;
  }
  return IoResult::kOk;
}

IoResult SealedChannel::recv_record(char* dst, size_t room, size_t* got, Clock::time_point deadline,
                                    std::string* err) {
  constexpr size_t kHeader = RecordCipher::kHeaderBytes;
  uint8_t header[kHeader];
  IoResult r = detail::recv_all(fd_, header, sizeof(header), deadline, err);
  if (r != IoResult::kOk) return r;
  const size_t n = RecordCipher::length(header);
  auto refuse = [&](const std::string& why) {
    *err = "sealed record " + why;
    note_refusal(detail::concat("a sealed connection from ", peer_address(fd_), ": ", *err));
    return IoResult::kClosed;
  };
  if (n == 0 || n > kMaxRecord) return refuse(detail::concat("of ", n, " bytes: garbled"));
  // A record that fits goes straight where the caller wants it and is opened there; a
  // longer one into the held buffer, whose rest later reads take.
  uint8_t* body = reinterpret_cast<uint8_t*>(dst);
  if (n > room) {
    held_.resize(kMaxRecord);
    body = reinterpret_cast<uint8_t*>(held_.data());
  }
  uint8_t tag[RecordCipher::kTagBytes];
  r = detail::recv_all(fd_, body, n, deadline, err);
  if (r == IoResult::kOk) r = detail::recv_all(fd_, tag, sizeof(tag), deadline, err);
  if (r != IoResult::kOk) return r;
  if (!in_->open(header, body, n, tag))
    return refuse("failed its check (altered in flight, replayed, or not of this connection)");
  if (n > room) {
    std::memcpy(dst, held_.data(), room);
    held_pos_ = room;
    held_end_ = n;
    *got = room;
  } else {
    *got = n;
  }
  return IoResult::kOk;
}

}  // namespace keel
