// The backup service's wire format, shared by its server (ckpt/backup_server.cc) and client
// (ckpt/backup_client.cc). Internal to ckpt/.
//
// Both ends are keel builds on the same architecture, so structs go as they are in memory: a
// request is a RequestHeader, followed for PUSH by `bytes` of payload; a reply is a
// ReplyHeader and `msg_len` bytes of message, followed for a successful FETCH by `bytes` of
// payload, for a FETCH_RANGE by the `bytes` at `offset` of it. VERIFY (sent by a client whose
// fetched payload did not match) checks the held slot: kOk, or kRefused once the damaged slot
// is dropped. Requests on one connection are answered in order, over a channel that is
// sealed between machines (parallel/sealed_channel.h).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "ckpt/checksum.h"
#include "parallel/sealed_channel.h"

namespace keel::backup_wire {

constexpr uint32_t kRequestMagic = 0x4b42524bu;  // "KRBK"
constexpr uint32_t kReplyMagic = 0x4b425250u;    // "PRBK"
enum Op : uint32_t { kPush = 1, kFetch = 2, kVerify = 3, kFetchRange = 4 };
enum Status : int32_t { kOk = 0, kNotHeld = 1, kRefused = 2 };
// Transfers go in pieces, each with its own deadline: the timeout bounds a stall, not the
// time a large snapshot legitimately takes. A received piece is checksummed right after it
// lands, while it is still in the (last-level) cache.
constexpr size_t kChunk = size_t{4} << 20;
// A GPU state is received through a host buffer of this size, not one as large as the state.
constexpr size_t kStaging = size_t{16} << 20;
// No state of one rank comes near this; a larger claim is a garbled header.
constexpr uint64_t kMaxPayload = uint64_t{1} << 40;
constexpr uint32_t kMaxMessage = 1 << 16;

// RequestHeader::flags of a push: the payload is the owner's verified snapshot (SDC checks),
// kept in the holder's verified slot beside the two newest backups.
constexpr uint32_t kPushVerified = 1;

struct RequestHeader {
  uint32_t magic;
  uint32_t op;
  int32_t owner;
  uint32_t flags;
  int64_t step;
  uint64_t fingerprint;
  uint64_t bytes;
  uint64_t checksum;
  uint64_t offset;  // FETCH_RANGE: the first byte of the payload asked for
};

struct ReplyHeader {
  uint32_t magic;
  int32_t status;
  uint32_t msg_len;
  uint32_t reserved;
  int64_t step;
  uint64_t fingerprint;
  uint64_t bytes;
  uint64_t checksum;
};

// Sends or receives `len` bytes in chunks, each chunk within `stall` of the previous one.
// With `sum`, received bytes are fed to it as they arrive.
detail::IoResult send_chunked(SealedChannel& ch, const void* buf, size_t len,
                              std::chrono::milliseconds stall, std::string* err);
detail::IoResult recv_chunked(SealedChannel& ch, void* buf, size_t len,
                              std::chrono::milliseconds stall, ChecksumStream* sum,
                              std::string* err);
// What a failed transfer says.
std::string io_text(detail::IoResult r, const std::string& err);

}  // namespace keel::backup_wire
