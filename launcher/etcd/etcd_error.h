// Typed failures of keel's etcd client. EtcdUnavailable is the one keel is built to survive:
// no quorum, or no member answered within the call's deadline; the caller waits and tries
// again (decisions pause, training does not). LostLeadership tells a controller candidate to
// stop acting at once. Bad use (an empty key, a lease of 0 s) is a plain keel::Error from
// KEEL_CHECK; etcd refusing a request (an unknown lease, a request too large) is EtcdError.
#pragma once

#include <string>

#include "runtime/check.h"

namespace keel {

// etcd refused or failed a request. code() is the gRPC status code (grpc::StatusCode).
class EtcdError : public Error {
 public:
  EtcdError(const std::string& what, int code) : Error(what), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

// No quorum, or no member answered within the deadline. The message names the endpoints and
// the last gRPC status.
class EtcdUnavailable : public EtcdError {
 public:
  EtcdUnavailable(const std::string& what, int code) : EtcdError(what, code) {}
};

// This candidate does not lead (any more): its lease lapsed or was revoked, it resigned, or a
// fenced write found its leader key gone. Nothing was written.
class LostLeadership : public Error {
 public:
  explicit LostLeadership(const std::string& what) : Error(what) {}
};

}  // namespace keel
