// keel-launch: one process per slot (machine). Slot 0 runs the job's controller (the
// rendezvous store, the control plane, launcher/controller/controller.h over
// launcher/controller/agent_host.h) and every slot runs an agent (launcher/agent/agent.h) that
// starts the slot's workers. The slots come from MPI (one per MPI rank; MPI is used to share the
// controller's address and never called after), from --local N (forked here), or one at a time from
// --join.
#pragma once

#include "launcher/launch_options.h"

namespace keel {

// Returns the process exit code.
int run_launch(const LaunchOptions& o);

}  // namespace keel
