#include "launcher/input_checks.h"

namespace keel {

void check_launch(const WorkerOptions&) {}

void check_job_inputs(const WorkerOptions&, const config::JobConfig&) {}

}  // namespace keel
