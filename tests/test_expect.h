// Assertions shared by tests of error messages.
#pragma once

#include <gtest/gtest.h>

#include <string>

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

}  // namespace keel::test
