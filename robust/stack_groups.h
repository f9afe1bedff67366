// Which ranks are the outliers, from every worker's native stacks (the hang rule of last
// resort, DESIGN.md Failure handling): pure code, no processes. The agents capture the stacks
// (launcher/stack_capture.h); this groups them by text and names the culprits.
//
// The signal is each worker's main thread, the training thread: helper threads (progress
// reporter, snapshotter, ZeroMQ) look the same on every rank and only go into the summary.
// A main thread's signature is its frames without offsets, from the innermost frame of keel
// code outward, up to (not including) main(): so two ranks waiting in the same collective
// compare equal whether their innermost frame is poll() or recv(). Then, in order:
//   1. some ranks wait in a collective or the store (a wait marker in their innermost keel
//      frame) and fewer ranks do not: those few are the culprits (stuck in compute, a
//      livelock, a driver call);
//   2. else one signature is shared by more than half of the ranks: every rank outside it
//      is a culprit;
//   3. else (every rank differs, or a tie): no culprit.
// A rank whose stack could not be captured is never a culprit here; the reason names it.
#pragma once

#include <string>
#include <vector>

namespace keel {

// One rank's threads as captured; frames innermost first, as launcher/stack_capture.h
// writes them ("function+0xOFF (module)" or "?? (module+0xOFF)").
struct RankThreads {
  int rank = -1;
  struct Thread {
    std::string name;
    std::vector<std::string> frames;
    bool main = false;  // the process's main thread (tid == pid)
  };
  std::vector<Thread> threads;
  std::string error;  // why nothing was captured; "" if the capture worked
};

struct StackGroupOptions {
  // A frame whose function contains one of these waits on other ranks (GradSync::finish
  // waits for the data-parallel all-reduce that its own thread runs).
  std::vector<std::string> wait_markers = {"Communicator::", "GradSync::", "Rendezvous",
                                           "Store::", "barrier"};
  // A frame of keel's own code: its module contains one of these (keel-worker, keel-launch,
  // libkeel_*.so plugins, the tests).
  std::vector<std::string> own_modules = {"keel"};
};

// Ranks sharing one main-thread signature (or, in `helpers`, one helper thread's).
struct StackGroup {
  std::vector<std::string> signature;  // normalised frames, innermost first
  std::vector<int> ranks;              // ascending
  bool waiting = false;                // its innermost keel frame waits on other ranks
  std::string name;                    // helpers only: the thread's name
};

struct StackVerdict {
  std::vector<StackGroup> groups;   // main threads; largest first, then by lowest rank
  std::vector<StackGroup> helpers;  // other threads, by name and signature
  std::vector<int> healthy;         // ranks of the dominant group(s), ascending
  std::vector<int> culprits;        // ascending; empty when no rule names one
  std::vector<int> unknown;         // ranks with no main-thread stack, ascending
  // One line, e.g. "rank 5's main thread is in keel::spin_forever() <- keel::Trainer::step()
  // while 7 ranks wait in keel::SocketCommunicator::all_reduce(...)"; or why no culprit.
  std::string reason;
};

StackVerdict group_stacks(const std::vector<RankThreads>& ranks,
                          const StackGroupOptions& options = {});

// A frame without its offset: "f(int)+0x1a (keel-worker)" -> "f(int) (keel-worker)".
// A frame with no symbol ("?? (lib.so+0x1a)") is kept as is: its offset is all it has.
std::string normalise_frame(const std::string& frame);

// The main-thread signature of `frames` (see the top of this file).
std::vector<std::string> stack_signature(const std::vector<std::string>& frames,
                                         const StackGroupOptions& options = {});

// A demangled function as a reason shows it: "keel::(anonymous namespace)::SocketCommunicator::
// all_reduce(float*, unsigned long) const [clone .localalias]" -> "SocketCommunicator::
// all_reduce()": no return type, template or function arguments, at most two scopes.
std::string short_function(const std::string& function);

// The groups and the verdict as text, for runs/<job>/stacks/<incident>/summary.txt.
std::string format_verdict(const StackVerdict& verdict);

}  // namespace keel
