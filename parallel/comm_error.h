// Typed failures of the data plane. These are the failures keel is built to survive: the
// caller (the Trainer, later the recovery protocol) catches them, aborts its communicators
// and rebuilds for a new epoch. None of them is ever turned into a process abort.
#pragma once

#include <string>

#include "runtime/check.h"

namespace keel {

// Base of all communicator failures. A communicator that threw one is broken: every later
// call throws again; build a new one.
class CommError : public Error {
 public:
  explicit CommError(const std::string& what) : Error(what) {}
};

// The call did not complete within its timeout (a hung or very slow peer).
class CommTimeout : public CommError {
 public:
  explicit CommTimeout(const std::string& what) : CommError(what) {}
};

// abort() was called on this communicator (possibly from another thread).
class CommAborted : public CommError {
 public:
  explicit CommAborted(const std::string& what) : CommError(what) {}
};

// A peer closed its connection or is unreachable: it died, or aborted itself.
class PeerFailure : public CommError {
 public:
  PeerFailure(const std::string& what, int peer) : CommError(what), peer_(peer) {}
  int peer() const { return peer_; }  // rank in the communicator's group

 private:
  int peer_;
};

}  // namespace keel
