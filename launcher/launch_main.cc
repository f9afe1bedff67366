// keel-launch: the entry point of a job across machines (launcher/launch.h).
#include <cstdio>

#include "launcher/launch.h"
#include "launcher/recovery_protocol.h"
#include "runtime/check.h"
#include "runtime/logging.h"

int main(int argc, char** argv) {
  keel::init_logging(argv[0]);
  keel::LaunchOptions o;
  try {
    if (auto rc = keel::parse_launch_options(argc, argv, &o)) return *rc;
    return keel::run_launch(o);
  } catch (const keel::InputError& e) {
    std::fprintf(stderr, "keel-launch: error: %s\n", e.what());
    return keel::recovery::kExitInputError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "keel-launch: %s\n", e.what());
    return 1;
  }
}
