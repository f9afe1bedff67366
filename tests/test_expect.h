// Assertions shared by tests of error messages, and the one way a test waits for something
// another thread or process does.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "runtime/check.h"

// EXPECT_HAS(text, part): `part` occurs in `text`; prints the whole text otherwise.
#define EXPECT_HAS(haystack, needle)                               \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) \
      << "expected \"" << (needle) << "\" in:\n"                   \
      << (haystack)

namespace keel::test {

// Runs f and returns the message of the keel::InputError it throws (a test failure if none).
template <typename F>
std::string input_error_of(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no InputError";
  return "";
}

// Polls cond() until it holds or `deadline` passes; returns whether it held. A test waits on
// the condition it needs (a counter, a state, a file), never for a fixed time: the deadline
// only turns a hang into a failure, so make it generous (it is no measure of speed).
template <typename F>
bool eventually(F&& cond, std::chrono::milliseconds deadline = std::chrono::seconds(60)) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Runs fn() on a thread and waits for it with a deadline. For a test of "this call does not
// wait for X": the test makes X take an hour or more, so that only the behaviour under test
// can return before the deadline. A call still blocked at the deadline fails the test and
// ends the process (the thread cannot be stopped, and the frame it uses must stay alive).
template <typename F>
void expect_returns(F&& fn, const char* what,
                    std::chrono::milliseconds deadline = std::chrono::seconds(120)) {
  std::atomic<bool> done{false};
  std::thread t([&] {
    fn();
    done = true;
  });
  if (!eventually([&] { return done.load(); }, deadline)) {
    ADD_FAILURE() << what << ": still blocked after the deadline";
    std::fflush(stdout);
    std::_Exit(1);
  }
  t.join();
}

}  // namespace keel::test
